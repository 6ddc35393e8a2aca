"""``splitspec-edge`` (also ``splitspec edge``): generate on the device against a cloud verifier.

``run`` is split decoding; ``baseline`` asks the cloud to decode every token
itself (what split decoding is measured against). Never imports ``sim`` or
torch: a device installs only the ``edge`` extra. Exit codes: ``shared.cli``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shared.cli import (
    MQTT_URL_FORMS,
    add_verbosity,
    mqtt_url,
    non_negative_float,
    port_number,
    positive_float,
    positive_int,
    run_command,
)
from shared.params import DEFAULT_DRAFT_LEN, DEFAULT_SCHEDULE, DEFAULT_WINDOW, SCHEDULES

if TYPE_CHECKING:
    from edge.serving import ServeConfig

__all__ = ["add_edge_commands", "build_parser", "main", "serve_config"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splitspec-edge",
        description="The splitspec client device: draft with llama.cpp, verify in the cloud, output identical "
        "to the target model alone.",
    )
    add_verbosity(parser)
    add_edge_commands(parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


def add_edge_commands(commands) -> None:
    from edge.cli_options import add_cloud_args, add_drafter_args, add_sampling_args, add_speculation_args

    run = commands.add_parser(
        "run",
        help="draft on this device, verify in the cloud, stream the text",
        description="Drafts blocks with llama.cpp and has the cloud verifier accept or correct them over one gRPC "
        "stream. Output equals the target model's own (token for token in greedy and coupled modes).",
    )
    add_cloud_args(run)
    _add_fleet_args(run)
    run.add_argument("--outage-budget", type=non_negative_float, default=30.0,
                     help="seconds a broken link may take to come back: the edge reconnects with backoff and "
                     "resumes its session (or reopens it on the tokens committed so far), output unchanged; past "
                     "this it stops with the tokens so far (default 30; 0 = a cut ends the generation)")
    add_drafter_args(run)
    add_sampling_args(run)
    run.set_defaults(func=run_edge)

    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible local server: chat and text completions, split decoding behind it",
        description="Serves POST /v1/chat/completions and /v1/completions (streaming or not), GET /v1/models, "
        "/health and /metrics on this device. Each request is drafted here and verified by the cloud, so the "
        "output is the target model's; a conversation keeps its cloud session between requests and uploads "
        "only what each turn adds. One generation runs at a time; others wait, up to --max-waiting.",
    )
    add_cloud_args(serve, report_flags=False)
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1: this device only)")
    serve.add_argument("--port", type=port_number, default=8080, help="listen port (default 8080)")
    serve.add_argument("--api-key-file", type=Path, default=None,
                       help="require 'Authorization: Bearer <key>' (the key in this file) on /v1/*; needed (with "
                            "--tls-cert/--tls-key) to listen on anything but loopback")
    serve.add_argument("--tls-cert", type=Path, default=None, help="serve HTTPS with this PEM certificate (and --tls-key)")
    serve.add_argument("--tls-key", type=Path, default=None, help="... and this PEM private key")
    serve.add_argument("--insecure", action="store_true",
                       help="listen off loopback without an API key, or with one in cleartext (a trusted network only)")
    serve.add_argument("--chat-format", default=None,
                       help="chat template: 'gguf' (the model's own) or a llama-cpp-python format name (gemma, "
                       "chatml, llama-2, llama-3, mistral-instruct, qwen, zephyr); default: the GGUF's own, else gemma")
    serve.add_argument("--fallback", choices=["error", "local"], default="error",
                       help="when the cloud is unreachable: 'error' answers 503, 'local' answers from the drafter "
                       "alone and says so (header X-Splitspec-Served-By, field splitspec_served_by) (default error)")
    serve.add_argument("--outage-budget", type=non_negative_float, default=30.0,
                       help="seconds a broken link may take to come back mid-generation (default 30)")
    _add_fleet_args(serve)
    serve.add_argument("--max-waiting", type=positive_int, default=8,
                       help="requests that may wait for the drafter; more get 429 (default 8)")
    serve.add_argument("--draft-len", type=positive_int, default=DEFAULT_DRAFT_LEN,
                       help=f"drafts per block D (default {DEFAULT_DRAFT_LEN})")
    serve.add_argument("--schedule", choices=SCHEDULES, default=DEFAULT_SCHEDULE,
                       help=f"edge schedule (default {DEFAULT_SCHEDULE}; see `run --help`)")
    serve.add_argument("--window", type=positive_int, default=None,
                       help=f"pipelined: blocks in flight at most (default {DEFAULT_WINDOW}); adaptive: the most it may "
                       "choose (default: as many as the cloud verifies in a round trip, at least that)")
    add_speculation_args(serve)
    add_drafter_args(serve)
    serve.set_defaults(func=run_serve)

    baseline = commands.add_parser(
        "baseline",
        help="cloud-only decoding: the cloud generates every token and streams it down",
        description="The baseline split decoding is compared with. Uses the drafter GGUF only for its tokenizer.",
    )
    add_cloud_args(baseline)
    add_drafter_args(baseline)
    add_sampling_args(baseline)
    baseline.set_defaults(func=run_baseline)


def _add_fleet_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fleet (MQTT)")
    group.add_argument("--mqtt", type=mqtt_url, default=None, metavar="URL",
                       help="report status and telemetry to this broker and take commands from it ("
                       + MQTT_URL_FORMS + ")")
    group.add_argument("--edge-id", default=None, help="this device's name on MQTT (default: HOSTNAME-PID)")
    group.add_argument("--fleet-key-file", type=Path, default=None,
                       help="the fleet's command key: commands signed with it are applied (splitspec fleet send "
                            "--key-file); without it the edge takes no commands")
    group.add_argument("--telemetry-period", type=positive_float, default=10.0,
                       help="seconds between telemetry messages (default 10)")
    group.add_argument("--telemetry-budget", type=positive_float, default=1000.0, metavar="BITS_PER_S",
                       help="MQTT bytes at most, in bits/s (default 1000: 2%% of a 50 kbit/s uplink)")


def _start_fleet(args: argparse.Namespace, listen: bool = True, **status):
    """The edge's ``EdgeFleet`` when --mqtt is given, started; else None (``listen``: take commands
    and replica loads)."""
    if not args.mqtt:
        return None
    import os
    import socket

    from edge.telemetry import EdgeFleet

    edge_id = args.edge_id or f"{socket.gethostname()}-{os.getpid()}"
    from shared.fleet_commands import read_key_file

    key = read_key_file(args.fleet_key_file) if args.fleet_key_file else None
    return EdgeFleet(args.mqtt, edge_id, period_s=args.telemetry_period, budget_bps=args.telemetry_budget,
                     listen=listen, command_key=key).start(**status)


def _emit(args: argparse.Namespace, report) -> bool:
    """Write the report where asked; True when stdout got the JSON (no human summary then)."""
    if not args.timings:
        report.blocks = []
    if args.json_file is not None:
        args.json_file.write_text(json.dumps(report.to_json()))
    if args.json:
        print(json.dumps(report.to_json()))
    return args.json


def _summary(n_tokens: int, wall: float, extra: str) -> None:
    print(f"\n[{n_tokens} tokens in {wall:.2f}s ({n_tokens / max(wall, 1e-9):.1f} tok/s), {extra}]", file=sys.stderr)


def run_edge(args: argparse.Namespace) -> int:
    from edge.cli_options import cloud_options, controller_from_args, sampling_from_args
    from edge.drafter_choice import open_llama_drafter

    options = cloud_options(args)
    params = sampling_from_args(args)
    drafter = open_llama_drafter(args.drafter, n_threads=args.drafter_threads, n_ctx=args.drafter_ctx,
                                 lookup=args.lookup)
    prompt = drafter.vocab.tokenize(args.prompt)
    controller = controller_from_args(args)
    fleet = _start_fleet(args, False, state="online", role="run", model=drafter.model_name, cloud=args.cloud)
    if fleet is not None:
        fleet.client.connected.wait(2.0)  # a short run should still report; decoding never waits longer
    try:
        return _run_edge(args, drafter, prompt, params, controller, options, fleet)
    finally:
        if fleet is not None:
            fleet.stop()  # publishes offline: a clean stop does not fire the will


def _run_edge(args, drafter, prompt, params, controller, options, fleet) -> int:
    from edge.cli_options import spec_from_args, window_from_args
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from edge.report import SPLIT, EdgeReport
    from edge.text_stream import TextStream
    from edge.verifier_protocol import VerifierError
    from shared.cli import CliError

    vocab = drafter.vocab
    failure = None
    try:
        # A prompt the drafter cannot take (empty, past --drafter-ctx) is refused before connecting (begin reads
        # nothing yet: llama.cpp evaluates on the first draft).
        drafter.begin(prompt, params)
        verifier = GrpcVerifier(
            VerifierEndpoint(args.cloud, vocab.size, vocab.fingerprint, **options),
            verdict_timeout_s=args.verdict_timeout,
            outage_budget_s=args.outage_budget,
        )
        # Connection setup is not part of the generation's time, as for the baseline; an app would
        # connect ahead of the prompt, and so opens its stream then too.
        verifier.connect(stream=True)
        result = run_decode(
            drafter,
            verifier,
            prompt,
            params,
            max_new_tokens=args.max_new_tokens,
            spec=spec_from_args(args, controller),
            on_tokens=None if args.json else TextStream(vocab.detokenize),
        )
    except VerifierError as exc:
        if exc.partial is None:  # nothing was generated: nothing to report
            raise CliError(str(exc), 2 if exc.bad_input else 1) from exc
        failure, result = exc, exc.partial
    finally:
        drafter.close()
    if fleet is not None:
        from edge.telemetry import GenerationSample

        fleet.observe(GenerationSample.of(result, mode=params.mode.value, draft_len=args.draft_len,
                                          window=window_from_args(args), served_by="split", verifier=verifier))
        fleet.flush()
    report = EdgeReport(
        kind=SPLIT,
        tokens=result.tokens,
        text=vocab.detokenize(result.tokens),
        stop_reason=result.stop_reason.value,
        prompt_tokens=len(prompt),
        wall_s=result.stats.wall_s,
        ttft_s=result.ttft_s,
        open_s=verifier.open_s,
        ttft_cloud_s=verifier.first_token_cloud_s,
        bytes_up=verifier.bytes_up,
        bytes_down=verifier.bytes_down,
        rtt_ms=verifier.rtt_ms,
        decode=result.stats,
        drafter=drafter.stats,
        blocks=verifier.block_log,
        switches=controller.switches if controller is not None else 0,
        recoveries=verifier.recoveries,
        error=str(failure or ""),
        target=verifier.served_by.target_fingerprint.hex(),
    )
    if failure is not None:  # the report holds the tokens made before the failure
        _emit(args, report)
        raise CliError(f"{failure} ({len(result.tokens)} tokens generated before it)", 2 if failure.bad_input else 1)
    if _emit(args, report):
        return 0
    stats, n = result.stats, max(len(result.tokens), 1)
    _summary(
        len(result.tokens),
        stats.wall_s,
        f"stop={result.stop_reason.value}, mode={params.mode.value}, D={args.draft_len}, {args.schedule} "
        f"W={window_from_args(args)}, "
        f"acceptance rate {stats.acceptance_rate:.2f}, acceptance length {stats.acceptance_length:.2f}, "
        f"up {verifier.bytes_up / n:.1f} B/tok, down {verifier.bytes_down / n:.1f} B/tok, rtt {verifier.rtt_ms:.1f} ms, "
        f"cloud forwards {verifier.forwards}"
        + (f", hedges {stats.hedges_taken}/{stats.hedges_sent} taken (+{stats.hedge_tokens} tokens)"
           if stats.hedges_sent else "")
        + (f", {len(verifier.recoveries)} link recoveries" if verifier.recoveries else ""),
    )
    return 0


def run_serve(args: argparse.Namespace) -> int:
    import socket
    import threading

    from edge.cli_options import cloud_options
    from edge.drafter_choice import open_llama_drafter
    from edge.serving import EdgeService
    from shared.cli import CliError
    from shared.wire import is_loopback

    options = cloud_options(args)
    api_key = None
    if args.api_key_file is not None:
        if not args.api_key_file.is_file():
            raise FileNotFoundError(f"API key file not found: {args.api_key_file}")
        api_key = args.api_key_file.read_text().strip()
        if not api_key:
            raise ValueError(f"API key file is empty: {args.api_key_file}")
    tls = _serve_tls(args)
    if not is_loopback(args.host) and not args.insecure and (api_key is None or tls is None):
        raise ValueError(f"--host {args.host} is reachable from the network: give --api-key-file and "
                         "--tls-cert/--tls-key, or --insecure on a network you trust")
    with socket.socket() as probe:  # a taken port is an error now, not a traceback from the server later
        try:
            probe.bind((args.host, args.port))
        except OSError as exc:
            raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", 1) from exc
    drafter = open_llama_drafter(args.drafter, n_threads=args.drafter_threads, n_ctx=args.drafter_ctx,
                                 lookup=args.lookup)
    fleet = None
    try:
        fleet = _start_fleet(args, state="online", role="serve", model=drafter.model_name, cloud=args.cloud)
        service = EdgeService.for_drafter(drafter, serve_config(args, options, drafter.model_name), args.chat_format, fleet)
        if args.schedule == "adaptive":  # its controller starts from the link (``Controller.start``): measure it now
            threading.Thread(target=service.measure_link, name="link-probe", daemon=True).start()
        try:
            serve_http(service, args.host, args.port, api_key=api_key, max_waiting=args.max_waiting, tls=tls)
        finally:
            service.close()
    finally:
        if fleet is not None:
            fleet.stop()
        drafter.close()
    return 0


def serve_config(args: argparse.Namespace, options: dict, model_name: str) -> ServeConfig:
    """``edge serve``'s flags as the service's ``edge.serving.ServeConfig``, with ``options`` the flags'
    ``edge.cli_options.cloud_options`` (files read) and ``model_name`` the drafter's; ``--connect-timeout``
    is held to 5 s at most."""
    from edge.serving import ServeConfig

    return ServeConfig(
        cloud=args.cloud, model_name=model_name, auth_token=options["auth_token"],
        root_certificates=options["root_certificates"], client_certificate=options["client_certificate"],
        connect_timeout_s=min(args.connect_timeout, 5.0),
        verdict_timeout_s=args.verdict_timeout, outage_budget_s=args.outage_budget, draft_len=args.draft_len,
        schedule=args.schedule, window=args.window, hedge_width=args.hedge, speculation_cache=args.speculation_cache,
        fallback=args.fallback, pinned_target=options["pinned_target"],
    )


def _serve_tls(args: argparse.Namespace) -> tuple[str, str] | None:
    """(certificate, key) paths for HTTPS, both or neither given, each an existing PEM file."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_cert is None:
        return None
    for path, flag in ((args.tls_cert, "--tls-cert"), (args.tls_key, "--tls-key")):
        if not path.is_file():
            raise FileNotFoundError(f"{flag} file not found: {path}")
        if b"-----BEGIN " not in path.read_bytes():
            raise ValueError(f"{flag} is not a PEM file (no '-----BEGIN' line): {path}")
    return str(args.tls_cert), str(args.tls_key)


