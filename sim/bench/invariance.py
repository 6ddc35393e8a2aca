"""``splitspec bench invariance``: is a row's logits the same however the engine packs it?

The same token sequence is run twice through one engine: one token per
forward after a prefill (target-only decoding), and in random blocks with
rejected blocks cropped away, the prompt prefilled in random chunks, every
forward shared with batch-mates at random positions. In canonical mode on a
device whose products are row-invariant the two are bit-identical
(``torch.equal``); the report says whether they were and by how much they
differ otherwise (a GPU's kernels may choose differently by batch shape).

Contract. ``run_invariance_check(...)`` returns the report dict; the helpers
are what the tests use too.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from cloud.engine import ForwardItem

__all__ = ["one_at_a_time", "chunked_beside_mates", "compare_trial", "run_invariance_check"]


def one_at_a_time(engine, tokens, start):
    """Logits for positions start.. of ``tokens``, decoding one token per forward after a prefill."""
    seq = engine.new_sequence()
    rows = [engine.forward(seq, tokens[:start], last_only=True)[-1]]
    rows += [engine.forward(seq, [t])[-1] for t in tokens[start:-1]]
    return torch.stack(rows)


def chunked_beside_mates(engine, tokens, start, rng):
    """The same rows computed in random blocks (with rejected blocks cropped away), each forward
    shared with batch-mates at random positions, the prompt prefilled in random chunks."""
    mates = [engine.new_sequence() for _ in range(rng.randrange(1, 4))]
    for mate in mates:
        engine.forward(mate, [rng.randrange(3, 400) for _ in range(rng.randrange(1, 150))], last_only=True)

    seq = engine.new_sequence()
    done = 0
    while done < start:  # prefill in chunks; only the last returns its row
        take = min(rng.randrange(1, 40), start - done)
        item = ForwardItem(seq, tokens[done : done + take], "last" if done + take == start else "none")
        outputs = engine.forward_batch([item, *[ForwardItem(m, [5]) for m in mates]])
        done += take
    rows = [outputs[0][-1]]
    while len(rows) < len(tokens) - start:
        if rng.random() < 0.3:  # a rejected block: forward garbage, crop it away
            garbage = [rng.randrange(3, 400) for _ in range(rng.randrange(1, 6))]
            engine.forward_batch([ForwardItem(seq, garbage), ForwardItem(mates[0], [7])])
            engine.crop(seq, start + len(rows) - 1)
        position = start + len(rows) - 1  # feed the last committed token and a block after it
        block = tokens[position : position + rng.randrange(1, 9)]
        items = [ForwardItem(seq, block), *[ForwardItem(m, [rng.randrange(3, 400)]) for m in mates]]
        rng.shuffle(items)
        out = engine.forward_batch(items)
        got = out[[i for i, item in enumerate(items) if item.seq is seq][0]]
        rows.extend(got)
    return torch.stack(rows[: len(tokens) - start])


def compare_trial(engine, rng: random.Random, length: tuple[int, int] = (70, 200),
                  start: tuple[int, int] = (5, 60)) -> tuple[bool, float, int]:
    """One random sequence (``length`` tokens, its rows compared from ``start``; both drawn from those
    ranges) alone and beside batch-mates: (bit-identical, the largest difference, rows compared)."""
    tokens = [rng.randrange(3, min(engine.vocab_size, 20_000)) for _ in range(rng.randrange(*length))]
    first = rng.randrange(*start)
    alone = one_at_a_time(engine, tokens, first)
    packed = chunked_beside_mates(engine, tokens, first, rng)
    return bool(torch.equal(alone, packed)), float((alone - packed).abs().max()), alone.shape[0]


def run_invariance_check(*, target: str | None = None, tiny: bool = False, device: str | None = None,
                         dtype: str | None = None, trials: int = 5, canonical: bool = True,
                         seed: int = 0) -> dict[str, Any]:
    """``trials`` random sequences, each compared row for row; the report dict."""
    import tempfile

    from cloud.engine import TargetEngine
    from cloud.models import resolve_target

    with tempfile.TemporaryDirectory(prefix="splitspec-invariance-") as tmp:
        if tiny:
            from sim.fixtures.tiny_models import write_tiny_models

            target = write_tiny_models(tmp, seed=0)["target"]
        engine = TargetEngine(target if tiny else resolve_target(target), device=device, dtype=dtype,
                              shapes="canonical" if canonical else "free")
        rng = random.Random(seed)
        identical, worst, rows = 0, 0.0, 0
        for _ in range(trials):
            same, diff, compared = compare_trial(engine, rng)
            identical, worst, rows = identical + same, max(worst, diff), rows + compared
    return {
        "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
        "shapes": "canonical" if canonical else "free", "row_invariant_products": engine.invariant,
        "row_padding": (None if engine.padding is None else
                        f"{'a multiple of' if engine.padding.multiple else 'at least'} {engine.padding.tile} rows"),
        "row_tile": None if engine.padding is None else engine.padding.tile,
        "trials": trials, "rows_compared": rows, "identical_trials": identical,
        "bit_identical": identical == trials, "max_abs_diff": worst,
    }
