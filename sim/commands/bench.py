"""``splitspec bench …`` subcommands: ``wire``, ``split``, ``service``, ``fuzz``, ``serve``, ``capacity``,
``invariance``, ``fairness``, ``products``, ``forward-rows``.

Flags only: each ``run_*`` turns its flags into keyword arguments of the
matching ``sim.bench`` function and prints the result (text or JSON). The
benches' heavy imports happen when a subcommand runs, so ``--help`` loads no
model code.
Sampling defaults are the product's, from ``shared.params``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shared.cli import non_negative_int, positive_float, positive_int
from shared.params import (
    DEFAULT_DRAFT_LEN,
    DEFAULT_DRAFT_TOP_K,
    DEFAULT_PROB_BITS,
    DEFAULT_SCHEDULE,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    SCHEDULES,
    Mode,
)
from sim.bench.split import DEFAULT_PROMPT as SPLIT_PROMPT  # a constant; the bench itself loads lazily

__all__ = ["add_bench_commands"]

_MODES = [mode.value for mode in Mode]


def add_bench_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the bench subcommands to a ``bench`` subparsers object."""
    _add_wire(subparsers)
    _add_split(subparsers)
    _add_service(subparsers)
    _add_fuzz(subparsers)
    _add_serve(subparsers)
    _add_capacity(subparsers)
    _add_invariance(subparsers)
    _add_fairness(subparsers)
    _add_products(subparsers)


def _add_wire(subparsers: argparse._SubParsersAction) -> None:
    wire = subparsers.add_parser(
        "wire",
        help="uplink bytes per drafted token for each mode vs the floor and a naive protobuf",
        description="Encode synthetic draft blocks and count the bytes that cross the link.",
    )
    wire.add_argument("--vocab", type=positive_int, default=262144, help="vocabulary size V (default %(default)s)")
    wire.add_argument("--draft-len", type=positive_int, default=DEFAULT_DRAFT_LEN,
                      help="drafted tokens per block D (default %(default)s)")
    wire.add_argument("--draft-top-k", type=positive_int, default=DEFAULT_DRAFT_TOP_K,
                      help="max support of q̃, rejection (default %(default)s)")
    wire.add_argument("--prob-bits", type=positive_int, default=DEFAULT_PROB_BITS,
                      help="q̃ weights sum to 2**B, rejection (default %(default)s)")
    wire.add_argument("--blocks", type=positive_int, default=200, help="blocks to encode (default %(default)s)")
    wire.add_argument("--seed", type=int, default=0)
    wire.add_argument("--drafter", default=None,
                      help="take q from this GGUF drafter (or 'default' for Gemma 3 270M) instead of synthetic Zipf blocks")
    _add_logit_processing(wire, "with --drafter: ")
    wire.add_argument("--json", action="store_true", help="print the result as JSON")
    wire.set_defaults(func=run_wire)


def _add_logit_processing(parser: argparse.ArgumentParser, applies: str) -> None:
    """--temperature/--top-k/--top-p with the product defaults; ``applies`` prefixes each help."""
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                        help=f"{applies}sampling temperature (default %(default)s)")
    parser.add_argument("--top-k", type=non_negative_int, default=DEFAULT_TOP_K,
                        help=f"{applies}top-k, as in edge run (default %(default)s; 0 = off)")
    parser.add_argument("--top-p", type=float, default=DEFAULT_TOP_P,
                        help=f"{applies}top-p, as in edge run (default %(default)s; 1.0 = off)")


def _add_split(subparsers: argparse._SubParsersAction) -> None:
    split = subparsers.add_parser(
        "split", help="split decoding vs cloud-only, in one process, on real models",
        description="For each mode and draft length, the same prompt and seed in one process: acceptance, "
                    "target forwards per token, wall time against cloud-only (D=0) in free shapes (the fastest) "
                    "and in canonical shapes (the reproducible, which the split runs in), both on the same torch "
                    "threads, drafter overhead, token identity with the reproducible cloud-only.")
    split.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    split.add_argument("--drafter", default=None, help="drafter GGUF (default: Gemma 3 270M Q4_K_M)")
    split.add_argument("--prompt", default=SPLIT_PROMPT, help="text to continue (default: a short-story prompt)")
    split.add_argument("--max-new-tokens", type=positive_int, default=128,
                       help="tokens per run (default %(default)s)")
    split.add_argument("--modes", nargs="+", choices=_MODES, default=_MODES)
    split.add_argument("--draft-lens", nargs="+", type=positive_int, default=[4, 8],
                       help="draft lengths D besides the D=0 baseline (default 4 8)")
    _add_logit_processing(split, "coupled and rejection (greedy uses temperature 0): ")
    split.add_argument("--seed", type=int, default=0)
    split.add_argument("--lookup", action="store_true",
                       help="each split run again with the drafter behind prompt lookup (edge --lookup)")
    split.add_argument("--json", action="store_true", help="print the result as JSON")
    split.set_defaults(func=run_split)


