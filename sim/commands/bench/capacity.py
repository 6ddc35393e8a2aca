"""``splitspec bench capacity``: sessions one verifier carries; --soak. Flags only; the bench is
``sim.bench.capacity``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shared.cli import positive_float, positive_int
from shared.params import DEFAULT_DRAFT_LEN, DEFAULT_TEMPERATURE

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    capacity = subparsers.add_parser(
        "capacity", help="sessions one verifier carries: split vs cloud-only, both batched, at a per-session SLO",
        description="Starts `splitspec-cloud serve` pinned to one core and runs N concurrent edge sessions "
                    "against it for each --sessions count, cloud-only in free shapes (its fastest) and split (each "
                    "--mode) in canonical (batch-invariant) shapes, each on its own verifier on that core, "
                    "reporting aggregate and per-session tokens/s, cloud forwards and CPU seconds per token, the "
                    "verifier's busy fraction, batch sizes and whether every output equals target-only decoding. "
                    "The edges replay blocks recorded from the real llama.cpp drafter (so N edges fit on the other "
                    "cores) and the acceptance they reach is reported. First it measures the fastest lone "
                    "cloud-only rate (free shapes, one session alone); the SLO is --slo-fraction of it unless "
                    "--slo is given. Capacity at the SLO is the largest N whose median session gets at least "
                    "that many tokens/s.")
    capacity.add_argument("--sessions", type=positive_int, nargs="+", default=[1, 2, 4, 8, 16],
                          help="concurrent session counts (default %(default)s)")
    capacity.add_argument("--mode", choices=("greedy", "coupled"), default="coupled",
                          help="split mode (and the sampling cloud-only uses too): greedy, or coupled at "
                               "--temperature (default %(default)s)")
    capacity.add_argument("--slo", type=positive_float, default=None, metavar="TOKENS_PER_S",
                          help="tokens/s per session (p50) for capacity (default: --slo-fraction of the fastest "
                               "lone cloud-only rate, measured first in the same run)")
    capacity.add_argument("--slo-fraction", type=positive_float, default=0.5,
                          help="without --slo: the SLO as this fraction of the lone cloud-only rate in free shapes "
                               "(default %(default)s)")
    capacity.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens per session (default %(default)s)")
    capacity.add_argument("--draft-len", type=positive_int, default=DEFAULT_DRAFT_LEN,
                          help="drafted tokens per block D (default %(default)s)")
    capacity.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                          help="sampling temperature; 0 is greedy (default %(default)s)")
    capacity.add_argument("--no-batching", action="store_true",
                          help="also run every count with the verifiers serving one forward at a time "
                               "(each side in its shapes, as batched)")
    capacity.add_argument("--scenario", default=None,
                          help="each edge reaches the verifier through its own emulated link of this scenario "
                               "(default: plain loopback)")
    capacity.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    capacity.add_argument("--drafter", default=None, help="drafter GGUF to record (default: Gemma 3 270M Q4_K_M)")
    capacity.add_argument("--tiny", action="store_true", help="generated tiny models (a quick self-check)")
    capacity.add_argument("--device", default=None, help="the verifier's torch device (e.g. cuda; default: cpu here)")
    capacity.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                          help="the verifier's dtype (default: float32 on CPU, bfloat16 on GPU)")
    capacity.add_argument("--free-shapes", action="store_true",
                          help="also run every count with each side in its other shapes (the split in free, not "
                               "batch-invariant, shapes; cloud-only in canonical): what invariance costs each "
                               "(the free runs' identity column says whether luck held)")
    capacity.add_argument("--unpinned", action="store_true",
                          help="do not pin the verifier to one core (a GPU verifier, or a many-core CPU one)")
    capacity.add_argument("--soak", type=float, default=None, metavar="MINUTES",
                          help="instead: max(--sessions) workers open, decode and close sessions for this long "
                               "(one in ten abandoned mid-stream); reports errors, verdict latency per minute, "
                               "the verifier's RSS over time and sessions left after the TTL")
    capacity.add_argument("--out", default="out/capacity-soak", help="where --soak writes soak.png (default %(default)s)")
    capacity.add_argument("--json", action="store_true", help="print the report as JSON")
    capacity.set_defaults(func=run_capacity)


def run_capacity(args: argparse.Namespace) -> int:
    import sys

    from sim.bench.capacity import CapacityBench, format_capacity_report, run_capacity_bench

    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.soak is not None:
        return _run_soak(args, progress)
    report = run_capacity_bench(CapacityBench(
        sessions=sorted(set(args.sessions)), mode=args.mode, slo=args.slo, slo_fraction=args.slo_fraction,
        max_new_tokens=args.max_new_tokens, draft_len=args.draft_len, temperature=args.temperature,
        compare_unbatched=args.no_batching, compare_free_shapes=args.free_shapes, target=args.target,
        drafter=args.drafter, tiny=args.tiny, scenario=args.scenario,
        cloud_cores=frozenset() if args.unpinned else None, cloud_args=tuple(cloud_flags(args))), progress)
    print(json.dumps(report) if args.json else format_capacity_report(report))
    return 0 if all(run["identical"] for run in report["runs"] if run["shapes"] == "canonical") else 1


def cloud_flags(args: argparse.Namespace) -> list[str]:
    """``splitspec-cloud serve`` flags from the capacity bench's own."""
    flags = []
    if args.device:
        flags += ["--device", args.device]
    if args.dtype:
        flags += ["--dtype", args.dtype]
    return flags


def _run_soak(args: argparse.Namespace, progress) -> int:

    from sim.bench.soak import SoakBench, plot_soak, run_soak_bench

    report = run_soak_bench(SoakBench(
        minutes=args.soak, sessions=max(args.sessions), max_new_tokens=args.max_new_tokens, draft_len=args.draft_len,
        temperature=0.0 if args.mode == "greedy" else args.temperature, target=args.target, drafter=args.drafter,
        tiny=args.tiny, cloud_cores=frozenset() if args.unpinned else None, cloud_args=tuple(cloud_flags(args))),
        progress)
    report["plot"] = str(plot_soak(report, Path(args.out)))
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            if key not in ("rss_mb", "verdict_latency"):
                print(f"{key:>24}: {value}")
        for minute in report["verdict_latency"]:
            print(f"  minute {minute['minute']}: {minute['rounds']} rounds, verdict latency p50 "
                  f"{minute['verdict_latency_p50_s'] * 1e3:.0f} ms, p99 {minute['verdict_latency_p99_s'] * 1e3:.0f} ms")
    clean = not report["errors"] and not report["different"] and not report["leaked_sessions"]
    return 0 if clean else 1
