"""``splitspec generate``: split decoding in one process, no network."""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["add_generate_command"]


def add_generate_command(commands) -> None:
    from edge.cli_options import add_drafter_args, add_sampling_args

    parser = commands.add_parser(
        "generate",
        help="split decoding in one process (drafter + target, no network)",
        description="Draft with llama.cpp (or prompt lookup), verify with the target in PyTorch, "
        "in one process. Output is identical to the target alone (--draft-len 0) in greedy and coupled modes.",
    )
    parser.add_argument("--target", default=None, help="target: Hugging Face folder or GGUF file (default: Gemma 3 270M)")
    parser.add_argument("--device", default=None, help="torch device for the target (default: cuda if available, else cpu)")
    parser.add_argument("--shapes", choices=("auto", "canonical", "free"), default="auto",
                        help="the target's product shapes, as the verifier's --shapes: auto (default: batch-invariant "
                        "only for a --reproducible session), canonical (always) or free (never)")
    add_drafter_args(parser)
    add_sampling_args(parser)
    parser.add_argument("--json", action="store_true", help='print {"tokens", "text", "stats"} as JSON instead of streaming text')
    parser.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from cloud.engine import TargetEngine
    from cloud.models import resolve_target
    from edge.cli_options import controller_from_args, sampling_from_args, spec_from_args
    from edge.drafter_choice import NGRAM, open_drafter
    from edge.text_stream import TextStream
    from sim.inprocess import generate

    params = sampling_from_args(args)
    engine = TargetEngine(resolve_target(args.target), device=args.device, shapes=args.shapes)
    drafter = open_drafter(
        args.drafter,
        vocab_size=engine.vocab_size,
        fingerprint=engine.fingerprint,
        n_threads=args.drafter_threads,
        n_ctx=args.drafter_ctx,
        lookup=args.lookup,
    )
    if args.drafter == NGRAM:
        prompt = engine.tokenizer(args.prompt).input_ids
        detokenize = lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    else:
        prompt = drafter.vocab.tokenize(args.prompt)
        detokenize = drafter.vocab.detokenize
    stream = None if args.json else TextStream(detokenize)
    started = time.perf_counter()
    try:
        result = generate(
            engine, drafter, prompt, params, max_new_tokens=args.max_new_tokens,
            spec=spec_from_args(args, controller_from_args(args)), on_tokens=stream,
        )
    finally:
        drafter.close()
    stats = result.stats
    if args.json:
        out = {"tokens": result.tokens, "text": detokenize(result.tokens)}
        print(json.dumps({**out, "stats": stats.to_json(), "drafter": drafter.stats.to_json()}))
    else:
        wall = time.perf_counter() - started
        print(
            f"\n[{len(result.tokens)} tokens in {wall:.2f}s, {len(result.tokens) / max(wall, 1e-9):.1f} tok/s, "
            f"stop={result.stop_reason.value}, mode={params.mode.value}, D={args.draft_len}, "
            f"acceptance rate {stats.acceptance_rate:.2f}, acceptance length {stats.acceptance_length:.2f}, "
            f"target forwards {stats.target_forwards}]",
            file=sys.stderr,
        )
    return 0
