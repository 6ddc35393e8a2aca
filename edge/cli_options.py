"""Command-line options the edge shares with every command that decodes
(``splitspec generate``, ``splitspec edge run``): sampling flags and the
drafter choice; and the verifier's address and credentials (``edge run``, ``serve``, ``baseline``). Defaults come from ``shared.params``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edge.drafter_choice import NGRAM
from shared import params as defaults
from shared.cli import host_port, non_negative_int, positive_float, positive_int
from shared.params import Mode, SamplingParams

__all__ = [
    "add_sampling_args",
    "sampling_from_args",
    "window_from_args",
    "controller_from_args",
    "add_drafter_args",
    "add_cloud_args",
    "cloud_options",
    "target_fingerprint",
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
    group.add_argument("--window", type=positive_int, default=None,
                       help=f"pipelined: blocks in flight at most (default {defaults.DEFAULT_WINDOW}); adaptive: the "
                       f"most it may choose (default: as many as the cloud verifies in a round trip, at least "
                       f"{defaults.DEFAULT_WINDOW}); the cloud may allow fewer")
    add_speculation_args(group)
    group.add_argument("--draft-top-k", type=positive_int, default=defaults.DEFAULT_DRAFT_TOP_K,
                       help=f"rejection mode: support of q̃ (default {defaults.DEFAULT_DRAFT_TOP_K})")
    group.add_argument("--prob-bits", type=positive_int, default=defaults.DEFAULT_PROB_BITS,
                       help=f"rejection mode: q̃ precision in bits (default {defaults.DEFAULT_PROB_BITS})")


def add_speculation_args(group) -> None:
    """``--hedge`` and ``--speculation-cache`` (``edge run``'s and ``edge serve``'s alike) on ``group``."""
    group.add_argument("--hedge", type=non_negative_int, default=0,
                       help="hedge branches per block, greedy and coupled modes: at the least certain drafts, the "
                       "drafter's guess for the target's correction and two tokens after it, verified in the same "
                       "forward, so a rejection there need not end the round (default 0 = off; the cloud may allow fewer)")
    group.add_argument("--speculation-cache", action="store_true",
                       help="greedy and coupled modes, blocks in flight: while a block is verified, draft the block "
                       "that would follow the target's likeliest correction of it (the drafter's runner-up where the "
                       "block most likely fails), so that when the verdict corrects there the next block leaves at "
                       "once instead of after a block's drafting (default off)")


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
    """The speculation the flags ask for (``--draft-len``, the schedule's window, ``--hedge``,
    ``--speculation-cache``), with ``controller`` when the schedule is adaptive (``controller_from_args``)."""
    from edge.schedule import SpecConfig

    return SpecConfig(args.draft_len, window=window_from_args(args), hedge_width=args.hedge, controller=controller,
                      speculation_cache=args.speculation_cache)


def controller_from_args(args: argparse.Namespace):
    """The adaptive schedule's controller, or None."""
    from edge.controller import controller_for

    return controller_for(args.schedule, args.draft_len, args.window)


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


def add_cloud_args(parser: argparse.ArgumentParser, report_flags: bool = True) -> None:
    """The verifier's address and how to reach it (``cloud_options`` reads them), and with ``report_flags``
    the report's."""
    group = parser.add_argument_group("cloud")
    group.add_argument("--cloud", type=host_port, default="127.0.0.1:50051",
                       help="verifier address HOST:PORT (default 127.0.0.1:50051)")
    group.add_argument("--auth-token-file", type=Path, default=None, help="bearer token for the verifier")
    group.add_argument("--tls-ca", type=Path, default=None, help="PEM CA certificate: connect with TLS and trust this CA")
    group.add_argument("--tls-client-cert", type=Path, default=None,
                       help="PEM client certificate (with --tls-client-key and --tls-ca) for a verifier that requires "
                       "one (mutual TLS): its common name is this edge's identity there")
    group.add_argument("--tls-client-key", type=Path, default=None, help="... and its PEM private key")
    group.add_argument("--connect-timeout", type=positive_float, default=10.0, help="seconds to reach the cloud (default 10)")
    group.add_argument("--verdict-timeout", type=positive_float, default=120.0, help="seconds to wait for any one answer (default 120)")
    group.add_argument("--pin-target", type=target_fingerprint, default=None, metavar="HEX",
                       help="refuse a verifier whose target weights are not these (the `target` a report records, "
                       "e.g. baseline --reproducible --json): a reproducible session is then bit-identical to that "
                       "baseline, or refused, never silently served by a swapped checkpoint")
    if not report_flags:
        return
    parser.add_argument("--json", action="store_true", help="print tokens, text and stats (with bytes and RTT) as JSON")
    parser.add_argument("--timings", action="store_true", help="in the JSON: per-block cloud times and bytes")
    parser.add_argument("--json-file", type=Path, default=None, help="also write that JSON to this file (text still streams)")


def cloud_options(args: argparse.Namespace) -> dict:
    """``edge.endpoint.VerifierEndpoint``'s keyword arguments from ``add_cloud_args``' flags (files read);
    ValueError or FileNotFoundError for flags that do not go together or files that are not there."""
    if args.drafter == NGRAM:
        raise ValueError("the edge needs a GGUF drafter (it also tokenizes the prompt); 'ngram' is for generate")
    for path, what in ((args.tls_ca, "TLS CA file"), (args.auth_token_file, "auth token file"),
                       (args.tls_client_cert, "TLS client certificate"), (args.tls_client_key, "TLS client key")):
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"{what} not found: {path}")
    if (args.tls_client_cert is None) != (args.tls_client_key is None):
        raise ValueError("--tls-client-cert and --tls-client-key go together")
    if args.tls_client_cert is not None and args.tls_ca is None:
        raise ValueError("--tls-client-cert is shown over TLS: give the verifier's CA with --tls-ca")
    client = (args.tls_client_cert.read_bytes(), args.tls_client_key.read_bytes()) if args.tls_client_cert else None
    return {
        "auth_token": args.auth_token_file.read_text().strip() if args.auth_token_file else None,
        "root_certificates": args.tls_ca.read_bytes() if args.tls_ca else None,
        "client_certificate": client,
        "connect_timeout_s": args.connect_timeout,
        "pinned_target": args.pin_target,
    }


def target_fingerprint(text: str) -> bytes:
    """``--pin-target``'s value: 16 bytes from 32 hex digits."""
    try:
        value = bytes.fromhex(text)
    except ValueError:
        value = b""
    if len(value) != 16:
        raise argparse.ArgumentTypeError(f"a target fingerprint is 32 hex digits (a report's `target`), got {text!r}")
    return value
