"""``splitspec bench service``: what the verifier service costs per verify, outside the forward.

Runs the same split decoding twice with the same drafter and seeds: in
process (the baseline: ``VerifierSession`` called directly) and through a
real gRPC server on loopback. Reports the servicer's own time per verify
outside the target forward (decode, checks, executor hand-off, metrics;
p50/p90/p99) and the end-to-end extra per round over loopback against the
in-process baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

__all__ = ["add_service_bench_command"]


def add_service_bench_command(commands) -> None:
    parser = commands.add_parser("service", help="verifier overhead per verify outside the forward (tiny models by default)")
    parser.add_argument("--target", default=None, help="target folder (default: tiny generated models)")
    parser.add_argument("--drafter", default=None, help="drafter GGUF matching the target")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-len", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run_service_bench)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_service_bench(args: argparse.Namespace) -> int:
    from cloud.engine import TargetEngine
    from cloud.server import BackgroundServer, ServerConfig
    from edge.client import GrpcLink
    from edge.decode_loop import run_decode
    from edge.llama_drafter import LlamaDrafter
    from shared.params import Mode, SamplingParams
    from sim.inprocess import generate

    with tempfile.TemporaryDirectory(prefix="splitspec-bench-") as tmp:
        if args.target is None:
            from sim.tiny_models import write_tiny_models

            paths = write_tiny_models(tmp)
            target, drafter_path = paths["target"], paths["drafter_noisy"]
        else:
            target, drafter_path = args.target, args.drafter
        engine = TargetEngine(target)
        drafter = LlamaDrafter(drafter_path, n_ctx=2048, n_threads=1)
        prompt = drafter.vocab.tokenize("The quick brown fox")
        runs = [SamplingParams(mode=Mode.COUPLED, temperature=0.8, seed=s) for s in range(args.sessions)]
        local_rounds = local_wall = 0.0
        for params in runs:
            result = generate(engine, drafter, prompt, params, max_new_tokens=args.max_new_tokens, draft_len=args.draft_len)
            local_rounds += result.stats.rounds
            local_wall += result.stats.wall_s
        remote_rounds = remote_wall = 0.0
        with BackgroundServer(engine, ServerConfig(port=0)) as server:
            for params in runs:
                link = GrpcLink(server.address, vocab_size=engine.vocab_size, fingerprint=engine.fingerprint)
                link.connect()
                result = run_decode(drafter, link, prompt, params, max_new_tokens=args.max_new_tokens, draft_len=args.draft_len)
                remote_rounds += result.stats.rounds
                remote_wall += result.stats.wall_s
            overheads = list(server.server.servicer.recent_overheads_s)
        drafter.close()
    report = {
        "verifies": len(overheads),
        "service_overhead_ms": {
            "p50": 1e3 * statistics.median(overheads),
            "p90": 1e3 * _percentile(overheads, 0.9),
            "p99": 1e3 * _percentile(overheads, 0.99),
        },
        "in_process_ms_per_round": 1e3 * local_wall / local_rounds,
        "loopback_grpc_ms_per_round": 1e3 * remote_wall / remote_rounds,
        "loopback_extra_ms_per_round": 1e3 * (remote_wall / remote_rounds - local_wall / local_rounds),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        o = report["service_overhead_ms"]
        print(
            f"{report['verifies']} verifies: service overhead outside the forward p50 {o['p50']:.3f} ms, "
            f"p90 {o['p90']:.3f} ms, p99 {o['p99']:.3f} ms\n"
            f"per round: in-process {report['in_process_ms_per_round']:.3f} ms, over loopback gRPC "
            f"{report['loopback_grpc_ms_per_round']:.3f} ms (+{report['loopback_extra_ms_per_round']:.3f} ms, "
            f"x{report['loopback_grpc_ms_per_round'] / report['in_process_ms_per_round']:.2f})"
        )
    return 0
