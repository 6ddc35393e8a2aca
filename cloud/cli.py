"""``splitspec-cloud serve`` (also ``splitspec cloud serve``): run the verifier service.

Exit codes: ``shared.cli``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from cloud.limits import ALL_MODES, ServiceLimits
from shared.cli import (
    MQTT_URL_FORMS,
    CliError,
    add_verbosity,
    mqtt_url,
    non_negative_float,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    run_command,
)

__all__ = ["add_cloud_commands", "build_parser", "main"]

log = logging.getLogger("splitspec.cloud")


STALE_POLICIES = ("rebase", "decode", "drop")  # --stale-blocks, most forward work first


def _stale_policy(limits: ServiceLimits) -> str:
    """The --stale-blocks name of ``limits``' stale-block policy."""
    return ("rebase" if limits.rebase_stale else "decode") if limits.decode_stale else "drop"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splitspec-cloud",
        description="The splitspec verifier service: checks edge drafts with the target model over gRPC.",
    )
    add_verbosity(parser)
    add_cloud_commands(parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


def add_cloud_commands(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve the target model as a verifier over gRPC",
        description="Verify draft blocks from edge clients with the target model. The server listens on loopback "
        "only unless --host is given (or TLS with tokens or client certificates, then 0.0.0.0). A bearer token on a non-loopback "
        "address needs TLS (--tls-cert/--tls-key) or an explicit --insecure. SIGTERM drains in-flight verdicts, "
        "then exits. Tensor parallel: start it under torchrun (torchrun --nproc-per-node N -m cloud.cli serve "
        "...); the target is sharded across the N ranks and rank 0 serves.",
    )
    serve.add_argument("--target", default=None, help="Hugging Face folder or GGUF file (default: Gemma 3 270M)")
    serve.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    serve.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                       help="target weights and activations (default: float32 on CPU, bfloat16 on GPU)")
    serve.add_argument("--host", default=None, help="listen address (default: 127.0.0.1, or 0.0.0.0 with TLS and tokens or client certificates)")
    serve.add_argument("--port", type=port_number, default=50051, help="listen port; 0 picks a free one (default 50051)")
    limits = ServiceLimits()
    serve.add_argument("--max-sessions", type=positive_int, default=limits.max_sessions,
                       help=f"concurrent sessions (default {limits.max_sessions})")
    serve.add_argument("--max-draft-len", type=positive_int, default=limits.max_draft_len,
                       help=f"largest block D accepted (default {limits.max_draft_len})")
    serve.add_argument("--max-branches", type=non_negative_int, default=limits.max_branches,
                       help=f"hedge branches a block may carry, each verified in the block's forward (default "
                       f"{limits.max_branches}; 0 turns hedging off)")
    serve.add_argument("--stale-blocks", choices=STALE_POLICIES, default=_stale_policy(limits),
                       help="what a stale block gets (one drafted past a correction the edge had not seen yet): "
                       "'rebase': the next token, decoded while no usable block of the session is pending, so a "
                       "correction costs no idle round trip, in a forward that also verifies the drafts sent "
                       "for the positions after it, where they lie, as many as cost no more than the token "
                       "alone (greedy and coupled modes, to edges that ask; rejection mode decodes the token "
                       "alone); 'decode': the token alone; with either, once no stale block is left the cloud decodes "
                       "on until the edge's next block comes (greedy and coupled modes, to edges that ask); "
                       f"'drop': an empty answer, less cloud compute per token (default {_stale_policy(limits)})")
    serve.add_argument("--modes", nargs="+", choices=ALL_MODES, default=list(limits.modes), metavar="MODE",
                       help="verification modes served, of greedy, coupled, rejection (default: all three); an Open "
                       "for another is refused with FAILED_PRECONDITION (temperature 0 is greedy in every mode)")
    serve.add_argument("--rejection-to", nargs="+", default=list(limits.rejection_to), metavar="GRANT",
                       help="whom rejection mode is served to: 'all', 'clients' (every client with a token), client "
                       "ids of --auth-tokens, or peer identities such as peer:ipv4:10.0.0.7 (default: nobody; greedy "
                       "and coupled modes are served to everyone). Its exactness rests on q̃ being the drafter's, "
                       "which a client that knows its noise can shape within --max-draft-top-k")
    serve.add_argument("--max-draft-top-k", type=positive_int, default=limits.max_draft_top_k,
                       help="rejection mode: the largest q̃ support an Open may ask for; a client that knows its "
                       "noise can push a token to min(1, K p(x)) with a uniform q̃ over K tokens, so K is the bound "
                       f"(default {limits.max_draft_top_k})")
    serve.add_argument("--max-new-tokens", type=positive_int, default=limits.max_new_tokens,
                       help=f"largest generation per session (default {limits.max_new_tokens})")
    serve.add_argument("--session-ttl", type=positive_float, default=limits.session_ttl_s,
                       help=f"seconds a parked session (its stream broke or idled) stays resumable "
                       f"(default {limits.session_ttl_s:g})")
    serve.add_argument("--max-sessions-per-client", type=positive_int, default=limits.max_sessions_per_client,
                       help="sessions one client (bearer token, else peer address) may hold, parked ones included "
                       f"(default {limits.max_sessions_per_client})")
    serve.add_argument("--idle-timeout", type=positive_float, default=limits.idle_timeout_s,
                       help="seconds a stream may go without a verdict that commits a token (stale blocks do not "
                       f"count) before its session is parked (default {limits.idle_timeout_s:g}); a full table "
                       "evicts parked sessions first")
    serve.add_argument("--max-kv-mib-per-client", type=positive_int, default=limits.max_kv_mib_per_client,
                       help="KV cache one client's sessions may reserve together, in MiB: each reserves its prompt "
                       "plus its new tokens at what a position costs this target (layers x KV heads x head size x "
                       f"2 x dtype); past it RESOURCE_EXHAUSTED (default {limits.max_kv_mib_per_client})")
    serve.add_argument("--opens-per-client", type=float, default=limits.opens_per_client_s,
                       help="new sessions (Opens, Generates) one client may start a second, after a burst of "
                       f"--open-burst-per-client (default {limits.opens_per_client_s:g}; 0: no bound): each costs "
                       "a prefill; past it RESOURCE_EXHAUSTED. Resumes and a conversation's next turn do not count")
    serve.add_argument("--open-burst-per-client", type=positive_int, default=limits.open_burst_per_client,
                       help=f"... and at once (default {limits.open_burst_per_client})")
    serve.add_argument("--min-tokens-to-keep-slot", type=int, default=limits.min_tokens_to_keep_slot,
                       help="when the table is full, an attached session that committed fewer tokens than this in "
                       "the last --idle-timeout seconds (a keep-alive block now and then) gives its slot to the new "
                       f"session and ends ABORTED; its edge reopens (default {limits.min_tokens_to_keep_slot}; 0: never)")
    serve.add_argument("--max-streams-per-client", type=positive_int, default=limits.max_streams_per_client,
                       help="Decode and Generate streams one client may have open, before its Open too (refused "
                       f"past it with RESOURCE_EXHAUSTED; default {limits.max_streams_per_client})")
    serve.add_argument("--write-timeout", type=positive_float, default=limits.write_timeout_s,
                       help="seconds a verdict or token may wait for the edge to take it (a full HTTP/2 window: the "
                       "edge stopped reading) before its stream ends, a Decode's session parked "
                       f"(default {limits.write_timeout_s:g})")
    serve.add_argument("--refusal-delay", type=non_negative_float, default=limits.refusal_delay_s,
                       help="seconds a stream refused for its credentials, a grant or room waits to be told so: a "
                       "client that retries at once is paced to a try per this per stream, and the verifier's core "
                       f"is not spent on refusals (0: at once; default {limits.refusal_delay_s:g})")
    serve.add_argument("--max-kv-tokens", type=positive_int, default=limits.max_kv_tokens,
                       help="KV cache positions all sessions may reserve; each reserves its prompt plus max new "
                            "tokens, and an Open that does not fit gets RESOURCE_EXHAUSTED "
                            f"(default {limits.max_kv_tokens})")
    serve.add_argument("--max-batch-rows", type=positive_int, default=limits.max_batch_rows,
                       help="rows one target forward packs across sessions; long prompts are prefilled in chunks "
                            f"that fill what verifies leave (default {limits.max_batch_rows})")
    serve.add_argument("--no-batching", action="store_true",
                       help="run one session's forward at a time (to measure what batching buys)")
    serve.add_argument("--shapes", choices=("auto", "canonical", "free"), default="auto",
                       help="auto (default): a forward runs canonical (batch-invariant) shapes only when one of its "
                            "sessions asked to be reproducible (the Open's reproducible; an OpenAI request with a seed), "
                            "so a lone session that did not runs at full speed; canonical: every forward padded (every "
                            "session's logits bit-identical alone or in any batch); free: never padded (reproducible "
                            "sessions are refused with FAILED_PRECONDITION)")
    serve.add_argument("--auth-token-file", type=Path, default=None,
                       help="require 'authorization: Bearer <token>' with the token in this file (every holder is "
                            "one client: one share of every per-client bound)")
    serve.add_argument("--auth-tokens", type=Path, default=None,
                       help="require a bearer token of one of the clients in this file: one 'client-id token' (or "
                            "'client-id sha256:<hex>') per line, '#' comments; the client id is the identity for "
                            "every per-client bound, share and resume. Read again on SIGHUP. Without either flag "
                            "a client is its peer's address"),
    serve.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate (with --tls-key)")
    serve.add_argument("--tls-key", type=Path, default=None, help="PEM private key (with --tls-cert)")
    serve.add_argument("--tls-client-ca", type=Path, default=None,
                       help="mutual TLS: refuse a connection without a client certificate this PEM CA signed; a "
                       "stream without a bearer token is then the client its certificate's common name says (the "
                       "identity for every per-client bound, share and --rejection-to grant)")
    serve.add_argument("--insecure", action="store_true",
                       help="accept --auth-token-file without TLS on a non-loopback --host: the token then crosses "
                       "the network in cleartext, readable by anyone on the path (splitspec-edge itself refuses to send a "
                       "token off loopback without TLS); likewise metrics on a non-loopback --metrics-host without TLS")
    serve.add_argument("--metrics-port", type=port_number, default=None, help="serve Prometheus metrics on this port")
    serve.add_argument("--metrics-host", default="127.0.0.1",
                       help="address the metrics listen on (default 127.0.0.1, whatever --host says); off loopback "
                       "they are served over HTTPS with --tls-cert/--tls-key, and refused without them unless "
                       "--insecure")
    serve.add_argument("--mqtt", type=mqtt_url, default=None, metavar="URL",
                       help="publish this replica's status and load to an MQTT broker ("
                       + MQTT_URL_FORMS + ")")
    serve.add_argument("--replica", default=None,
                       help="this replica's name on MQTT and to edges (default: HOSTNAME-PORT)")
    serve.add_argument("--grace", type=non_negative_float, default=10.0, help="seconds in-flight calls get on shutdown (default 10)")
    serve.set_defaults(func=run_serve)


