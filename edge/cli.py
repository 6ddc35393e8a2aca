"""``splitspec edge run``: generate on the device against a cloud verifier."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["add_edge_commands"]


def add_edge_commands(commands) -> None:
    from edge.options import add_drafter_args, add_sampling_args

    run = commands.add_parser(
        "run",
        help="draft on this device, verify in the cloud, stream the text",
        description="Drafts blocks with llama.cpp and has the cloud verifier accept or correct them over one gRPC "
        "stream. Output equals the target model's own (token for token in greedy and coupled modes).",
    )
    run.add_argument("--cloud", default="127.0.0.1:50051", help="verifier address HOST:PORT (default 127.0.0.1:50051)")
    add_drafter_args(run)
    add_sampling_args(run)
    run.add_argument("--auth-token-file", type=Path, default=None, help="bearer token for the verifier")
    run.add_argument("--tls-ca", type=Path, default=None, help="PEM CA certificate: connect with TLS and trust this CA")
    run.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to reach the cloud (default 10)")
    run.add_argument("--verdict-timeout", type=float, default=120.0, help="seconds to wait for any one verdict (default 120)")
    run.add_argument("--json", action="store_true", help="print tokens, text and stats (with bytes and RTT) as JSON")
    run.set_defaults(func=run_edge)


def run_edge(args: argparse.Namespace) -> int:
    from edge.client import GrpcLink, LinkError
    from edge.decode_loop import run_decode
    from edge.loading import NGRAM, open_llama_drafter
    from edge.options import TextStream, sampling_from_args
    from shared.errors import CliError
    from shared.vocab import vocab_fingerprint

    if args.drafter == NGRAM:
        raise ValueError("edge run needs a GGUF drafter (it also tokenizes the prompt); 'ngram' is for generate")
    if args.tls_ca is not None and not args.tls_ca.is_file():
        raise FileNotFoundError(f"TLS CA file not found: {args.tls_ca}")
    token = None
    if args.auth_token_file is not None:
        if not args.auth_token_file.is_file():
            raise FileNotFoundError(f"auth token file not found: {args.auth_token_file}")
        token = args.auth_token_file.read_text().strip()
    params = sampling_from_args(args)
    drafter = open_llama_drafter(args.drafter, n_threads=args.drafter_threads, n_ctx=args.drafter_ctx)
    prompt = drafter.tokenize(args.prompt)
    detokenize = lambda ids: drafter.detokenize(ids).decode("utf-8", "ignore")  # noqa: E731
    link = GrpcLink(
        args.cloud,
        vocab_size=drafter.vocab_size,
        fingerprint=vocab_fingerprint(drafter.vocab_pieces()),
        model_name=drafter.model_name,
        auth_token=token,
        root_certificates=args.tls_ca.read_bytes() if args.tls_ca else None,
        connect_timeout_s=args.connect_timeout,
        verdict_timeout_s=args.verdict_timeout,
    )
    stream = None if args.json else TextStream(detokenize)
    started = time.perf_counter()
    try:
        result = run_decode(
            drafter, link, prompt, params, max_new_tokens=args.max_new_tokens, draft_len=args.draft_len, on_tokens=stream
        )
    except LinkError as exc:
        raise CliError(str(exc)) from exc
    finally:
        drafter.close()
    stats = result.stats.to_dict()
    stats.update(
        bytes_up=link.bytes_up,
        bytes_down=link.bytes_down,
        rtt_ms=round(link.rtt_ms, 3),
        ttft_s=round(result.ttft_s, 4),
        drafter_eval_s=round(drafter.eval_s, 4),
    )
    if args.json:
        print(json.dumps({"tokens": result.tokens, "text": detokenize(result.tokens), "stats": stats}))
        return 0
    wall = time.perf_counter() - started
    n = max(len(result.tokens), 1)
    print(
        f"\n[{len(result.tokens)} tokens in {wall:.2f}s ({len(result.tokens) / max(wall, 1e-9):.1f} tok/s), stop={result.stop_reason.value}, "
        f"mode={params.mode.value}, D={args.draft_len}, acceptance rate {stats['acceptance_rate']:.2f}, "
        f"acceptance length {stats['acceptance_length']:.2f}, up {link.bytes_up / n:.1f} B/tok, down {link.bytes_down / n:.1f} B/tok, "
        f"rtt {link.rtt_ms:.1f} ms]",
        file=sys.stderr,
    )
    return 0
