"""What share of answer tokens a head trimmed to the first N ids (and the single-byte-character tokens)
would cover: all 80 MT-bench first turns through Gemma's chat format, 64 greedy tokens each from the
Q4_K_M drafter (a stand-in for the target's answers), plus the prompts' own tokens."""
import collections
from pathlib import Path

import llama_cpp

from sim.workloads.mtbench import questions

llm = llama_cpp.Llama(str(Path.home() / ".cache/splitspec/gemma-3-270m-q4_k_m.gguf"), n_ctx=1024, n_threads=1,
                      verbose=False)
n_vocab = llm.n_vocab()
ascii_ids = {i for i in range(n_vocab) if len(llm.detokenize([i])) == 1}
answers, prompts, in_context = [], [], []  # in_context: whether each answer token appeared earlier in its prompt or answer
for q in questions():
    p = llm.tokenize(f"<start_of_turn>user\n{q.turns[0]}<end_of_turn>\n<start_of_turn>model\n".encode(), special=True)
    prompts += p
    out = []
    for tok in llm.generate(p, temp=0.0, top_k=1):
        if tok == llm.token_eos() or len(out) == 64:
            break
        in_context.append(tok in p or tok in out)
        out.append(tok)
    answers += out
print(f"{len(answers)} answer tokens, {len(prompts)} prompt tokens; {len(ascii_ids)} single-byte tokens, "
      f"ids {min(ascii_ids)}-{max(ascii_ids)}")
for n in (16384, 32768, 49152, 65536, 98304, 131072):
    for name, toks in (("answers", answers), ("prompts", prompts)):
        plain = sum(t < n for t in toks) / len(toks)
        plus = sum(t < n or t in ascii_ids for t in toks) / len(toks)
        print(f"first {n:6d} ids: {name} {plain:6.1%} covered; with the single-byte tokens {plus:6.1%}")
for n in (16384, 32768, 65536):
    plus = sum(t < n or t in ascii_ids or c for t, c in zip(answers, in_context)) / len(answers)
    print(f"first {n:6d} ids, the single-byte tokens and the tokens of the prompt and answer so far: answers {plus:6.1%} covered")
missed = collections.Counter(t for t in answers if not (t < 32768 or t in ascii_ids))
print("most frequent answer tokens past the first 32768 ids and not single-byte:",
      [(t, llm.detokenize([t]).decode(errors="replace"), c) for t, c in missed.most_common(25)])
