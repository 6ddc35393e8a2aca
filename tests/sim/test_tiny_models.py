"""The tiny generated models: deterministic, and llama.cpp agrees with torch on them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
llama_cpp = pytest.importorskip("llama_cpp")

from sim.fixtures.tiny_models import write_tiny_models  # noqa: E402

SENTENCES = [
    "The cat sat on the mat.",
    "Hello world, this is a test.",
    "We have 3 dogs and 12 cats!",
    "It was the best of times, it was the worst of times.",
    "She said: (no) - they'd said yes?",
    "  two  spaces and trailing ",
]


@pytest.fixture(scope="module")
def target(tiny_models):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_models["target"], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models["target"])


def _llama(path: str):
    return llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=1, type_k=0, type_v=0,
                           logits_all=False, verbose=False)


def _cpp_logits(llm, ids: list[int]) -> np.ndarray:
    """[len(ids), n_vocab] last-token logits, evaluating one token at a time."""
    llm.reset()
    n_vocab = llm.n_vocab()
    rows = []
    for t in ids:
        llm.eval([t])
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        rows.append(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy())
    return np.stack(rows)


def _torch_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _greedy(model, ids: list[int], n_new: int) -> list[int]:
    """Exactly n_new argmax tokens: no EOS stop, whatever the saved generation config says."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=n_new, min_new_tokens=0, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), generation_config=config)[0].tolist()
    assert len(out) == len(ids) + n_new
    return out


def _prompt(hf_tokenizer, text: str) -> list[int]:
    return [1] + hf_tokenizer(text, add_special_tokens=False)["input_ids"]


def _hashes(root: Path) -> dict[str, str]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_same_seed_gives_identical_files(tiny_models, tmp_path):
    first = Path(tiny_models["target"]).parent
    again = write_tiny_models(tmp_path / "again", seed=0)
    assert {k: Path(v).relative_to(tmp_path / "again") for k, v in again.items()} == {
        k: Path(v).relative_to(first) for k, v in tiny_models.items()}
    h1, h2 = _hashes(first), _hashes(tmp_path / "again")
    assert "target/model.safetensors" in h1 and "drafter-q8_0.gguf" in h1
    assert h1 == h2
    other = _hashes(Path(write_tiny_models(tmp_path / "seed1", seed=1)["target"]).parent)
    assert other.keys() == h1.keys()
    assert other["target/model.safetensors"] != h1["target/model.safetensors"]
    assert other["drafter-f32.gguf"] != h1["drafter-f32.gguf"]


def test_target_is_peaked_and_not_degenerate(target, hf_tokenizer):
    endings = set()
    for text in SENTENCES[:4]:
        ids = _prompt(hf_tokenizer, text)
        out = _greedy(target, ids, 12)
        new = out[len(ids):]
        assert len(set(new)) >= 4, new
        endings.add(tuple(new))
        logits = _torch_logits(target, out)
        assert 2.0 < logits.std(axis=-1).mean() < 4.0
        probs = torch.softmax(torch.from_numpy(logits), -1)
        assert 0.1 < probs.max(-1).values.mean() < 0.9
    assert len(endings) == 4


def test_f32_gguf_matches_torch(tiny_models, target, hf_tokenizer):
    llm = _llama(tiny_models["drafter_f32"])
    assert llm.n_vocab() == 512
    ids = _prompt(hf_tokenizer, SENTENCES[3])
    assert len(ids) >= 15
    cpp, ref = _cpp_logits(llm, ids), _torch_logits(target, ids)
    assert np.abs(cpp - ref).max() < 1e-3
    assert (cpp.argmax(-1) == ref.argmax(-1)).all()


def test_q8_0_gguf_is_close_to_torch(tiny_models, target, hf_tokenizer):
    llm = _llama(tiny_models["drafter_q8_0"])
    ids = [t for s in SENTENCES[:3] for t in _prompt(hf_tokenizer, s)]
    cpp, ref = _cpp_logits(llm, ids), _torch_logits(target, ids)
    assert 0 < np.abs(cpp - ref).max() < 1.0  # activations are quantized too: ~0.4 seen
    assert (cpp.argmax(-1) == ref.argmax(-1)).mean() >= 0.8


def test_noisy_drafter_agrees_partially(tiny_models, target):
    llm = _llama(tiny_models["drafter_noisy"])
    gen = torch.Generator().manual_seed(1)
    agree = total = 0
    for _ in range(4):
        prompt = torch.randint(3, 512, (1, 6), generator=gen)
        prompt[0, 0] = 1
        seq = _greedy(target, prompt[0].tolist(), 75)
        # Position i predicts token i + 1: compare greedy picks over the generated span.
        cpp, ref = _cpp_logits(llm, seq), _torch_logits(target, seq)
        span = slice(5, len(seq) - 1)
        assert seq[6:] == ref.argmax(-1)[span].tolist()
        agree += int((cpp.argmax(-1)[span] == ref.argmax(-1)[span]).sum())
        total += len(seq) - 6
    assert total == 300
    assert 0.3 < agree / total < 0.95


def test_tokenizers_agree(tiny_models, hf_tokenizer):
    llm = _llama(tiny_models["drafter_f32"])
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    cpp_pieces = [llama_cpp.llama_vocab_get_text(vocab, i).decode() for i in range(llm.n_vocab())]
    assert len(hf_tokenizer) == len(cpp_pieces) == 512
    assert hf_tokenizer.convert_ids_to_tokens(list(range(512))) == cpp_pieces
    assert (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.unk_token_id) == (
        llm.token_bos(), llm.token_eos(), 0)
    # llama.cpp (like SentencePiece) always prepends "▁"; HF's Metaspace skips it when
    # the text already starts with a space, so there llama.cpp has one extra "▁" (id 259).
    rng = np.random.default_rng(0)
    words = ["the", "there", "then", "cat", "tomato", "Hello", "banana", "x9", "why?", "é",
             "日本", "!", "", "\n"]
    random_texts = [" ".join(rng.choice(words, size=8)) for _ in range(100)]
    assert sum(t.startswith(" ") for t in random_texts) >= 5
    for text in SENTENCES + random_texts:
        hf_ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        cpp_ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        if text.startswith(" "):
            assert cpp_ids == [259] + hf_ids, text
        else:
            assert cpp_ids == hf_ids, text
            assert hf_tokenizer.decode(hf_ids) == text
    # add_bos_token is false in the GGUF, so llama.cpp never inserts BOS itself.
    assert llm.tokenize(b"Hi", add_bos=True, special=False) == llm.tokenize(b"Hi", add_bos=False)
