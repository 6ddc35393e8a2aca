"""Drafter GGUFs with the tied lm head (token_embd) requantized, every other tensor as its source."""
import ctypes
import time
from pathlib import Path

import llama_cpp
from gguf import GGUFReader

cache = Path.home() / ".cache" / "splitspec"
Path("/tmp/hq").mkdir(exist_ok=True)  # (where the probe GGUFs go: draft_time.py reads them there)
for src, ftype, head, out in (("q4_k_m", 15, 2, "default-head-q4_0"), ("q2_k", 10, 2, "q2_k-head-q4_0"),
                              ("q4_k_m", 15, 6, "default-head-q5_0")):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.token_embedding_type, p.allow_requantize, p.nthread = ftype, head, True, 2
    dst = Path("/tmp/hq") / f"gemma-3-270m-{out}.gguf"
    t = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(cache / f"gemma-3-270m-{src}.gguf").encode(), str(dst).encode(), ctypes.byref(p))
    r = GGUFReader(dst)
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    srcr = {t.name: t.tensor_type.name for t in GGUFReader(cache / f"gemma-3-270m-{src}.gguf").tensors}
    changed = sorted(n for n in kinds if kinds[n] != srcr[n])
    print(out, rc, f"{dst.stat().st_size/1e6:.1f} MB", f"{time.perf_counter()-t:.1f}s", "changed:", changed[:5], len(changed))
