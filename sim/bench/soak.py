"""``splitspec bench capacity --soak MINUTES``: sessions opening, decoding and closing for minutes.

One verifier process (pinned to one core, a short session TTL) and
``sessions`` edge workers that each loop until the time is up: open a session
(split with replayed real drafts, or cloud-only one time in four), decode it,
and close; one session in ten is abandoned mid-stream (the stream dropped
without a Close, as a vanished edge would). Reported: sessions completed and
abandoned, errors (anything but the abandonments), outputs that differ from
target-only, verdict latency p50/p99 per minute, the verifier's RSS over time
(and its growth after warm-up), and the sessions still in the table once the
TTL has passed (leaked slots). ``plot`` writes RSS and latency over time.

Contract. ``run_soak_bench(SoakBench(...))`` returns the report dict; no argparse, no printing but ``progress``.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge.schedule import SpecConfig
from shared.stats import percentile
from sim.bench.bench_sessions import (
    PROMPTS,
    BenchSession,
    ReplayDrafter,
    bench_models,
    cloud_only_session,
    edges_off,
    first_core,
    record_drafts,
    session_params,
)

__all__ = ["SoakBench", "run_soak_bench", "plot_soak"]

_ABANDON_EVERY = 10  # one session in this many is dropped mid-stream
_CLOUD_ONLY_EVERY = 4  # one session in this many is cloud-only


class _Vanish(Exception):
    """Raised from a session's token callback to drop it mid-stream."""


@dataclass(frozen=True)
class SoakBench:
    """What ``run_soak_bench`` runs (``splitspec bench capacity --soak``'s flags)."""

    minutes: float
    sessions: int = 32  # workers, each opening, decoding and closing sessions in turn
    temperature: float = 0.8  # 0: greedy
    max_new_tokens: int = 32
    draft_len: int = 8
    target: str | None = None
    drafter: str | None = None
    tiny: bool = False
    seed: int = 0
    session_ttl_s: float = 10.0  # the verifier's TTL for parked sessions: abandoned ones must be gone after it
    cloud_cores: frozenset[int] | None = None  # as ``CapacityBench``'s
    cloud_args: Sequence[str] = ()

    @property
    def mode(self) -> str:
        return "greedy" if self.temperature == 0 else "coupled"


