"""``splitspec bench split``: in-process split decoding against target-only, same run.

For each mode and draft length, the same prompt and seed: acceptance, target
forwards per generated token, wall time and its ratio to ``--draft-len 0``,
and the drafter's Python overhead per drafted token (time in ``draft()``
beyond llama.cpp's own eval). Checks token identity where the mode promises it.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["add_split_bench_command"]

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def add_split_bench_command(commands) -> None:
    parser = commands.add_parser("split", help="split decoding vs target-only, in one process, on real models")
    parser.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    parser.add_argument("--drafter", default=None, help="drafter GGUF (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["greedy", "coupled", "rejection"])
    parser.add_argument("--draft-lens", nargs="+", type=int, default=[4, 8])
    parser.add_argument("--temperature", type=float, default=0.7, help="for coupled and rejection (greedy uses 0)")
    parser.add_argument("--top-k", type=int, default=64, help="as in generate (default 64; 0 = off)")
    parser.add_argument("--top-p", type=float, default=0.95, help="as in generate (default 0.95; 1.0 = off)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run_split_bench)


def run_split_bench(args: argparse.Namespace) -> int:
    from cloud.engine import TargetEngine
    from cloud.models import resolve_target
    from edge.loading import open_drafter
    from shared.params import Mode, SamplingParams
    from sim.inprocess import generate

    engine = TargetEngine(resolve_target(args.target))
    drafter = open_drafter(args.drafter, vocab_size=engine.vocab_size, fingerprint=engine.fingerprint)
    prompt = drafter.vocab.tokenize(args.prompt)
    rows = []
    for mode in args.modes:
        params = SamplingParams(
            mode=Mode(mode),
            temperature=0.0 if mode == "greedy" else args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
        )
        baseline = None
        for draft_len in [0, *args.draft_lens]:
            drafter.draft_s = drafter.eval_s = 0.0
            result = generate(engine, drafter, prompt, params, max_new_tokens=args.max_new_tokens, draft_len=draft_len)
            stats = result.stats
            n = max(len(result.tokens), 1)
            row = {
                "mode": mode,
                "draft_len": draft_len,
                "tokens": len(result.tokens),
                "acceptance_rate": round(stats.acceptance_rate, 3),
                "acceptance_length": round(stats.acceptance_length, 3),
                "target_forwards_per_token": round(stats.target_forwards / n, 3),
                "wall_s": round(stats.wall_s, 3),
                "drafter_eval_ms_per_draft": round(1e3 * drafter.eval_s / max(stats.drafted, 1), 3),
                "drafter_overhead_ms_per_draft": round(1e3 * (drafter.draft_s - drafter.eval_s) / max(stats.drafted, 1), 3),
            }
            if baseline is None:
                baseline = (result.tokens, stats.wall_s)
            row["wall_vs_target_only"] = round(stats.wall_s / baseline[1], 3)
            row["identical_to_target_only"] = result.tokens == baseline[0]
            rows.append(row)
            if not args.json:
                print(_format(row), flush=True)
    drafter.close()
    if args.json:
        print(json.dumps({"prompt_tokens": len(prompt), "runs": rows}, indent=2))
    return 0


def _format(row: dict) -> str:
    return (
        f"{row['mode']:>9} D={row['draft_len']}: {row['tokens']} tok, alpha {row['acceptance_rate']:.2f}, "
        f"AL {row['acceptance_length']:.2f}, fwd/tok {row['target_forwards_per_token']:.3f}, "
        f"wall {row['wall_s']:.2f}s (x{row['wall_vs_target_only']:.2f} of D=0), "
        f"drafter eval {row['drafter_eval_ms_per_draft']:.2f} ms + overhead {row['drafter_overhead_ms_per_draft']:.2f} ms per draft, "
        f"identical={row['identical_to_target_only']}"
    )
