"""A drafter eval's cost by batch size, logits for the last row or for every row (one thread)."""
import statistics
import time
from pathlib import Path

from edge.llama_drafter import LlamaDrafter

cache = Path.home() / ".cache" / "splitspec"
for name in ("q4_k_m", "q2_k"):
    d = LlamaDrafter(cache / f"gemma-3-270m-{name}.gguf", n_threads=1)
    llm = d.llm
    toks = llm.tokenize(b"Write a short story about a lighthouse keeper who finds a message in a bottle. " * 3)
    res = {}
    for k in (1, 2, 4, 8):
        for every in (False, True):
            ts = []
            for r in range(12):
                llm.n_tokens = 0
                base = 20 + (r % 4) * 8
                llm.eval(toks[:base])
                llm._ctx.kv_cache_seq_rm(-1, base, -1)
                llm._batch.set_batch(batch=toks[base:base + k], n_past=base, logits_all=every)
                t = time.perf_counter()
                llm._ctx.decode(llm._batch)
                ts.append(time.perf_counter() - t)
            res[(k, every)] = statistics.median(ts) * 1e3
    print(name, "  ".join(f"k={k}{' all' if e else ' last'}: {v:.1f} ms" for (k, e), v in res.items()))
    d.close()
