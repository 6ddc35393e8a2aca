"""Command-line options the edge shares with every command that decodes
(``splitspec generate``, ``splitspec edge run``): sampling flags, the drafter
choice, and streaming text to a terminal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from shared.params import Mode, SamplingParams

__all__ = ["add_sampling_args", "sampling_from_args", "add_drafter_args", "non_negative_int", "positive_int", "TextStream"]

NGRAM = "ngram"


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--prompt", required=True, help="prompt text (tokenized on the edge, BOS added)")
    group.add_argument("--max-new-tokens", type=positive_int, default=128, help="stop after this many tokens (default 128)")
    group.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=None,
        help="verification mode; default: coupled when temperature > 0, else greedy",
    )
    group.add_argument("--temperature", type=float, default=0.7, help="0 means greedy (default 0.7)")
    group.add_argument("--top-k", type=non_negative_int, default=64,
                       help="keep the k most likely tokens (default 64, Gemma 3's recommendation; 0 = off)")
    group.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95; 1.0 = off)")
    group.add_argument("--seed", type=non_negative_int, default=0, help="session seed; all randomness derives from it")
    group.add_argument("--draft-len", type=non_negative_int, default=8, help="drafts per block D; 0 = target-only (default 8)")
    group.add_argument("--draft-top-k", type=positive_int, default=16, help="rejection mode: support of q̃ (default 16)")
    group.add_argument("--prob-bits", type=positive_int, default=8, help="rejection mode: q̃ precision in bits (default 8)")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    mode = args.mode or (Mode.GREEDY if args.temperature == 0 else Mode.COUPLED)
    return SamplingParams(
        mode=Mode(mode),
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        draft_top_k=args.draft_top_k,
        prob_bits=args.prob_bits,
    )


def add_drafter_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("drafter")
    group.add_argument(
        "--drafter",
        default=None,
        help=f"drafter GGUF file, or '{NGRAM}' for prompt lookup (default: Gemma 3 270M Q4_K_M from PyPI)",
    )
    group.add_argument("--drafter-threads", type=positive_int, default=None, help="llama.cpp threads (default: half the cores, at most 4)")
    group.add_argument("--drafter-ctx", type=positive_int, default=4096, help="llama.cpp context size (default 4096)")


class TextStream:
    """Prints decoded text as tokens are committed, never re-printing a character."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str], out=sys.stdout) -> None:
        self._detokenize = detokenize
        self._out = out
        self._tokens: list[int] = []
        self._printed = 0

    def __call__(self, tokens: Sequence[int]) -> None:
        self._tokens.extend(tokens)
        text = self._detokenize(self._tokens)
        if len(text) > self._printed:
            self._out.write(text[self._printed :])
            self._out.flush()
            self._printed = len(text)
