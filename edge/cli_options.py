"""Command-line options the edge shares with every command that decodes
(``splitspec generate``, ``splitspec edge run``): sampling flags and the
drafter choice. Defaults come from ``shared.params``.
"""

from __future__ import annotations

import argparse

from edge.drafter_choice import NGRAM
from shared import params as defaults
from shared.cli import non_negative_int, positive_int
from shared.params import Mode, SamplingParams

__all__ = [
    "add_sampling_args",
    "sampling_from_args",
    "window_from_args",
    "controller_from_args",
    "add_drafter_args",
    "NGRAM",
]


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
    group.add_argument("--temperature", type=float, default=defaults.DEFAULT_TEMPERATURE,
                       help=f"0 means greedy (default {defaults.DEFAULT_TEMPERATURE})")
    group.add_argument("--top-k", type=non_negative_int, default=defaults.DEFAULT_TOP_K,
                       help=f"keep the k most likely tokens (default {defaults.DEFAULT_TOP_K}, Gemma 3's recommendation; 0 = off)")
    group.add_argument("--top-p", type=float, default=defaults.DEFAULT_TOP_P,
                       help=f"nucleus sampling mass (default {defaults.DEFAULT_TOP_P}; 1.0 = off)")
    group.add_argument("--seed", type=non_negative_int, default=0, help="session seed; all randomness derives from it")
    group.add_argument("--reproducible", action="store_true",
                       help="reproducible numerics: the verifier runs this session's forwards in batch-invariant shapes, "
                       "so greedy and coupled output is bit-identical to reproducible target-only decoding (baseline "
                       "--reproducible) whatever else it batches; without it, output is exact in distribution and "
                       "identical up to float rounding, and a lone session runs faster")
    group.add_argument("--draft-len", type=non_negative_int, default=defaults.DEFAULT_DRAFT_LEN,
                       help=f"drafts per block D; 0 = target-only (default {defaults.DEFAULT_DRAFT_LEN})")
    group.add_argument("--schedule", choices=defaults.SCHEDULES, default=defaults.DEFAULT_SCHEDULE,
                       help="lockstep: one block at a time; pipelined: draft the next block while earlier ones are "
                       "verified; adaptive: pipelined, choosing the draft length and blocks in flight from measured "
                       "acceptance, drafter speed and round trips, and letting the cloud decode alone when drafting "
                       "cannot pay, from the first token on a round trip too long for any drafter "
                       f"(--draft-len and --window are then the caps; default {defaults.DEFAULT_SCHEDULE})")
    group.add_argument("--window", type=positive_int, default=defaults.DEFAULT_WINDOW,
                       help=f"pipelined: blocks in flight at most; adaptive: the most it may choose (default "
                       f"{defaults.DEFAULT_WINDOW}; the cloud may allow fewer)")
    group.add_argument("--hedge", type=non_negative_int, default=0,
                       help="hedge branches per block, greedy and coupled modes: at the least certain drafts, the "
                       "drafter's guess for the target's correction and two tokens after it, verified in the same "
                       "forward, so a rejection there need not end the round (default 0 = off; the cloud may allow fewer)")
    group.add_argument("--draft-top-k", type=positive_int, default=defaults.DEFAULT_DRAFT_TOP_K,
                       help=f"rejection mode: support of q̃ (default {defaults.DEFAULT_DRAFT_TOP_K})")
    group.add_argument("--prob-bits", type=positive_int, default=defaults.DEFAULT_PROB_BITS,
                       help=f"rejection mode: q̃ precision in bits (default {defaults.DEFAULT_PROB_BITS})")


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
        reproducible=args.reproducible,
    )


def window_from_args(args: argparse.Namespace) -> int:
    return defaults.window_for(args.schedule, args.window)


def spec_from_args(args: argparse.Namespace, controller=None):
    """The speculation the flags ask for (``--draft-len``, the schedule's window, ``--hedge``), with
    ``controller`` when the schedule is adaptive (``controller_from_args``)."""
    from edge.schedule import SpecConfig

    return SpecConfig(args.draft_len, window=window_from_args(args), hedge_width=args.hedge, controller=controller)


def controller_from_args(args: argparse.Namespace):
    """The adaptive schedule's controller, or None."""
    from edge.controller import controller_for

    return controller_for(args.schedule, args.draft_len, window_from_args(args))


def add_drafter_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("drafter")
    group.add_argument(
        "--drafter",
        default=None,
        help=f"drafter GGUF file, or '{NGRAM}' for prompt lookup (default: Gemma 3 270M Q4_K_M from PyPI)",
    )
    group.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True,
                       help="prompt lookup first (default on): where the text's last tokens occurred before (in the "
                            "prompt, the conversation or the output), propose what followed them, at no drafting "
                            "cost, and the GGUF drafter for the rest; each is used while its measured acceptance "
                            "holds up. --no-lookup: the GGUF drafter alone")
    group.add_argument("--drafter-threads", type=positive_int, default=None, help="llama.cpp threads (default: half the cores, at most 4)")
    group.add_argument("--drafter-ctx", type=positive_int, default=4096, help="llama.cpp context size (default 4096)")
