"""``splitspec edge ...``: generate on the device against a cloud verifier.

``edge run`` is split decoding; ``edge baseline`` asks the cloud to decode
every token itself (what split decoding is measured against).
"""

from __future__ import annotations

import argparse
import json
import sys
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
    _add_cloud_args(run)
    add_drafter_args(run)
    add_sampling_args(run)
    run.set_defaults(func=run_edge)

    baseline = commands.add_parser(
        "baseline",
        help="cloud-only decoding: the cloud generates every token and streams it down",
        description="The baseline split decoding is compared with. Uses the drafter GGUF only for its tokenizer.",
    )
    _add_cloud_args(baseline)
    add_drafter_args(baseline)
    add_sampling_args(baseline)
    baseline.set_defaults(func=run_baseline)


def _add_cloud_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cloud")
    group.add_argument("--cloud", default="127.0.0.1:50051", help="verifier address HOST:PORT (default 127.0.0.1:50051)")
    group.add_argument("--auth-token-file", type=Path, default=None, help="bearer token for the verifier")
    group.add_argument("--tls-ca", type=Path, default=None, help="PEM CA certificate: connect with TLS and trust this CA")
    group.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to reach the cloud (default 10)")
    group.add_argument("--verdict-timeout", type=float, default=120.0, help="seconds to wait for any one answer (default 120)")
    parser.add_argument("--json", action="store_true", help="print tokens, text and stats (with bytes and RTT) as JSON")
    parser.add_argument("--timings", action="store_true", help="in the JSON: per-block cloud times and bytes")
    parser.add_argument("--json-file", type=Path, default=None, help="also write that JSON to this file (text still streams)")


def _cloud_options(args: argparse.Namespace) -> dict:
    from edge.loading import NGRAM

    if args.drafter == NGRAM:
        raise ValueError("the edge needs a GGUF drafter (it also tokenizes the prompt); 'ngram' is for generate")
    for path, what in ((args.tls_ca, "TLS CA file"), (args.auth_token_file, "auth token file")):
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"{what} not found: {path}")
    return {
        "auth_token": args.auth_token_file.read_text().strip() if args.auth_token_file else None,
        "root_certificates": args.tls_ca.read_bytes() if args.tls_ca else None,
        "connect_timeout_s": args.connect_timeout,
    }


def _emit_json(args: argparse.Namespace, out: dict) -> bool:
    """Write the result where asked; True when stdout got the JSON (no human summary then)."""
    if args.json_file is not None:
        args.json_file.write_text(json.dumps(out))
    if args.json:
        print(json.dumps(out))
    return args.json


def _summary(n_tokens: int, wall: float, extra: str) -> None:
    print(f"\n[{n_tokens} tokens in {wall:.2f}s ({n_tokens / max(wall, 1e-9):.1f} tok/s), {extra}]", file=sys.stderr)


def run_edge(args: argparse.Namespace) -> int:
    from edge.client import GrpcLink, LinkError
    from edge.decode_loop import run_decode
    from edge.loading import open_llama_drafter
    from edge.options import TextStream, sampling_from_args
    from shared.errors import CliError

    options = _cloud_options(args)
    params = sampling_from_args(args)
    drafter = open_llama_drafter(args.drafter, n_threads=args.drafter_threads, n_ctx=args.drafter_ctx)
    vocab = drafter.vocab
    prompt = vocab.tokenize(args.prompt)
    link = GrpcLink(
        args.cloud,
        vocab_size=vocab.size,
        fingerprint=vocab.fingerprint,
        model_name=drafter.model_name,
        verdict_timeout_s=args.verdict_timeout,
        **options,
    )
    try:
        link.connect()  # connection setup is not part of the generation's time, as for the baseline
        result = run_decode(
            drafter,
            link,
            prompt,
            params,
            max_new_tokens=args.max_new_tokens,
            draft_len=args.draft_len,
                on_tokens=None if args.json else TextStream(vocab.detokenize),
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
        prompt_tokens=len(prompt),
        drafter_s=round(drafter.draft_s, 4),
        drafter_eval_s=round(drafter.eval_s, 4),
        drafter_prompt_s=round(drafter.prompt_eval_s, 4),
        open_s=round(link.open_s, 4),
    )
    out = {"tokens": result.tokens, "text": vocab.detokenize(result.tokens), "stats": stats}
    if args.timings:
        out["blocks"] = [
            {"forward_tokens": n, "cloud_s": round(s, 6), "up_bytes": up, "down_bytes": down}
            for n, s, up, down in link.block_log
        ]
    if _emit_json(args, out):
        return 0
    n = max(len(result.tokens), 1)
    _summary(
        len(result.tokens),
        result.stats.wall_s,
        f"stop={result.stop_reason.value}, mode={params.mode.value}, D={args.draft_len}, "
        f"acceptance rate {stats['acceptance_rate']:.2f}, acceptance length {stats['acceptance_length']:.2f}, "
        f"up {link.bytes_up / n:.1f} B/tok, down {link.bytes_down / n:.1f} B/tok, rtt {link.rtt_ms:.1f} ms",
    )
    return 0


def run_baseline(args: argparse.Namespace) -> int:
    from edge.client import LinkError, cloud_only_generate
    from edge.gguf_vocab import GgufVocab
    from edge.options import TextStream, sampling_from_args
    from shared.errors import CliError
    from shared.models import default_gguf_path

    options = _cloud_options(args)
    params = sampling_from_args(args)
    vocab = GgufVocab.open(args.drafter or default_gguf_path())
    prompt = vocab.tokenize(args.prompt)
    try:
        result = cloud_only_generate(
            args.cloud,
            prompt,
            params,
            vocab_size=vocab.size,
            fingerprint=vocab.fingerprint,
            max_new_tokens=args.max_new_tokens,
            timeout_s=args.verdict_timeout * args.max_new_tokens,
            on_tokens=None if args.json else TextStream(vocab.detokenize),
            **options,
        )
    except LinkError as exc:
        raise CliError(str(exc)) from exc
    stats = {
        "generated": len(result.tokens),
        "wall_s": round(result.wall_s, 4),
        "ttft_s": round(result.ttft_s, 4),
        "bytes_up": result.bytes_up,
        "bytes_down": result.bytes_down,
        "prompt_tokens": len(prompt),
    }
    out = {"tokens": result.tokens, "text": vocab.detokenize(result.tokens), "stats": stats}
    if args.timings:
        out["blocks"] = [{"forward_tokens": 1, "cloud_s": round(s, 6), "down_bytes": b} for s, b in result.chunk_log]
    if _emit_json(args, out):
        return 0
    _summary(len(result.tokens), result.wall_s, f"cloud-only, stop={result.stop_reason.value}, ttft {result.ttft_s:.2f}s")
    return 0
