"""``splitspec bench …`` subcommands. Flags are parsed here; the work is in ``shared``."""

from __future__ import annotations

import argparse
import json

from sim.wire_bench import MODES, run_wire_bench

__all__ = ["add_bench_commands", "format_wire_report"]


def add_bench_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the bench subcommands (``wire``) to a ``bench`` subparsers object."""
    wire = subparsers.add_parser(
        "wire",
        help="uplink bytes per drafted token for each mode vs the floor and a naive protobuf",
        description="Encode synthetic draft blocks and count the bytes that cross the link.",
    )
    wire.add_argument("--vocab", type=int, default=262144, help="vocabulary size V")
    wire.add_argument("--draft-len", type=int, default=8, help="drafted tokens per block D")
    wire.add_argument("--draft-top-k", type=int, default=16, help="max support of q̃ (rejection)")
    wire.add_argument("--prob-bits", type=int, default=8, help="q̃ weights sum to 2**B (rejection)")
    wire.add_argument("--blocks", type=int, default=200, help="blocks to encode")
    wire.add_argument("--seed", type=int, default=0)
    wire.add_argument("--drafter", default=None,
                      help="take q from this GGUF drafter (or 'default' for Gemma 3 270M) instead of synthetic Zipf blocks")
    wire.add_argument("--temperature", type=float, default=0.7, help="with --drafter: sampling temperature for q")
    wire.add_argument("--top-k", type=int, default=64, help="with --drafter: top-k for q, as in edge run (default 64)")
    wire.add_argument("--top-p", type=float, default=0.95, help="with --drafter: top-p for q, as in edge run (default 0.95)")
    wire.add_argument("--json", action="store_true", help="print the result as JSON")
    wire.set_defaults(func=_run_wire)

    from sim.bench_service import add_service_bench_command
    from sim.bench_split import add_split_bench_command

    add_split_bench_command(subparsers)
    add_service_bench_command(subparsers)


def _recorded_drafter(path: str | None, temperature: float, top_k: int, top_p: float, positions: int = 512):
    """Run a real drafter over a text once; replay its processed q per position (cyclically).

    Returns (vocab_size, hook). q is kept as its top 256 candidates, which is
    all that q̃ (top-k <= 256) and the coupled proposal ever look at.
    """
    import numpy as np

    from edge.drafter import propose
    from edge.loading import open_llama_drafter
    from shared.logits import top_candidates
    from shared.params import SamplingParams

    drafter = open_llama_drafter(None if path == "default" else path, n_threads=None)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    prompt = drafter.vocab.tokenize("Write a detailed essay about the history of the printing press and its effects on Europe.")
    drafter.begin(prompt, params)
    recorded = []
    for i in range(positions):
        logits = drafter.next_logits()
        recorded.append(top_candidates(logits, params, limit=256))
        token, _ = propose(logits, params, len(prompt) + i)
        drafter.commit([token])
    vocab_size = drafter.vocab_size
    drafter.close()

    def hook(position: int) -> np.ndarray:
        ids, probs = recorded[position % len(recorded)]
        q = np.zeros(vocab_size)
        q[ids] = probs
        return q

    return vocab_size, hook


def _run_wire(args: argparse.Namespace) -> int:
    vocab_size, drafter = args.vocab, None
    if args.drafter is not None:
        vocab_size, drafter = _recorded_drafter(args.drafter, args.temperature, args.top_k, args.top_p)
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


def format_wire_report(result: dict) -> str:
    """A small table of bytes per drafted token, with ratios to the floor and to naive."""
    floor = result["floor_bytes_per_token"]
    naive = result["naive"]
    rows = [(mode, result["modes"][mode]) for mode in MODES]
    lines = [
        f"V={result['vocab']}  D={result['draft_len']}  floor={floor:.3f} B/token (log2 V / 8)",
        f"{'mode':<10}{'payload':>9}{'framed':>9}{'+http2':>9}{'vs floor':>10}{'naive/ours':>12}",
    ]
    for mode, row in rows:
        reference = (
            naive["framed_bytes_per_token"]
            if mode == "rejection"
            else naive["tokens_only_framed_bytes_per_token"]
        )
        lines.append(
            f"{mode:<10}{row['payload_bytes_per_token']:>9.3f}{row['framed_bytes_per_token']:>9.3f}"
            f"{row['http2_framed_bytes_per_token']:>9.3f}"
            f"{row['framed_bytes_per_token'] / floor:>9.2f}x"
            f"{reference / row['framed_bytes_per_token']:>11.2f}x"
        )
    lines.append(
        f"{'naive q':<10}{naive['payload_bytes_per_token']:>9.3f}"
        f"{naive['framed_bytes_per_token']:>9.3f}"
        f"{naive['http2_framed_bytes_per_token']:>9.3f}"
        f"{naive['framed_bytes_per_token'] / floor:>9.2f}x"
    )
    lines.append(
        f"{'naive ids':<10}{naive['tokens_only_payload_bytes_per_token']:>9.3f}"
        f"{naive['tokens_only_framed_bytes_per_token']:>9.3f}"
        f"{naive['tokens_only_http2_framed_bytes_per_token']:>9.3f}"
        f"{naive['tokens_only_framed_bytes_per_token'] / floor:>9.2f}x"
    )
    lines.append(
        "bytes per drafted token; framed = EdgeFrame + 5-byte gRPC prefix, +http2 adds a 9-byte "
        "DATA frame header; naive q = packed int32 ids + float32 top-k probs + tokens "
        "(rejection's reference), naive ids = packed int32 tokens (greedy/coupled's)"
    )
    return "\n".join(lines)
