"""Drafted ms a token with the whole head and with heads trimmed to the first N ids (one thread, greedy,
8 rounds x 64 drafts after a short prompt, ids past 32768 read as the unknown token)."""
import statistics
import time
from pathlib import Path

import llama_cpp

cache = Path.home() / ".cache" / "splitspec"
paths = {"full 262144": cache / "gemma-3-270m-q4_k_m.gguf", "first 65536": Path("/tmp/hq/trim-q4_k_m-65536.gguf"),
         "first 32768": Path("/tmp/hq/trim-q4_k_m-32768.gguf")}
llms = {k: llama_cpp.Llama(str(p), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False) for k, p in paths.items()}
prompt = llms["full 262144"].tokenize(b"Write a short story about a lighthouse keeper who finds a message in a bottle.")
prompt = [t if t < 32768 else 3 for t in prompt]  # (ids past the trimmed vocabulary: the unknown token)
res = {k: [] for k in llms}
for r in range(8):
    for k, llm in llms.items():
        llm.reset()
        llm.eval(prompt)
        t = time.perf_counter()
        tok = prompt[-1]
        for i in range(64):
            llm.eval([tok if tok < 32768 else 3])
            logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            tok = (r * 7 + i * 13) % 30000 + 200  # (a token each step; its identity does not change the cost)
        res[k].append((time.perf_counter() - t) / 64 * 1e3)
for k, v in res.items():
    print(f"{k:12s} {statistics.median(v):6.2f} ms a drafted token (range {min(v):.2f}-{max(v):.2f})")
