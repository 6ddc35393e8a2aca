"""``splitspec models``: make models for tests and trials."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_models_commands"]


def add_models_commands(commands) -> None:
    tiny = commands.add_parser(
        "tiny",
        help="write tiny deterministic models (HF target + F32/Q8_0/noisy GGUF drafters)",
        description="Write DIR/target (Hugging Face folder), DIR/drafter-f32.gguf, DIR/drafter-q8_0.gguf and "
        "DIR/drafter-noisy.gguf, the same seed giving the same files; prints their paths as JSON.",
    )
    tiny.add_argument("--out", required=True, help="output folder")
    tiny.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    tiny.set_defaults(func=run_tiny)


def run_tiny(args: argparse.Namespace) -> int:
    from sim.fixtures.tiny_models import write_tiny_models

    print(json.dumps(write_tiny_models(args.out, seed=args.seed), indent=2))
    return 0