def serve_http(service, host: str, port: int, *, api_key: str | None, max_waiting: int,
               tls: tuple[str, str] | None = None) -> None:
    """Run the OpenAI-compatible app until interrupted (``tls``: certificate and key files: HTTPS)."""
    import uvicorn

    from edge.openai_server import create_app

    app = create_app(service, api_key=api_key, max_waiting=max_waiting)
    scheme = "https" if tls else "http"
    print(f"splitspec edge: serving the OpenAI API on {scheme}://{host}:{port}/v1 (model {service.config.model_name}, "
          f"cloud {service.config.cloud}, {service.template.description}, fallback {service.config.fallback})",
          flush=True)
    ssl = {"ssl_certfile": tls[0], "ssl_keyfile": tls[1]} if tls else {}
    uvicorn.run(app, host=host, port=port, log_level="warning", **ssl)


def run_baseline(args: argparse.Namespace) -> int:
    from edge.cli_options import cloud_options, sampling_from_args
    from edge.cloud_only import cloud_only_generate
    from edge.endpoint import VerifierEndpoint
    from edge.gguf_vocab import GgufVocab
    from edge.report import CLOUD_ONLY, EdgeReport
    from edge.text_stream import TextStream
    from edge.verifier_protocol import VerifierError
    from shared.cli import CliError
    from shared.models import default_gguf_path
    from shared.stats import DecodeStats

    options = cloud_options(args)
    params = sampling_from_args(args)
    vocab = GgufVocab.open(args.drafter or default_gguf_path())
    prompt = vocab.tokenize(args.prompt)
    try:
        result = cloud_only_generate(
            VerifierEndpoint(args.cloud, vocab.size, vocab.fingerprint, **options),
            prompt,
            params,
            max_new_tokens=args.max_new_tokens,
            timeout_s=args.verdict_timeout * args.max_new_tokens,
            on_tokens=None if args.json else TextStream(vocab.detokenize),
        )
    except VerifierError as exc:
        raise CliError(str(exc), 2 if exc.bad_input else 1) from exc
    decode = DecodeStats(wall_s=result.wall_s, target_forwards=result.forwards)
    for _ in result.tokens:
        decode.record_round(drafted=0, accepted=0, committed=1)
    report = EdgeReport(
        kind=CLOUD_ONLY,
        tokens=result.tokens,
        text=vocab.detokenize(result.tokens),
        stop_reason=result.stop_reason.value,
        prompt_tokens=len(prompt),
        wall_s=result.wall_s,
        ttft_s=result.ttft_s,
        open_s=0.0,
        ttft_cloud_s=result.chunk_log[0].cloud_s if result.chunk_log else 0.0,
        bytes_up=result.bytes_up,
        bytes_down=result.bytes_down,
        rtt_ms=0.0,
        decode=decode,
        blocks=result.chunk_log,
        target=result.target_fingerprint.hex(),
    )
    if _emit(args, report):
        return 0
    _summary(len(result.tokens), result.wall_s, f"cloud-only, stop={result.stop_reason.value}, ttft {result.ttft_s:.2f}s")
    return 0

if __name__ == "__main__":
    sys.exit(main())