def read_file(path: Path | None, what: str) -> bytes | None:
    """``path``'s bytes (None: no path); FileNotFoundError naming ``what`` for a path that is no file."""
    if path is None:
        return None
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path.read_bytes()


def read_secret(path: Path | None, what: str) -> str | None:
    """``path``'s text, stripped (None: no path); ValueError for an empty one."""
    data = read_file(path, what)
    if data is None:
        return None
    value = data.decode().strip()
    if not value:
        raise ValueError(f"{what} {path} is empty")
    return value


def run_serve(args: argparse.Namespace) -> int:
    from cloud.engine import NotRowInvariant, pick_device
    from cloud.identity import Credentials
    from cloud.models import resolve_target
    from cloud.server import ServerConfig

    token = read_secret(args.auth_token_file, "auth token file")
    if token and args.auth_tokens:
        raise CliError("--auth-token-file and --auth-tokens are alternatives: give one", exit_code=2)
    if args.auth_tokens is not None and not args.auth_tokens.is_file():
        raise CliError(f"auth tokens file not found: {args.auth_tokens}", exit_code=2)
    credentials = Credentials.from_file(args.auth_tokens) if args.auth_tokens else None
    verified = token or credentials or args.tls_client_ca  # clients prove who they are: listen beyond loopback
    host = args.host or ("0.0.0.0" if verified and args.tls_cert else "127.0.0.1")
    config = ServerConfig(
        host=host,
        port=args.port,
        limits=ServiceLimits(
            max_sessions=args.max_sessions,
            max_draft_len=args.max_draft_len,
            max_branches=args.max_branches,
            decode_stale=args.stale_blocks != "drop",
            rebase_stale=args.stale_blocks == "rebase",
            session_ttl_s=args.session_ttl,
            max_sessions_per_client=args.max_sessions_per_client,
            idle_timeout_s=args.idle_timeout,
            min_tokens_to_keep_slot=args.min_tokens_to_keep_slot,
            opens_per_client_s=args.opens_per_client,
            max_kv_mib_per_client=args.max_kv_mib_per_client,
            open_burst_per_client=args.open_burst_per_client,
            write_timeout_s=args.write_timeout,
            refusal_delay_s=args.refusal_delay,
            max_streams_per_client=args.max_streams_per_client,
            max_new_tokens=args.max_new_tokens,
            max_batch_rows=args.max_batch_rows,
            max_kv_tokens=args.max_kv_tokens,
            modes=tuple(args.modes),
            max_draft_top_k=args.max_draft_top_k,
            rejection_to=tuple(args.rejection_to),
        ),
        batching=not args.no_batching,
        auth_token=token,
        credentials=credentials,
        tls_cert=read_file(args.tls_cert, "TLS certificate"),
        tls_key=read_file(args.tls_key, "TLS key"),
        tls_client_ca=read_file(args.tls_client_ca, "TLS client CA file"),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        grace_s=args.grace,
        insecure=args.insecure,
        replica=args.replica or "",
        mqtt_url=args.mqtt,
    )

    from cloud.tensor_parallel import follow, load_engine, rank

    pick_device(args.device)  # a bad --device fails before a minute of model loading
    target = resolve_target(args.target)
    try:
        engine = load_engine(target, device=args.device, dtype=args.dtype, shapes=args.shapes)
    except NotRowInvariant:  # --shapes canonical on a device that cannot keep its promise: bad input, as it says
        raise
    except Exception as exc:  # a truncated or foreign checkpoint (safetensors raises its own type), a bad config
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(f"cannot load the target model from {target}: {detail}") from exc
    if rank() != 0:  # tensor parallelism: rank 0 serves, the others run its forwards on their shards
        follow(engine)
        return 0
    try:
        asyncio.run(_serve(engine, config))
    except OSError as exc:  # the port is taken
        raise CliError(str(exc)) from exc
    finally:
        engine.close()
    return 0


async def _serve(engine, config) -> None:
    from cloud.server import VerifierServer

    server = VerifierServer(engine, config)
    port = await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    if config.credentials is not None:  # a client added or revoked without a restart
        loop.add_signal_handler(signal.SIGHUP, config.credentials.reload)
    # One line on stdout that scripts can wait for.
    print(f"splitspec cloud: serving {engine.model_name} on {config.host}:{port}", flush=True)
    await stopping.wait()
    log.warning("shutting down: draining in-flight calls for up to %.0fs", config.grace_s)
    await server.stop()
    print("splitspec cloud: stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
