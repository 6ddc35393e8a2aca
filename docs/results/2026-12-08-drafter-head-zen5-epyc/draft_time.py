"""Drafted ms a token, alone on one core, per GGUF: 8 rounds x 64 greedy drafts after a short prompt."""
import statistics
import time
from pathlib import Path

from edge.llama_drafter import LlamaDrafter
from shared.params import Mode, SamplingParams

cache = Path.home() / ".cache" / "splitspec"
paths = [cache / "gemma-3-270m-q4_k_m.gguf", Path("/tmp/hq/gemma-3-270m-default-head-q5_0.gguf"),
         Path("/tmp/hq/gemma-3-270m-default-head-q4_0.gguf"), cache / "gemma-3-270m-q2_k.gguf",
         Path("/tmp/hq/gemma-3-270m-q2_k-head-q4_0.gguf")]
ds = {p.stem: LlamaDrafter(p, n_threads=1) for p in paths}
prompt = ds[paths[0].stem].llm.tokenize(b"Write a short story about a lighthouse keeper who finds a message in a bottle.")
times = {k: [] for k in ds}
for _ in range(8):
    for k, d in ds.items():
        d.begin(prompt, SamplingParams(mode=Mode.GREEDY))
        d.draft(1)
        t = time.perf_counter()
        b = d.draft(64)
        dt = time.perf_counter() - t
        times[k].append(1e3 * dt / len(b.tokens))
        d.rewind() if hasattr(d, "rewind") else None
for k, v in times.items():
    print(f"{k:34s} {statistics.median(v):6.2f} ms/draft (range {min(v):.2f}-{max(v):.2f})")
