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

Contract. ``run_soak_bench(...)`` returns the report dict; no argparse, no printing but ``progress``.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shared.stats import percentile
from sim.bench.capacity import (
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

__all__ = ["run_soak_bench", "plot_soak"]

_ABANDON_EVERY = 10  # one session in this many is dropped mid-stream
_CLOUD_ONLY_EVERY = 4  # one session in this many is cloud-only


class _Vanish(Exception):
    """Raised from a session's token callback to drop it mid-stream."""


def run_soak_bench(
    *,
    minutes: float,
    sessions: int = 32,
    temperature: float = 0.8,
    max_new_tokens: int = 32,
    draft_len: int = 8,
    target: str | None = None,
    drafter: str | None = None,
    tiny: bool = False,
    seed: int = 0,
    session_ttl_s: float = 10.0,
    cloud_cores: set[int] | None = None,
    cloud_args: Sequence[str] = (),
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The soak report (module docstring); ``session_ttl_s``: the verifier's TTL for parked sessions
    (abandoned ones must be gone this long after the end); ``cloud_cores`` and ``cloud_args`` as in
    ``run_capacity_bench``."""
    if minutes <= 0 or sessions < 1:
        raise ValueError("--soak needs minutes > 0 and --sessions >= 1")
    from edge.decode_loop import run_decode
    from edge.drafter_choice import open_llama_drafter
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from sim.experiment.processes import CloudProcess, process_rss_mb

    with tempfile.TemporaryDirectory(prefix="splitspec-soak-") as tmp:
        target, drafter = bench_models(target, drafter, tiny, tmp)
        real = open_llama_drafter(drafter, n_threads=1)
        vocab = (real.vocab.size, real.vocab.fingerprint)
        work = [BenchSession(real.vocab.tokenize(PROMPTS[i % len(PROMPTS)]), seed=i) for i in range(len(PROMPTS))]
        extra = ["--session-ttl", str(session_ttl_s), "--max-sessions", str(2 * sessions + 8),
                 "--max-sessions-per-client", str(2 * sessions + 8), "--max-draft-len", str(draft_len), *cloud_args]
        cores = (cloud_cores or None) if cloud_cores is not None else first_core()
        with edges_off(cores), CloudProcess(target, cores, extra_args=extra) as cloud:
            address = f"127.0.0.1:{cloud.port}"
            progress("reference outputs and recorded drafts")
            reference = [cloud_only_session(address, s, vocab, max_new_tokens, temperature)[0] for s in work]
            blocks, alpha = record_drafts(real, address, work, vocab, max_new_tokens, draft_len, temperature)
            real.close()
            started = time.monotonic()
            deadline = started + 60 * minutes
            lock = threading.Lock()
            counts = {"completed": 0, "abandoned": 0, "cloud_only": 0, "different": 0}
            errors: list[str] = []
            latencies: list[tuple[float, float]] = []  # (seconds since start, verdict latency)
            rss: list[tuple[float, float]] = []

            def worker(index: int) -> None:
                rng = random.Random(seed * 1000 + index)
                while time.monotonic() < deadline:
                    number = rng.randrange(len(work))
                    session = work[number]
                    try:
                        if rng.randrange(_CLOUD_ONLY_EVERY) == 0:
                            tokens = cloud_only_session(address, session, vocab, max_new_tokens, temperature)[0]
                            with lock:
                                counts["cloud_only"] += 1
                                counts["different"] += tokens != reference[number]
                            continue
                        link = GrpcVerifier(VerifierEndpoint(address, *vocab), outage_budget_s=0)
                        vanish_at = (rng.randrange(1, max_new_tokens)
                                     if max_new_tokens > 1 and rng.randrange(_ABANDON_EVERY) == 0 else None)
                        made: list[int] = []

                        def on_tokens(new, link=link, made=made, vanish_at=vanish_at):
                            made.extend(new)
                            if vanish_at is not None and len(made) >= vanish_at:
                                link.abandon()
                                raise _Vanish

                        begun = time.monotonic() - started
                        try:
                            result = run_decode(ReplayDrafter(blocks, vocab[0]), link, session.prompt,
                                                session_params(session.seed, temperature),
                                                max_new_tokens=max_new_tokens, draft_len=draft_len, on_tokens=on_tokens)
                        except _Vanish:
                            with lock:
                                counts["abandoned"] += 1
                            continue
                        round_s = [rtt + block.cloud_s for rtt, block in zip(link.rtt_samples_s, link.block_log)]
                        stamps = [begun + sum(round_s[: i + 1]) for i in range(len(round_s))]  # about when each came
                        with lock:
                            counts["completed"] += 1
                            counts["different"] += result.tokens != reference[number]
                            latencies.extend(zip(stamps, round_s))
                    except Exception as exc:  # noqa: BLE001 - every failure is counted, the worker goes on
                        with lock:
                            errors.append(f"{type(exc).__name__}: {exc}")

            def watch() -> None:
                while time.monotonic() < deadline + 1:
                    rss.append((time.monotonic() - started, process_rss_mb(cloud.proc.pid)))
                    time.sleep(2.0)

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(sessions)]
            threads.append(threading.Thread(target=watch))
            for t in threads:
                t.start()
            next_line = started + 30
            while any(t.is_alive() for t in threads):
                threads[-1].join(timeout=5)
                if time.monotonic() >= next_line:
                    next_line += 30
                    progress(f"{(time.monotonic() - started) / 60:.1f} min: {counts}, {len(errors)} errors, "
                             f"RSS {rss[-1][1]:.0f} MiB" if rss else "")
                if not threads[-1].is_alive():
                    for t in threads:
                        t.join()
            progress(f"waiting {session_ttl_s + 5:.0f} s for abandoned sessions to expire")
            time.sleep(session_ttl_s + 5)
            leaked = int(cloud.metric("splitspec_sessions_active"))
    return _report(minutes, sessions, "greedy" if temperature == 0 else "coupled", alpha, counts, errors, latencies, rss, leaked)


def _report(minutes, sessions, mode, alpha, counts, errors, latencies, rss, leaked) -> dict[str, Any]:
    per_minute = []
    for minute in range(int(minutes + 0.999)):
        window = [s for t, s in latencies if minute * 60 <= t < (minute + 1) * 60]
        if window:
            per_minute.append({"minute": minute + 1, "rounds": len(window),
                               "verdict_latency_p50_s": statistics.median(window),
                               "verdict_latency_p99_s": percentile(window, 0.99)})
    warm = [m for t, m in rss if t >= min(60.0, 0.2 * 60 * minutes)]
    growth = (warm[-1] - warm[0]) / warm[0] if len(warm) > 1 and warm[0] else 0.0
    return {
        "minutes": minutes,
        "sessions": sessions,
        "mode": mode,
        "acceptance": alpha,
        **counts,
        "errors": len(errors),
        "error_samples": errors[:5],
        "verdict_latency": per_minute,
        "rss_mb": [[round(t, 1), round(m, 1)] for t, m in rss],
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
