"""Tiny, deterministic Llama models for tests: one HF target and three GGUF drafters.

`write_tiny_models(out_dir, seed)` writes, from seeded random weights (no hub, no
training):

- `target/`: a transformers `LlamaForCausalLM` (float32 safetensors) with a
  `tokenizers` Unigram tokenizer (512 pieces, byte fallback, Metaspace "▁");
- `drafter-f32.gguf`: the same weights for llama.cpp, F32 (matches torch ~1e-5);
- `drafter-q8_0.gguf`: the same weights, 2-D matrices in Q8_0, norms F32;
- `drafter-noisy.gguf`: F32 weights plus seeded Gaussian noise, so its greedy
  token agrees with the target's on roughly 55–85% of positions.

The same seed gives byte-identical files. The GGUF vocab equals the HF one
(same ids, pieces, scores); `tokenizer.ggml.add_bos_token` is false (callers add
BOS themselves) and `add_space_prefix` is true, matching Metaspace "first".

The vocab is built so that SentencePiece-style Viterbi (HF) and llama.cpp's
greedy score-ordered merging segment text identically: multi-character pieces
are either "▁"-words whose prefixes are all pieces (scored highest) or
consonant+vowel pairs (which cannot overlap), and every filler score lies in
(-2, -1], so fewer pieces always win. The model is random: its text is gibberish.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch

N_VOCAB, N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV = 512, 64, 192, 2, 4, 2
N_CTX, ROPE_THETA, RMS_EPS = 2048, 10000.0, 1e-5
LOGIT_STD = 3.5  # target std of the logits across the vocab on typical inputs
NOISE_REL = 0.05  # noisy drafter: noise std relative to each tensor's rms

_WORDS = (
    "the a to of and in is it on at as be by he we so no do go up my me or if an "
    "she you not but for are was his her had has can one all out day man cat dog sat "
    "run see new big red sun this that with they have from when will said time then "
    "The I A It He She We They In"
).split()
_SINGLES = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()")
# Consonant+vowel pairs, commonest first: no two can overlap in any text.
_PAIRS = ("te to ti ta ne no na ni se so si sa re ro ri ra he ha hi ho le li la lo de di "
          "da do ce co ca me ma mi mo fe fo pe pa po ge go we wa ve be ba bo ye ke "
          "tu ru su lu nu du mu bi fi pi wi vi ya yo ka ki ko").split()


def _vocab() -> list[tuple[str, float, gguf.TokenType]]:
    """The 512 (piece, score, type) entries, ids in order."""
    specials = [
        ("<unk>", 0.0, gguf.TokenType.UNKNOWN),
        ("<s>", 0.0, gguf.TokenType.CONTROL),
        ("</s>", 0.0, gguf.TokenType.CONTROL),
    ]
    byte_pieces = [(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE) for b in range(256)]
    # "▁"-words closed under prefixes, shortest first so a prefix precedes its word.
    word_pieces = sorted({"▁" + w[:k] for w in _WORDS for k in range(len(w) + 1)},
                         key=lambda p: (len(p), p))
    n_fill = N_VOCAB - len(specials) - len(byte_pieces)
    n_pairs = n_fill - len(word_pieces) - len(_SINGLES)
    pairs = _PAIRS[:n_pairs]
    assert n_pairs > 0 and len(pairs) == n_pairs, (len(word_pieces), n_pairs)
    # Score bands: words [-1.00, -1.10], singles [-1.20, -1.30], pairs [-1.50, -1.60].
    # Words outrank pairs (llama.cpp merges them first); singles outrank pairs so a
    # word-vs-pair tie of equal piece count resolves to the longer word, as in llama.cpp.
    fill = []
    for group, top in ((word_pieces, -1.0), (_SINGLES, -1.2), (pairs, -1.5)):
        fill += [(p, top - 0.1 * i / len(group), gguf.TokenType.NORMAL)
                 for i, p in enumerate(group)]
    vocab = specials + byte_pieces + fill
    assert len(vocab) == N_VOCAB and len({p for p, _, _ in vocab}) == N_VOCAB
    return vocab


def _write_tokenizer(target_dir: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = _vocab()
    tok = Tokenizer(models.Unigram([(p, s) for p, s, _ in vocab], unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=False)
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ])
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False)
                            for p in ("<unk>", "<s>", "</s>")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=N_CTX)
    fast.save_pretrained(target_dir)
    cfg_path = target_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=N_VOCAB, hidden_size=N_EMBD, intermediate_size=N_FF,
        num_hidden_layers=N_LAYER, num_attention_heads=N_HEAD, num_key_value_heads=N_HEAD_KV,
        max_position_embeddings=N_CTX, rms_norm_eps=RMS_EPS, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=1, eos_token_id=2, dtype="float32",
    )


def _weight_std(name: str, shape: tuple[int, ...]) -> float:
    if "embed_tokens" in name:
        return 1.0
    if "lm_head" in name:  # final RMSNorm output has rms ~1, so logit std ~ std * sqrt(d)
        return LOGIT_STD / N_EMBD ** 0.5
    if "q_proj" in name or "k_proj" in name:
        return 1.5 / N_EMBD ** 0.5  # moderately peaked attention
    return 1.0 / shape[1] ** 0.5


def _random_state(seed: int) -> dict[str, torch.Tensor]:
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(_config()).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name in sorted(shapes):
        shape = shapes[name]
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            state[name] = 1.0 + 0.1 * noise
        else:
            state[name] = noise * _weight_std(name, shape)
    return state


def _perturb(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(state):
        w = state[name]
        rms = w.pow(2).mean().sqrt()
        out[name] = w + NOISE_REL * rms * torch.randn(w.shape, generator=gen, dtype=torch.float32)
    return out


def _permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF (half-split) rotary layout -> llama.cpp (interleaved pairs), per head."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _gguf_tensors(state: dict[str, torch.Tensor]) -> list[tuple[str, np.ndarray]]:
    names = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }
    out = [("token_embd.weight", state["model.embed_tokens.weight"])]
    for i in range(N_LAYER):
        for hf, gg in names.items():
            w = state[f"model.layers.{i}.{hf}.weight"].numpy()
            if gg == "attn_q":
                w = _permute_rope(w, N_HEAD)
            elif gg == "attn_k":
                w = _permute_rope(w, N_HEAD_KV)
            out.append((f"blk.{i}.{gg}.weight", w))
    out += [("output_norm.weight", state["model.norm.weight"]),
            ("output.weight", state["lm_head.weight"])]
    return [(n, np.ascontiguousarray(np.asarray(w, dtype=np.float32))) for n, w in out]


def _write_gguf(path: Path, state: dict[str, torch.Tensor], name: str, q8: bool) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    if q8:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocab = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list([p for p, _, _ in vocab])
    w.add_token_scores([s for _, s, _ in vocab])
    w.add_token_types([int(t) for _, _, t in vocab])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    for tname, t in _gguf_tensors(state):
        if q8 and t.ndim == 2 and t.shape[1] % 32 == 0:
            qt = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(tname, gguf.quants.quantize(t, qt), raw_dtype=qt)
        else:
            w.add_tensor(tname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_models(out_dir: str | Path, seed: int = 0) -> dict[str, str]:
    """Deterministically writes tiny test models and returns their paths:
    {"target": DIR/target (HF folder), "drafter_f32": DIR/drafter-f32.gguf,
     "drafter_q8_0": DIR/drafter-q8_0.gguf, "drafter_noisy": DIR/drafter-noisy.gguf}"""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "target": out / "target", "drafter_f32": out / "drafter-f32.gguf",
        "drafter_q8_0": out / "drafter-q8_0.gguf", "drafter_noisy": out / "drafter-noisy.gguf",
    }
    state = _random_state(seed)
    with torch.random.fork_rng():  # module init draws from the global RNG; leave it alone
        model = LlamaForCausalLM(_config())
    model.load_state_dict(state)
    model.generation_config.do_sample = False
    model.save_pretrained(paths["target"], safe_serialization=True)
    _write_tokenizer(paths["target"])
    _write_gguf(paths["drafter_f32"], state, "splitspec-tiny", q8=False)
    _write_gguf(paths["drafter_q8_0"], state, "splitspec-tiny", q8=True)
    noisy = _perturb(state, seed + 1_000_003)
    _write_gguf(paths["drafter_noisy"], noisy, "splitspec-tiny-noisy", q8=False)
    return {k: str(v) for k, v in paths.items()}
