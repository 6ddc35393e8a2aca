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

    from sim.fixtures.drafter_ladder import QUANT_TYPES

    quant = commands.add_parser(
        "quantize",
        help="make a weaker drafter: requantize a GGUF with llama.cpp's own quantizer",
        description="Requantize a GGUF (default: the Gemma 3 270M Q4_K_M drafter) to another llama.cpp type, so "
        "acceptance can be measured with drafters weaker than the one that drafts for itself. Rows that do not "
        "divide into the type's blocks fall back to q4_0/q5_0. Prints the result as JSON.",
    )
    quant.add_argument("--type", required=True, choices=sorted(QUANT_TYPES), help="llama.cpp quantization type")
    quant.add_argument("--out", required=True, help="GGUF file to write")
    quant.add_argument("--source", default=None, help="GGUF to requantize (default: Gemma 3 270M Q4_K_M from PyPI)")
    quant.set_defaults(func=run_quantize)


def run_tiny(args: argparse.Namespace) -> int:
    from sim.fixtures.tiny_models import write_tiny_models

    print(json.dumps(write_tiny_models(args.out, seed=args.seed), indent=2))
    return 0


def run_quantize(args: argparse.Namespace) -> int:
    from shared.models import default_gguf_path
    from sim.fixtures.drafter_ladder import quantize

    print(json.dumps(quantize(args.source or default_gguf_path(), args.out, args.type), indent=2))
    return 0