def _add_service(subparsers: argparse._SubParsersAction) -> None:
    service = subparsers.add_parser(
        "service", help="verifier overhead per verify outside the forward (tiny models by default)",
        description="The same split decoding in process and through a real gRPC server on loopback: the "
                    "servicer's time per verify outside the forward (p50/p90/p99) and the extra per round.")
    service.add_argument("--target", default=None, help="target folder (default: tiny generated models)")
    service.add_argument("--drafter", default=None, help="drafter GGUF matching the target (needed with --target)")
    service.add_argument("--sessions", type=positive_int, default=20,
                         help="sessions, one seed each (default %(default)s)")
    service.add_argument("--mode", choices=("coupled", "rejection"), default="coupled",
                         help="verification mode; rejection also prices the draft audit against a verifier "
                              "without it, interleaved (default %(default)s)")
    service.add_argument("--max-new-tokens", type=positive_int, default=64,
                         help="tokens per session (default %(default)s)")
    service.add_argument("--draft-len", type=non_negative_int, default=4,
                         help="drafted tokens per block D (default %(default)s)")
    service.add_argument("--json", action="store_true", help="print the result as JSON")
    service.set_defaults(func=run_service)


def _add_fuzz(subparsers: argparse._SubParsersAction) -> None:
    fuzz = subparsers.add_parser(
        "fuzz", help="soak a real verifier with hostile frames while an honest edge decodes (tiny models)",
        description="Starts `splitspec-cloud serve` on tiny generated models and sends at least --frames hostile "
                    "messages on concurrent streams from several client identities: random bytes, mutated valid "
                    "frames, out-of-range ids, positions and epochs, zstd bombs, oversized payloads and messages, "
                    "streams abandoned or left silent. An honest edge decodes all the while and must stay "
                    "token-identical. Reports how streams ended, hangs, the service's memory, the longest an "
                    "honest Open was refused and the sessions left once the TTL passed; exits 1 on any finding.")
    fuzz.add_argument("--frames", type=positive_int, default=10_000, help="hostile messages (default %(default)s)")
    fuzz.add_argument("--workers", type=positive_int, default=8, help="concurrent hostile streams (default %(default)s)")
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--json", action="store_true", help="print the report as JSON")
    fuzz.set_defaults(func=run_fuzz)


def _add_serve(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve", help="edge serve: conversation uplink and TTFT (kept vs fresh session), HTTP overhead",
        description="With a real cloud process behind the emulated link: a conversation of --turns turns kept in "
                    "one cloud session against a fresh session per turn (prompt tokens and bytes uploaded, time to "
                    "first token, identical replies), then one prompt streamed through the OpenAI server against "
                    "the same generation called directly, then that prompt cloud-only through the same link from "
                    "a cloud in free shapes (the fastest) and from the split's own (canonical) on the same cores: "
                    "the direct split's tokens/s over each.")
    serve.add_argument("--scenario", default="acespec-50k", help="link scenario (default %(default)s)")
    serve.add_argument("--turns", type=positive_int, default=10, help="user turns, at most 10 (default %(default)s)")
    serve.add_argument("--max-tokens", type=positive_int, default=32, help="reply tokens per turn (default %(default)s)")
    serve.add_argument("--repeats", type=positive_int, default=3, help="HTTP vs direct repeats (default %(default)s)")
    serve.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    serve.add_argument("--drafter", default=None, help="drafter GGUF (default: Gemma 3 270M Q4_K_M)")
    serve.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True,
                       help="the drafter behind prompt lookup, as `edge serve` runs it by default (--no-lookup: the "
                            "GGUF drafter alone; run both to see what lookup buys a conversation)")
    serve.add_argument("--schedule", choices=SCHEDULES, default=DEFAULT_SCHEDULE,
                       help="edge serve's --schedule (default %(default)s)")
    serve.add_argument("--json", action="store_true", help="print the result as JSON")
    serve.set_defaults(func=run_serve)


def _add_capacity(subparsers: argparse._SubParsersAction) -> None:
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

    from sim.bench.capacity import format_capacity_report, run_capacity_bench

    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.soak is not None:
        return _run_soak(args, progress)
    report = run_capacity_bench(
        sessions=sorted(set(args.sessions)), mode=args.mode, slo=args.slo, slo_fraction=args.slo_fraction,
        max_new_tokens=args.max_new_tokens,
        draft_len=args.draft_len, temperature=args.temperature, compare_unbatched=args.no_batching,
        target=args.target, drafter=args.drafter, tiny=args.tiny, scenario=args.scenario, progress=progress,
        compare_free_shapes=args.free_shapes, cloud_cores=set() if args.unpinned else None,
        cloud_args=_cloud_flags(args),
    )
    print(json.dumps(report) if args.json else format_capacity_report(report))
    return 0 if all(run["identical"] for run in report["runs"] if run["shapes"] == "canonical") else 1


