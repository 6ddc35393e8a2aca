"""``splitspec cloud serve``: run the verifier service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

__all__ = ["add_cloud_commands"]

log = logging.getLogger("splitspec.cloud")


def add_cloud_commands(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve the target model as a verifier over gRPC",
        description="Verify draft blocks from edge clients with the target model. Without --auth-token-file the "
        "server listens on loopback only, unless --host is given. SIGTERM drains in-flight verdicts, then exits.",
    )
    serve.add_argument("--target", default=None, help="Hugging Face folder or GGUF file (default: Gemma 3 270M)")
    serve.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    serve.add_argument("--host", default=None, help="listen address (default: 127.0.0.1, or 0.0.0.0 with --auth-token-file)")
    serve.add_argument("--port", type=int, default=50051, help="listen port; 0 picks a free one (default 50051)")
    serve.add_argument("--max-sessions", type=int, default=64, help="concurrent sessions (default 64)")
    serve.add_argument("--max-draft-len", type=int, default=32, help="largest block D accepted (default 32)")
    serve.add_argument("--max-new-tokens", type=int, default=4096, help="largest generation per session (default 4096)")
    serve.add_argument("--session-ttl", type=float, default=120.0, help="seconds a broken or idle session is kept (default 120)")
    serve.add_argument("--auth-token-file", type=Path, default=None, help="require 'authorization: Bearer <token>' from this file")
    serve.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate (with --tls-key)")
    serve.add_argument("--tls-key", type=Path, default=None, help="PEM private key (with --tls-cert)")
    serve.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    serve.add_argument("--grace", type=float, default=10.0, help="seconds in-flight calls get on shutdown (default 10)")
    serve.set_defaults(func=run_serve)


def read_secret(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    value = path.read_text().strip()
    if not value:
        raise ValueError(f"{what} {path} is empty")
    return value


def run_serve(args: argparse.Namespace) -> int:
    from cloud.engine import TargetEngine
    from cloud.models import resolve_target
    from cloud.server import ServerConfig
    from cloud.servicer import ServiceLimits

    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    token = read_secret(args.auth_token_file, "auth token file")
    for flag, value in (("--max-sessions", args.max_sessions), ("--max-draft-len", args.max_draft_len), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    host = args.host or ("0.0.0.0" if token else "127.0.0.1")
    config = ServerConfig(
        host=host,
        port=args.port,
        limits=ServiceLimits(
            max_sessions=args.max_sessions,
            max_draft_len=args.max_draft_len,
            session_ttl_s=args.session_ttl,
            max_new_tokens=args.max_new_tokens,
        ),
        auth_token=token,
        tls_cert=args.tls_cert.read_bytes() if args.tls_cert else None,
        tls_key=args.tls_key.read_bytes() if args.tls_key else None,
        metrics_port=args.metrics_port,
        grace_s=args.grace,
    )
    engine = TargetEngine(resolve_target(args.target), device=args.device)
    asyncio.run(_serve(engine, config))
    return 0


async def _serve(engine, config) -> None:
    from cloud.server import VerifierServer

    server = VerifierServer(engine, config)
    port = await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    # One line on stdout that scripts can wait for.
    print(f"splitspec cloud: serving {engine.model_name} on {config.host}:{port}", flush=True)
    await stopping.wait()
    log.warning("shutting down: draining in-flight calls for up to %.0fs", config.grace_s)
    await server.stop()
    print("splitspec cloud: stopped", flush=True)
