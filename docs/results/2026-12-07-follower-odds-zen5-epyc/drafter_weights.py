"""What one drafted token reads: the drafter GGUFs' tensors by size (the lm head is the tied token embedding).

Usage: python docs/results/2026-12-07-follower-odds-zen5-epyc/drafter_weights.py (the venv's python; the
drafters where ``make install`` put them, ``~/.cache/splitspec``). llama.cpp computes every position's logits
over the whole vocabulary, so each drafted token reads the head and every layer once.
"""
from pathlib import Path

from gguf import GGUFReader

for rung in ("q4_k_m", "q2_k"):
    reader = GGUFReader(Path.home() / ".cache" / "splitspec" / f"gemma-3-270m-{rung}.gguf")
    sizes = {t.name: (int(t.n_bytes), t.tensor_type.name, [int(d) for d in t.shape]) for t in reader.tensors}
    total = sum(n for n, _, _ in sizes.values())
    head, kind, shape = sizes["token_embd.weight"]
    print(f"{rung}: {total / 1e6:.1f} MB of tensors; token_embd.weight (the lm head, tied) {kind} {shape}: "
          f"{head / 1e6:.1f} MB, {head / total:.0%}; output.weight present: {'output.weight' in sizes}")