def _add_invariance(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser(
        "invariance", help="are a row's logits bit-identical alone, in a block and beside batch-mates?",
        description="Runs random token sequences through the target engine twice: one token per forward (as "
                    "target-only decoding does) and in random blocks, chunked prefills and crops, every forward "
                    "shared with batch-mates. Reports whether every row's logits were bit-identical (torch.equal) "
                    "and the largest difference; exits 1 when canonical shapes were not bit-identical.")
    check.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    check.add_argument("--tiny", action="store_true", help="generated tiny target")
    check.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    check.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                       help="default: float32 on CPU, bfloat16 on GPU")
    check.add_argument("--shapes", choices=("canonical", "free"), default="canonical")
    check.add_argument("--trials", type=positive_int, default=5, help="random sequences (default %(default)s)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=run_invariance)


def run_invariance(args: argparse.Namespace) -> int:
    from sim.bench.invariance import run_invariance_check

    report = run_invariance_check(target=args.target, tiny=args.tiny, device=args.device, dtype=args.dtype,
                                  trials=args.trials, canonical=args.shapes == "canonical")
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>22}: {value}")
    return 0 if report["bit_identical"] or args.shapes == "free" else 1


def _add_fairness(subparsers: argparse._SubParsersAction) -> None:
    fair = subparsers.add_parser(
        "fairness", help="honest edges beside garbage-drafting clients: tokens/s and row shares (tiny models)",
        description="One in-process verifier on loopback (tiny generated models, CPU): honest edges replaying a real "
                    "drafter's blocks, alone and then beside attackers drafting random tokens at the largest draft "
                    "length and window. Prints honest tokens/s both ways, the attackers' share of verify rows in "
                    "contended forwards against their fair share, and whether honest outputs equal target-only.")
    fair.add_argument("--tiny", action="store_true", default=True, help="generated tiny models (the only choice)")
    fair.add_argument("--honest", type=positive_int, default=4, help="honest edges (default %(default)s)")
    fair.add_argument("--attackers", type=non_negative_int, default=2, help="attacking edges (default %(default)s)")
    fair.add_argument("--max-new-tokens", type=positive_int, default=32,
                      help="tokens per honest edge (default %(default)s)")
    fair.add_argument("--draft-len", type=positive_int, default=4, help="honest block D (default %(default)s)")
    fair.add_argument("--max-draft-len", type=positive_int, default=16,
                      help="the verifier's largest D, the attackers' (default %(default)s)")
    fair.add_argument("--window", type=positive_int, default=4,
                      help="the verifier's blocks in flight, the attackers' window (default %(default)s)")
    fair.add_argument("--forward-ms", type=positive_float, default=5.0,
                      help="each forward held this long, as a big target's (default %(default)s)")
    fair.add_argument("--row-ms", type=positive_float, default=0.2, help="... plus this per row (default %(default)s)")
    fair.set_defaults(func=run_fairness)


def run_fairness(args: argparse.Namespace) -> int:
    from sim.bench.fairness import run_fairness_bench

    report = run_fairness_bench(honest=args.honest, attackers=args.attackers, max_new_tokens=args.max_new_tokens,
                                draft_len=args.draft_len, max_draft_len=args.max_draft_len,
                                max_blocks_in_flight=args.window, forward_ms=args.forward_ms, row_ms=args.row_ms)
    print(json.dumps(report))
    return 0 if report["identical"] else 1


def _cloud_flags(args: argparse.Namespace) -> list[str]:
    """``splitspec-cloud serve`` flags from the capacity bench's own."""
    flags = []
    if args.device:
        flags += ["--device", args.device]
    if args.dtype:
        flags += ["--dtype", args.dtype]
    return flags


def _run_soak(args: argparse.Namespace, progress) -> int:
    from pathlib import Path

    from sim.bench.soak import plot_soak, run_soak_bench

    report = run_soak_bench(
        minutes=args.soak, sessions=max(args.sessions), max_new_tokens=args.max_new_tokens, draft_len=args.draft_len,
        temperature=0.0 if args.mode == "greedy" else args.temperature, target=args.target, drafter=args.drafter,
        tiny=args.tiny, progress=progress, cloud_cores=set() if args.unpinned else None, cloud_args=_cloud_flags(args),
    )
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


