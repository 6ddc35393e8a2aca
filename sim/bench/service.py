"""``splitspec bench service``: what the verifier service costs per verify, outside the forward.

Runs the same split decoding twice with the same drafter and seeds: in
process (the baseline: ``VerifierSession`` called directly) and through a
real gRPC server on loopback. Reports the servicer's own time per verify
outside the target forward (decode, checks, executor hand-off, metrics;
p50/p90/p99) and the end-to-end extra per round over loopback against the
in-process baseline measured in the same run.

Contract. `run_service_bench(...)` returns the report dict;
`format_service_report(report)` renders it. No argparse, no printing; flags
are in ``sim.commands.bench``.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from dataclasses import dataclass
from typing import Any

from edge.schedule import SpecConfig
from shared.stats import percentile

__all__ = ["format_service_report", "run_service_bench"]

_TEMPERATURE = 0.8  # every session samples (coupled mode), one seed per session


@dataclass
class _Rounds:
    """Verify rounds and the wall time they took, summed over sessions."""

    rounds: float = 0.0
    wall_s: float = 0.0

    def add(self, stats) -> None:
        self.rounds += stats.rounds
        self.wall_s += stats.wall_s

    @property
    def per_round_s(self) -> float:
        return self.wall_s / self.rounds


def run_service_bench(
    *,
    target: str | None = None,
    drafter: str | None = None,
    sessions: int = 20,
    max_new_tokens: int = 64,
    draft_len: int = 4,
    mode: str = "coupled",
) -> dict[str, Any]:
    """Service overhead per verify and per-round cost in process vs over loopback gRPC.

    ``mode`` "rejection" also runs each session on a second verifier whose draft audit is off
    (``ServiceLimits.audit_drafts``), the two interleaved, and reports what the audit costs a round.

    ``target`` None generates tiny models in a temporary folder (``drafter``
    is then ignored); a ``target`` folder needs a matching ``drafter`` GGUF.
    ValueError on a bad count or a target without a drafter.
    """
    if sessions < 1 or max_new_tokens < 1:
        raise ValueError(f"sessions and max_new_tokens must be >= 1, got {sessions} and {max_new_tokens}")
    if draft_len < 0:
        raise ValueError(f"draft_len must be >= 0, got {draft_len}")
    if target is not None and drafter is None:
        raise ValueError("a target needs a matching drafter GGUF")
    if mode not in ("coupled", "rejection"):
        raise ValueError(f"mode must be coupled or rejection, got {mode!r}")

    from cloud.engine import TargetEngine
    from edge.llama_drafter import LlamaDrafter
    from shared.params import Mode, SamplingParams
    from sim.inprocess import generate

    with tempfile.TemporaryDirectory(prefix="splitspec-bench-") as tmp:
        if target is None:
            from sim.fixtures.tiny_models import write_tiny_models

            paths = write_tiny_models(tmp)
            target, drafter = paths["target"], paths["drafter_noisy"]
        engine = TargetEngine(target)
        draft_model = LlamaDrafter(drafter, n_ctx=2048, n_threads=1)
        try:
            prompt = draft_model.vocab.tokenize("The quick brown fox")
            runs = [SamplingParams(mode=Mode(mode), temperature=_TEMPERATURE, seed=s) for s in range(sessions)]
            local = _Rounds()
            for params in runs:
                local.add(generate(engine, draft_model, prompt, params, max_new_tokens=max_new_tokens,
                                   spec=SpecConfig(draft_len)).stats)
            remote, unaudited, overheads = _over_grpc(engine, draft_model, prompt, runs, max_new_tokens, draft_len)
        finally:
            draft_model.close()
    audit = {} if mode != "rejection" else {
        "unaudited_ms_per_round": 1e3 * unaudited.per_round_s,
        "audit_cost": remote.per_round_s / unaudited.per_round_s - 1,  # a fraction of a round
    }
    return {
        "mode": mode,
        **audit,
        "verifies": len(overheads),
        "service_overhead_ms": {
            "p50": 1e3 * statistics.median(overheads),
            "p90": 1e3 * percentile(overheads, 0.9),
            "p99": 1e3 * percentile(overheads, 0.99),
        },
        "in_process_ms_per_round": 1e3 * local.per_round_s,
        "loopback_grpc_ms_per_round": 1e3 * remote.per_round_s,
        "loopback_extra_ms_per_round": 1e3 * (remote.per_round_s - local.per_round_s),
    }


def _over_grpc(engine, draft_model, prompt: list[int], runs: list, max_new_tokens: int,
               draft_len: int) -> tuple[_Rounds, _Rounds, list[float]]:
    """Every session through a real verifier on loopback, and in rejection mode through one without the
    draft audit too (interleaved, each first every other session): (rounds with the audit, rounds
    without, the service's overhead per verify)."""
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from shared.params import Mode

    remote, unaudited = _Rounds(), _Rounds()

    def run(server, params, into: _Rounds) -> None:
        verifier = GrpcVerifier(VerifierEndpoint(server.address, engine.vocab_size, engine.fingerprint))
        verifier.connect()
        into.add(run_decode(draft_model, verifier, prompt, params, max_new_tokens=max_new_tokens,
                            spec=SpecConfig(draft_len)).stats)

    granted = ("all",)  # (loopback: the bench's own edges; rejection mode is served to nobody by default)
    audited_off = ServerConfig(port=0, limits=ServiceLimits(audit_drafts=False, rejection_to=granted))
    rejection = runs[0].mode is Mode.REJECTION
    with BackgroundServer(engine, ServerConfig(port=0, limits=ServiceLimits(rejection_to=granted))) as server, \
            BackgroundServer(engine, audited_off) if rejection else contextlib.nullcontext() as other:
        for i, params in enumerate(runs):
            if other is not None and i % 2:
                run(other, params, unaudited)
            run(server, params, remote)
            if other is not None and not i % 2:
                run(other, params, unaudited)
        return remote, unaudited, list(server.server.servicer.recent_overheads_s)


def format_service_report(report: dict[str, Any]) -> str:
    """The report as two lines of text."""
    o = report["service_overhead_ms"]
    return (
        f"{report['verifies']} verifies: service overhead outside the forward p50 {o['p50']:.3f} ms, "
        f"p90 {o['p90']:.3f} ms, p99 {o['p99']:.3f} ms\n"
        f"per round: in-process {report['in_process_ms_per_round']:.3f} ms, over loopback gRPC "
        f"{report['loopback_grpc_ms_per_round']:.3f} ms (+{report['loopback_extra_ms_per_round']:.3f} ms, "
        f"x{report['loopback_grpc_ms_per_round'] / report['in_process_ms_per_round']:.2f})"
        + ("" if "audit_cost" not in report else
           f"\nrejection mode's draft audit: {report['unaudited_ms_per_round']:.3f} ms a round without it, "
           f"{100 * report['audit_cost']:+.1f}% with it")
    )
