"""``splitspec bench split``: in-process split decoding against target-only, same run.

For each mode and draft length, the same prompt and seed: acceptance, target
forwards per generated token, wall time and its ratio to ``draft_len 0``,
and the drafter's Python overhead per drafted token (time in ``draft()``
beyond llama.cpp's own eval, from ``drafter.stats``). Checks token identity
where the mode promises it.

Contract. `run_split_bench(...)` loads the models, runs, and returns
``{"prompt_tokens", "runs": [row, ...]}``; `format_split_row(row)` and
`format_split_report(result)` render it. No argparse, no printing (a caller
that wants rows as they finish passes ``on_row``); flags are in
``sim.commands.bench``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shared.params import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P

__all__ = ["DEFAULT_PROMPT", "format_split_report", "format_split_row", "run_split_bench"]

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def run_split_bench(
    *,
    target: str | None = None,
    drafter: str | None = None,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 128,
    modes: Sequence[str] = ("greedy", "coupled", "rejection"),
    draft_lens: Sequence[int] = (4, 8),
    temperature: float = DEFAULT_TEMPERATURE,
    top_k: int = DEFAULT_TOP_K,
    top_p: float = DEFAULT_TOP_P,
    seed: int = 0,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Split decoding vs target-only for each mode and draft length; the rows as a dict.

    ``target`` / ``drafter`` None mean the default Gemma 3 270M pair. Greedy
    runs use temperature 0. ``on_row(row)`` is called as each run finishes.
    ValueError on an unknown mode.
    """
    from cloud.engine import TargetEngine
    from cloud.models import resolve_target
    from edge.drafter_choice import open_drafter
    from shared.params import Mode, SamplingParams
    from sim.inprocess import generate

    modes = [Mode(mode) for mode in modes]  # fail on a bad mode before loading models
    engine = TargetEngine(resolve_target(target))
    draft_model = open_drafter(drafter, vocab_size=engine.vocab_size, fingerprint=engine.fingerprint)
    rows = []
    try:
        prompt_ids = draft_model.vocab.tokenize(prompt)
        for mode in modes:
            params = SamplingParams(
                mode=mode,
                temperature=0.0 if mode is Mode.GREEDY else temperature,
                top_k=top_k,
                top_p=top_p,
                seed=seed,
            )
            baseline = None
            for draft_len in [0, *draft_lens]:
                draft_model.stats.reset()
                result = generate(engine, draft_model, prompt_ids, params,
                                  max_new_tokens=max_new_tokens, draft_len=draft_len)
                stats, timing = result.stats, draft_model.stats
                n = max(len(result.tokens), 1)
                drafted = max(stats.drafted, 1)
                row = {
                    "mode": mode.value,
                    "draft_len": draft_len,
                    "tokens": len(result.tokens),
                    "acceptance_rate": round(stats.acceptance_rate, 3),
                    "acceptance_length": round(stats.acceptance_length, 3),
                    "target_forwards_per_token": round(stats.target_forwards / n, 3),
                    "wall_s": round(stats.wall_s, 3),
                    "drafter_eval_ms_per_draft": round(1e3 * timing.eval_s / drafted, 3),
                    "drafter_overhead_ms_per_draft": round(1e3 * (timing.draft_s - timing.eval_s) / drafted, 3),
                }
                if baseline is None:
                    baseline = (result.tokens, stats.wall_s)
                row["wall_vs_target_only"] = round(stats.wall_s / baseline[1], 3)
                row["identical_to_target_only"] = result.tokens == baseline[0]
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    finally:
        draft_model.close()
    return {"prompt_tokens": len(prompt_ids), "runs": rows}


def format_split_row(row: dict[str, Any]) -> str:
    """One run as a line of text."""
    return (
        f"{row['mode']:>9} D={row['draft_len']}: {row['tokens']} tok, alpha {row['acceptance_rate']:.2f}, "
        f"AL {row['acceptance_length']:.2f}, fwd/tok {row['target_forwards_per_token']:.3f}, "
        f"wall {row['wall_s']:.2f}s (x{row['wall_vs_target_only']:.2f} of D=0), "
        f"drafter eval {row['drafter_eval_ms_per_draft']:.2f} ms + overhead {row['drafter_overhead_ms_per_draft']:.2f} ms per draft, "
        f"identical={row['identical_to_target_only']}"
    )


def format_split_report(result: dict[str, Any]) -> str:
    """Every run of `run_split_bench`'s result, one line each."""
    return "\n".join(format_split_row(row) for row in result["runs"])
