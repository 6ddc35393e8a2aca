"""``splitspec bench split``: in-process split decoding against cloud-only, same run.

For each mode and draft length, the same prompt and seed: acceptance, target
forwards per generated token, wall time and its ratio to cloud-only, and the
drafter's Python overhead per drafted token (time in ``draft()`` beyond
llama.cpp's own eval, from ``drafter.stats``). Two cloud-only rows (``draft_len
0``) per mode, both in this process on the same torch threads: in free shapes,
the fastest, which every ``wall_vs_fastest_cloud_only`` is against; and in
canonical shapes, the reproducible one (``wall_vs_target_only``), which the
split runs in and whose tokens identity is checked against.

Contract. `run_split_bench(SplitBench(...))` loads the models, runs, and returns
``{"prompt_tokens", "cloud_only", "runs": [row, ...]}``; `format_split_row(row)`,
`format_split_yardstick(result)` and `format_split_report(result)` render it.
No argparse, no printing (a caller that wants rows as they finish passes
``on_row``); flags are in ``sim.commands.bench``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from edge.schedule import SpecConfig
from shared.params import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P

__all__ = ["DEFAULT_PROMPT", "SplitBench", "format_split_report", "format_split_row", "format_split_yardstick", "run_split_bench"]

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
FASTEST_SHAPES = "free"  # the fastest cloud-only
SPLIT_SHAPES = "canonical"  # batch-invariant (reproducible): the split's, and the reproducible cloud-only's


@dataclass(frozen=True)
class SplitBench:
    """What ``run_split_bench`` runs (``splitspec bench split``'s flags)."""

    target: str | None = None  # None: the default Gemma 3 270M pair
    drafter: str | None = None
    prompt: str = DEFAULT_PROMPT
    max_new_tokens: int = 128
    modes: Sequence[str] = ("greedy", "coupled", "rejection")
    draft_lens: Sequence[int] = (4, 8)
    temperature: float = DEFAULT_TEMPERATURE  # coupled and rejection (greedy runs use 0)
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    seed: int = 0
    lookup: bool = False  # each split row again with the drafter behind prompt lookup ("lookup": true in its row)


@dataclass(frozen=True)
class _Models:
    """The split bench's engines (one per shapes), drafter, prompt and threads."""

    engines: dict[str, Any]
    drafter: Any
    prompt_ids: list[int]
    threads: int


def run_split_bench(bench: SplitBench, on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Split decoding vs cloud-only for each mode and draft length; the rows as a dict. ``on_row(row)`` is
    called as each run finishes. ValueError on an unknown mode."""
    import torch

    from cloud.engine import TargetEngine
    from cloud.models import resolve_target
    from edge.drafter_choice import open_drafter
    from shared.params import Mode, SamplingParams
    from sim.inprocess import generate

    modes = [Mode(mode) for mode in bench.modes]  # fail on a bad mode before loading models
    path = resolve_target(bench.target)
    engines = {shapes: TargetEngine(path, shapes=shapes) for shapes in (SPLIT_SHAPES, FASTEST_SHAPES)}
    # Same threads for both: canonical mode may keep its products on one thread (``TargetEngine.threads``).
    threads = engines[SPLIT_SHAPES].threads or torch.get_num_threads()
    draft_model = open_drafter(bench.drafter, vocab_size=engines[SPLIT_SHAPES].vocab_size,
                               fingerprint=engines[SPLIT_SHAPES].fingerprint)
    rows = []
    try:
        models = _Models(engines, draft_model, draft_model.vocab.tokenize(bench.prompt), threads)
        for shapes, draft_len in ((FASTEST_SHAPES, 0), (SPLIT_SHAPES, min(bench.draft_lens, default=0))):
            # A fresh engine's (and drafter's) first calls are slow: a short run each, unmeasured.
            generate(engines[shapes], draft_model, models.prompt_ids, SamplingParams(mode=Mode.GREEDY),
                     max_new_tokens=4, spec=SpecConfig(draft_len))
        for mode in modes:
            for row in _mode_rows(bench, models, mode):
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    finally:
        draft_model.close()
    return {
        "prompt_tokens": len(models.prompt_ids),
        "cloud_only": {
            "fastest": {"shapes": FASTEST_SHAPES, "threads": threads},
            "reproducible": {"shapes": SPLIT_SHAPES, "threads": threads},
        },
        "split_shapes": SPLIT_SHAPES,
        "runs": rows,
    }


def _mode_rows(bench: SplitBench, models: _Models, mode) -> Iterator[dict[str, Any]]:
    """One mode's rows: cloud-only in both shapes, then the split at each draft length (and with lookup)."""
    from cloud.engine import torch_threads
    from edge.lookup_drafter import LookupFirstDrafter
    from shared.params import Mode, SamplingParams
    from sim.inprocess import generate

    params = SamplingParams(mode=mode, temperature=0.0 if mode is Mode.GREEDY else bench.temperature,
                            top_k=bench.top_k, top_p=bench.top_p, seed=bench.seed)
    draft_model = models.drafter

    def run(shapes: str, draft_len: int, looked_up: bool = False) -> tuple[Any, dict[str, Any]]:
        drafter_used = LookupFirstDrafter(draft_model) if looked_up else draft_model  # (fresh acceptance)
        draft_model.stats.reset()
        with torch_threads(models.threads):
            result = generate(models.engines[shapes], drafter_used, models.prompt_ids, params,
                              max_new_tokens=bench.max_new_tokens, spec=SpecConfig(draft_len))
        row = _row(params.mode.value, shapes, draft_len, models.threads, result, draft_model.stats)
        return result, {**row, "lookup": True, "looked_up": drafter_used.looked_up} if looked_up else row

    cloud_only = [run(FASTEST_SHAPES, 0), run(SPLIT_SHAPES, 0)]  # first: every row's ratios need both
    (fastest, _), (reproducible, _) = cloud_only
    splits = [(d, looked_up) for d in bench.draft_lens for looked_up in ((False, True) if bench.lookup else (False,))]
    for result, row in itertools.chain(cloud_only, (run(SPLIT_SHAPES, d, looked_up=u) for d, u in splits)):
        row["wall_vs_fastest_cloud_only"] = round(result.stats.wall_s / fastest.stats.wall_s, 3)
        row["wall_vs_target_only"] = round(result.stats.wall_s / reproducible.stats.wall_s, 3)
        row["identical_to_target_only"] = result.tokens == reproducible.tokens
        yield row


def _row(mode: str, shapes: str, draft_len: int, threads: int, result, timing) -> dict[str, Any]:
    """One run's figures, before its ratios."""
    stats = result.stats
    n = max(len(result.tokens), 1)
    drafted = max(stats.drafted, 1)
    return {
        "mode": mode,
        "draft_len": draft_len,
        "shapes": shapes,
        "threads": threads,
        "tokens": len(result.tokens),
        "acceptance_rate": round(stats.acceptance_rate, 3),
        "acceptance_length": round(stats.acceptance_length, 3),
        "target_forwards_per_token": round(stats.target_forwards / n, 3),
        "wall_s": round(stats.wall_s, 3),
        "drafter_eval_ms_per_draft": round(1e3 * timing.eval_s / drafted, 3),
        "drafter_overhead_ms_per_draft": round(1e3 * (timing.draft_s - timing.eval_s) / drafted, 3),
    }


def format_split_row(row: dict[str, Any]) -> str:
    """One run as a line of text."""
    split = f"split + lookup ({row['looked_up']} looked up)" if row.get("lookup") else "split"
    kind = f"cloud-only, {row['shapes']} shapes" if row["draft_len"] == 0 else f"{split}, {row['shapes']} shapes"
    return (
        f"{row['mode']:>9} D={row['draft_len']} ({kind}): {row['tokens']} tok, alpha {row['acceptance_rate']:.2f}, "
        f"AL {row['acceptance_length']:.2f}, fwd/tok {row['target_forwards_per_token']:.3f}, "
        f"wall {row['wall_s']:.2f}s (x{row['wall_vs_fastest_cloud_only']:.2f} of the fastest cloud-only, "
        f"x{row['wall_vs_target_only']:.2f} of the reproducible), "
        f"drafter eval {row['drafter_eval_ms_per_draft']:.2f} ms + overhead {row['drafter_overhead_ms_per_draft']:.2f} ms per draft, "
        f"identical={row['identical_to_target_only']}"
    )


def format_split_yardstick(result: dict[str, Any]) -> str:
    """Which cloud-only the ratios are against, in a line."""
    fastest, reproducible = result["cloud_only"]["fastest"], result["cloud_only"]["reproducible"]
    return (f"cloud-only (D=0, same process, {fastest['threads']} torch threads): the fastest in {fastest['shapes']} "
            f"shapes, which every ratio is against first; the reproducible in {reproducible['shapes']} shapes, which "
            f"the split runs in and identity is checked against")


def format_split_report(result: dict[str, Any]) -> str:
    """`run_split_bench`'s result: which cloud-only it compares with, then every run, one line each."""
    return "\n".join([format_split_yardstick(result), *(format_split_row(row) for row in result["runs"])])
