"""What the bench commands share: the product's logit-processing flags, the modes, JSON output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shared.cli import non_negative_int
from shared.params import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, Mode

__all__ = ["MODES", "add_logit_processing", "write_json"]

MODES = [mode.value for mode in Mode]


def add_logit_processing(parser: argparse.ArgumentParser, applies: str) -> None:
    """--temperature/--top-k/--top-p with the product defaults; ``applies`` prefixes each help."""
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                        help=f"{applies}sampling temperature (default %(default)s)")
    parser.add_argument("--top-k", type=non_negative_int, default=DEFAULT_TOP_K,
                        help=f"{applies}top-k, as in edge run (default %(default)s; 0 = off)")
    parser.add_argument("--top-p", type=float, default=DEFAULT_TOP_P,
                        help=f"{applies}top-p, as in edge run (default %(default)s; 1.0 = off)")


def write_json(report: dict, out: Path | None) -> int:
    """``report`` as JSON into ``out`` (None: stdout); exit code 0."""
    text = json.dumps(report, indent=1)
    if out is not None:
        out.write_text(text + "\n")
    else:
        print(text)
    return 0