@dataclass
class _Tally:
    """What the workers and the watcher saw."""

    counts: dict[str, int] = field(default_factory=lambda: {"completed": 0, "abandoned": 0, "cloud_only": 0,
                                                             "different": 0})
    errors: list[str] = field(default_factory=list)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, verdict latency)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, the verifier's MiB)
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_soak_bench(bench: SoakBench, progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The soak report (module docstring); ValueError on bad arguments."""
    if bench.minutes <= 0 or bench.sessions < 1:
        raise ValueError("--soak needs minutes > 0 and --sessions >= 1")
    from edge.drafter_choice import open_llama_drafter
    from sim.experiment.processes import CloudProcess

    with tempfile.TemporaryDirectory(prefix="splitspec-soak-") as tmp:
        target, drafter = bench_models(bench.target, bench.drafter, bench.tiny, tmp)
        real = open_llama_drafter(drafter, n_threads=1)
        sessions = 2 * bench.sessions + 8
        extra = ["--session-ttl", str(bench.session_ttl_s), "--max-sessions", str(sessions),
                 "--max-sessions-per-client", str(sessions), "--opens-per-client", "0",  # (one address, many sessions)
                 "--max-draft-len", str(bench.draft_len), *bench.cloud_args]
        cores = (set(bench.cloud_cores) or None) if bench.cloud_cores is not None else first_core()
        with edges_off(cores), CloudProcess(target, cores, extra_args=extra) as cloud:
            progress("reference outputs and recorded drafts")
            run = _SoakRun(bench, real, f"127.0.0.1:{cloud.port}")
            run.go(cloud.proc.pid, progress)
            progress(f"waiting {bench.session_ttl_s + 5:.0f} s for abandoned sessions to expire")
            time.sleep(bench.session_ttl_s + 5)
            leaked = int(cloud.metric("splitspec_sessions_active"))
    return _report(bench, run.alpha, run.tally, leaked)


class _SoakRun:
    """The soak's sessions, their reference outputs and recorded drafts, and its workers."""

    def __init__(self, bench: SoakBench, real, address: str) -> None:
        self.bench, self.address = bench, address
        self.vocab = (real.vocab.size, real.vocab.fingerprint)
        self.work = [BenchSession(real.vocab.tokenize(PROMPTS[i % len(PROMPTS)]), seed=i) for i in range(len(PROMPTS))]
        self.reference = [cloud_only_session(address, s, self.vocab, bench.max_new_tokens, bench.temperature)[0]
                          for s in self.work]
        self.blocks, self.alpha = record_drafts(real, address, self.work, self.vocab, bench.max_new_tokens,
                                                bench.draft_len, bench.temperature)
        real.close()
        self.tally = _Tally()
        self.started = self.deadline = 0.0

    def go(self, cloud_pid: int, progress: Callable[[str], None]) -> None:
        """Every worker and the RSS watcher until the deadline, a progress line every 30 s."""
        tally = self.tally
        self.started = time.monotonic()
        self.deadline = self.started + 60 * self.bench.minutes
        threads = [threading.Thread(target=self.worker, args=(i,)) for i in range(self.bench.sessions)]
        threads.append(threading.Thread(target=self.watch, args=(cloud_pid,)))
        for t in threads:
            t.start()
        next_line = self.started + 30
        while any(t.is_alive() for t in threads):
            threads[-1].join(timeout=5)
            if time.monotonic() >= next_line:
                next_line += 30
                progress(f"{(time.monotonic() - self.started) / 60:.1f} min: {tally.counts}, {len(tally.errors)} "
                         f"errors, RSS {tally.rss[-1][1]:.0f} MiB" if tally.rss else "")
            if not threads[-1].is_alive():
                for t in threads:
                    t.join()

    def watch(self, cloud_pid: int) -> None:
        from sim.experiment.processes import process_rss_mb

        while time.monotonic() < self.deadline + 1:
            self.tally.rss.append((time.monotonic() - self.started, process_rss_mb(cloud_pid)))
            time.sleep(2.0)

    def worker(self, index: int) -> None:
        """Sessions until the deadline: one in ``_CLOUD_ONLY_EVERY`` cloud-only, one in ``_ABANDON_EVERY``
        abandoned mid-stream; every failure is counted and the worker goes on."""
        rng, tally = random.Random(self.bench.seed * 1000 + index), self.tally
        while time.monotonic() < self.deadline:
            number = rng.randrange(len(self.work))
            try:
                if rng.randrange(_CLOUD_ONLY_EVERY) == 0:
                    tokens = cloud_only_session(self.address, self.work[number], self.vocab, self.bench.max_new_tokens,
                                                self.bench.temperature)[0]
                    with tally.lock:
                        tally.counts["cloud_only"] += 1
                        tally.counts["different"] += tokens != self.reference[number]
                    continue
                self._split(number, rng)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, the worker goes on
                with tally.lock:
                    tally.errors.append(f"{type(exc).__name__}: {exc}")

    def _split(self, number: int, rng: random.Random) -> None:
        """One split session of work item ``number``, perhaps abandoned mid-stream (an edge that vanished)."""
        from edge.decode_loop import run_decode
        from edge.endpoint import VerifierEndpoint
        from edge.grpc_verifier import GrpcVerifier

        bench, tally, session = self.bench, self.tally, self.work[number]
        link = GrpcVerifier(VerifierEndpoint(self.address, *self.vocab), outage_budget_s=0)
        vanish_at = (rng.randrange(1, bench.max_new_tokens)
                     if bench.max_new_tokens > 1 and rng.randrange(_ABANDON_EVERY) == 0 else None)
        made: list[int] = []

        def on_tokens(new):
            made.extend(new)
            if vanish_at is not None and len(made) >= vanish_at:
                link.abandon()
                raise _Vanish

        begun = time.monotonic() - self.started
        try:
            result = run_decode(ReplayDrafter(self.blocks, self.vocab[0]), link, session.prompt,
                                session_params(session.seed, bench.temperature), max_new_tokens=bench.max_new_tokens,
                                spec=SpecConfig(bench.draft_len), on_tokens=on_tokens)
        except _Vanish:
            with tally.lock:
                tally.counts["abandoned"] += 1
            return
        round_s = [rtt + block.cloud_s for rtt, block in zip(link.rtt_samples_s, link.block_log)]
        stamps = [begun + sum(round_s[: i + 1]) for i in range(len(round_s))]  # about when each came
        with tally.lock:
            tally.counts["completed"] += 1
            tally.counts["different"] += result.tokens != self.reference[number]
            tally.latencies.extend(zip(stamps, round_s))


def _report(bench: SoakBench, alpha: float, tally: _Tally, leaked: int) -> dict[str, Any]:
    per_minute = []
    for minute in range(int(bench.minutes + 0.999)):
        window = [s for t, s in tally.latencies if minute * 60 <= t < (minute + 1) * 60]
        if window:
            per_minute.append({"minute": minute + 1, "rounds": len(window),
                               "verdict_latency_p50_s": statistics.median(window),
                               "verdict_latency_p99_s": percentile(window, 0.99)})
    warm = [m for t, m in tally.rss if t >= min(60.0, 0.2 * 60 * bench.minutes)]
    growth = (warm[-1] - warm[0]) / warm[0] if len(warm) > 1 and warm[0] else 0.0
    return {
        "minutes": bench.minutes,
        "sessions": bench.sessions,
        "mode": bench.mode,
        "acceptance": alpha,
        **tally.counts,
        "errors": len(tally.errors),
        "error_samples": tally.errors[:5],
        "verdict_latency": per_minute,
        "rss_mb": [[round(t, 1), round(m, 1)] for t, m in tally.rss],
        "rss_growth_after_warmup": growth,
        "leaked_sessions": leaked,
    }


def plot_soak(report: dict[str, Any], out: Path) -> Path:
    """RSS and verdict latency over time as one PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    rss = report["rss_mb"]
    top.plot([t / 60 for t, _ in rss], [m for _, m in rss])
    top.set_ylabel("verifier RSS (MiB)")
    minutes = [m["minute"] for m in report["verdict_latency"]]
    bottom.plot(minutes, [m["verdict_latency_p50_s"] * 1e3 for m in report["verdict_latency"]], marker="o", label="p50")
    bottom.plot(minutes, [m["verdict_latency_p99_s"] * 1e3 for m in report["verdict_latency"]], marker="o", label="p99")
    bottom.set_ylabel("verdict latency (ms)")
    bottom.set_xlabel("minutes")
    bottom.legend()
    fig.suptitle(f"soak: {report['sessions']} sessions, {report['errors']} errors, "
                 f"{report['leaked_sessions']} leaked sessions")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "soak.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