def run_serve(args: argparse.Namespace) -> int:
    import sys

    from sim.bench.serve import format_serve_report, run_serve_bench

    report = run_serve_bench(scenario=args.scenario, turns=args.turns, max_tokens=args.max_tokens,
                             repeats=args.repeats, target=args.target, drafter=args.drafter, lookup=args.lookup,
                             schedule=args.schedule, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(report) if args.json else format_serve_report(report))
    return 0


def run_fuzz(args: argparse.Namespace) -> int:
    import sys

    from sim.bench.fuzz import soak_tiny_service

    report = soak_tiny_service(args.frames, seed=args.seed, workers=args.workers,
                               progress=lambda line: print(line, file=sys.stderr, flush=True))
    result = report.to_json()
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>18}: {value}")
    clean = (not report.unexpected and not report.hangs and not report.honest_errors and report.server_alive
             and report.honest_identical == report.honest_sessions and report.sessions_left == 0
             and report.forged_accepted == 0)
    return 0 if clean else 1


def run_wire(args: argparse.Namespace) -> int:
    from sim.bench.wire import format_wire_report, recorded_drafter, run_wire_bench

    vocab_size, drafter = args.vocab, None
    if args.drafter is not None:
        vocab_size, drafter = recorded_drafter(
            args.drafter, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    result = run_wire_bench(
        drafter=drafter,
        vocab_size=vocab_size,
        draft_len=args.draft_len,
        draft_top_k=args.draft_top_k,
        prob_bits=args.prob_bits,
        blocks=args.blocks,
        seed=args.seed,
    )
    print(json.dumps(result, indent=2) if args.json else format_wire_report(result))
    return 0


def run_split(args: argparse.Namespace) -> int:
    from sim.bench.split import format_split_row, format_split_yardstick, run_split_bench

    def show(row: dict) -> None:
        print(format_split_row(row), flush=True)

    result = run_split_bench(
        target=args.target,
        drafter=args.drafter,
        prompt=args.prompt,
        max_new_tokens=args.max_new_tokens,
        modes=args.modes,
        draft_lens=args.draft_lens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        lookup=args.lookup,
        on_row=None if args.json else show,
    )
    print(json.dumps(result, indent=2) if args.json else format_split_yardstick(result))
    return 0


def run_service(args: argparse.Namespace) -> int:
    from sim.bench.service import format_service_report, run_service_bench

    report = run_service_bench(
        target=args.target,
        drafter=args.drafter,
        sessions=args.sessions,
        max_new_tokens=args.max_new_tokens,
        draft_len=args.draft_len,
        mode=args.mode,
    )
    print(json.dumps(report, indent=2) if args.json else format_service_report(report))
    return 0


def _add_products(subparsers: argparse._SubParsersAction) -> None:
    products = subparsers.add_parser(
        "products", help="which matrix-product path keeps a row's bits at the smallest row tile (CPU, minutes)",
        description="Probe ways to compute x @ W.T on Gemma 3 270M's shapes (MKL GEMM in either operand order, "
                    "oneDNN's inner product, row-wise GEMV) under MKL/oneDNN settings, each in a subprocess: the "
                    "smallest row tile at which each is bit-invariant, and its time by row count.")
    products.add_argument("--repeats", type=positive_int, default=5, help="timed repeats (default %(default)s)")
    products.add_argument("--out", type=Path, default=None, help="write the JSON report here (else stdout)")
    products.set_defaults(func=run_products)
    rows = subparsers.add_parser(
        "forward-rows", help="one target forward's cost by row count: free and canonical, as chosen and on BLAS alone",
        description="Time forwards of 1-16 appended rows on the target in free shapes, canonical shapes as the "
                    "engine picks them (oneDNN where it holds), and both on F.linear alone.")
    rows.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    rows.add_argument("--threads", type=positive_int, default=1,
                      help="torch threads (default %(default)s: one core, as sim run gives the cloud)")
    rows.add_argument("--repeats", type=positive_int, default=7, help="timed repeats (default %(default)s)")
    rows.add_argument("--out", type=Path, default=None, help="write the JSON report here (else stdout)")
    rows.set_defaults(func=run_forward_rows)


def _write(report: dict, out: Path | None) -> int:
    text = json.dumps(report, indent=1)
    if out is not None:
        out.write_text(text + "\n")
    else:
        print(text)
    return 0


def run_products(args: argparse.Namespace) -> int:
    from sim.bench.products import run_product_probe

    return _write(run_product_probe(repeats=args.repeats), args.out)


def run_forward_rows(args: argparse.Namespace) -> int:
    from sim.bench.forward_rows import run_forward_rows as measure

    return _write(measure(target=args.target, threads=args.threads, repeats=args.repeats), args.out)
