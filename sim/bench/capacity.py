"""``splitspec bench capacity``: how many sessions one verifier carries, split against cloud-only.

A ``splitspec-cloud serve`` process pinned to one core (one torch thread)
serves N concurrent edge sessions (one such process busy at a time); at each N the same sessions run cloud-only
(``Generate``, the cloud decodes every token) in free shapes (the fastest
cloud-only) and split (greedy, or coupled at the given temperature) in
canonical (batch-invariant) shapes, both batched by the same scheduler, each
on its own verifier process on the same core. The SLO defaults to a fraction of
the fastest lone cloud-only rate: cloud-only in free shapes, one session alone,
measured first (after a short warm-up) on that same core. Capacity is what the verifier carries when
it is the bottleneck, so the edges must not be: they run as threads of this
process on the other cores and replay **recorded drafts**: before the runs,
each session is decoded once alone with the real llama.cpp drafter, and the
runs replay its blocks (``sim.bench.bench_sessions``; lock-step schedule, fixed
D), costing microseconds. The
acceptance the recording reached is reported.

Every session's output is checked against target-only decoding (each session
alone, cloud-only in canonical shapes, one token per forward), so the runs also
test batch invariance under load; the free-shapes runs' identity is luck, and
reported as such. The reference pass's own rate is the lone *reproducible*
cloud-only (canonical shapes), reported beside the fastest.

Contract. ``run_capacity_bench(CapacityBench(...))`` returns the report dict (the JSON of
``--json``); ``format_capacity_report`` renders it. No argparse, no printing
but ``progress``; flags are in ``sim.commands.bench.capacity``.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

from shared.params import TOKEN_IDENTICAL_MODES
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
    split_session,
)

__all__ = ["CapacityBench", "capacity_at_slo", "compared_shapes", "format_capacity_report", "run_capacity_bench"]

CLOUD_ONLY = "cloud-only"
FASTEST_SHAPES = "free"  # cloud-only's fastest shapes: what capacity's cloud-only runs in
SPLIT_SHAPES = "canonical"  # batch-invariant, so identity under load is checked: what the split runs in
LONE_SESSIONS = 3  # sessions decoded alone, one after another, for the lone cloud-only rate (their median)
WARM_UP_TOKENS = 4  # a fresh verifier's first forwards are slow: one short session first, unmeasured


def compared_shapes(mode: str) -> str:
    """The shapes a mode's capacity is read in: cloud-only in its fastest (free), the split in
    canonical (batch-invariant, so its outputs are checked against target-only)."""
    return FASTEST_SHAPES if mode == CLOUD_ONLY else SPLIT_SHAPES


def capacity_at_slo(runs: list[dict[str, Any]], slo: float) -> dict[str, int]:
    """Per mode (batched runs in ``compared_shapes(mode)``), the largest N whose per-session p50
    tokens/s is at least ``slo`` (0: none)."""
    out: dict[str, int] = {}
    for run in runs:
        if not run["batching"] or run.get("shapes", SPLIT_SHAPES) != compared_shapes(run["mode"]):
            continue
        ok = run["per_session_tokens_per_s_p50"] >= slo
        out[run["mode"]] = max(out.get(run["mode"], 0), run["sessions"] if ok else 0)
    return out


@dataclass(frozen=True)
class CapacityBench:
    """What ``run_capacity_bench`` runs (``splitspec bench capacity``'s flags)."""

    sessions: Sequence[int] = (1, 2, 4, 8, 16)  # concurrent session counts
    mode: str = "coupled"  # the split's mode (greedy or coupled; cloud-only samples alike)
    slo: float | None = None  # tokens/s per session (p50) for capacity; None: slo_fraction of the lone rate
    slo_fraction: float = 0.5
    max_new_tokens: int = 32
    draft_len: int = 8
    temperature: float = 0.8  # coupled mode's (greedy: 0)
    compare_unbatched: bool = False  # also every N with the verifiers serving one forward at a time
    compare_free_shapes: bool = False  # also each side in its other shapes (what invariance costs each)
    target: str | None = None
    drafter: str | None = None
    tiny: bool = False  # generated tiny models (tests)
    scenario: str | None = None  # each edge through its own emulated link of this scenario
    cloud_cores: frozenset[int] | None = None  # the verifiers' cores (None: the first core; empty: unpinned)
    cloud_args: Sequence[str] = ()  # more ``splitspec-cloud serve`` flags (--device, --dtype; not --shapes)

    def checked(self) -> CapacityBench:
        """These arguments, or ``ValueError`` naming the flag that is wrong (greedy: temperature 0)."""
        if not self.sessions or min(self.sessions) < 1:
            raise ValueError("--sessions needs counts >= 1")
        if self.mode not in TOKEN_IDENTICAL_MODES:
            raise ValueError(f"mode {self.mode!r}: capacity compares outputs token for token, so greedy or coupled")
        if self.max_new_tokens < 1 or self.draft_len < 1:
            raise ValueError("max_new_tokens and draft_len must be >= 1")
        if self.slo is not None and self.slo <= 0:
            raise ValueError("--slo must be > 0 tokens/s")
        if self.slo is None and not 0 < self.slo_fraction <= 1:
            raise ValueError("--slo-fraction must be in (0, 1]")
        if "--shapes" in self.cloud_args:
            raise ValueError("the bench sets each verifier's --shapes itself")
        return replace(self, temperature=0.0) if self.mode == "greedy" else self


def run_capacity_bench(bench: CapacityBench, progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The capacity report (see the module docstring); ``ValueError`` on bad arguments."""
    bench = bench.checked()
    with tempfile.TemporaryDirectory(prefix="splitspec-capacity-") as tmp, ExitStack() as stack:
        target, drafter = bench_models(bench.target, bench.drafter, bench.tiny, tmp)
        from edge.drafter_choice import open_llama_drafter

        real = open_llama_drafter(drafter, n_threads=1)
        stack.callback(real.close)
        cores = (set(bench.cloud_cores) or None) if bench.cloud_cores is not None else first_core()
        stack.enter_context(edges_off(cores))
        run = _CapacityRun(bench, target, real, cores, progress)
        lone = run.work[:LONE_SESSIONS]
        with ExitStack() as fastest:
            free_cloud, free_addresses = run.verifier(FASTEST_SHAPES, True, fastest)
            progress(f"the fastest cloud-only alone: {FASTEST_SHAPES} shapes, {len(lone)} sessions one at a time")
            fastest_lone = statistics.median(_rate(run.cloud_only(free_addresses[0], s)) for s in lone)
            chosen = bench.slo if bench.slo is not None else bench.slo_fraction * fastest_lone
            progress(f"fastest lone cloud-only {fastest_lone:.2f} tokens/s; SLO {chosen:.3g} tokens/s per session")
            run.measure(free_cloud, free_addresses, [CLOUD_ONLY], True, FASTEST_SHAPES)
            with ExitStack() as canonical:
                cloud, addresses = run.verifier(SPLIT_SHAPES, True, canonical)
                progress(f"reference: {len(run.work)} sessions decoded alone, cloud-only, {SPLIT_SHAPES} shapes")
                timed = [run.cloud_only(addresses[0], s) for s in run.work]
                reference = [t[0] for t in timed]
                reproducible_lone = statistics.median(_rate(t) for t in timed[:len(lone)])
                progress(f"recording the real drafter's blocks ({bench.mode}, D={bench.draft_len})")
                run.recordings[bench.mode], alpha = record_drafts(real, addresses[0], run.work, run.vocab,
                                                                  bench.max_new_tokens, bench.draft_len,
                                                                  bench.temperature)
                run.measure(cloud, addresses, [bench.mode, *[CLOUD_ONLY] * bench.compare_free_shapes], True,
                            SPLIT_SHAPES)
            if bench.compare_free_shapes:
                run.measure(free_cloud, free_addresses, [bench.mode], True, FASTEST_SHAPES)
        if bench.compare_unbatched:
            for shapes, kind in ((FASTEST_SHAPES, CLOUD_ONLY), (SPLIT_SHAPES, bench.mode)):
                with ExitStack() as per_cloud:
                    run.measure(*run.verifier(shapes, False, per_cloud), [kind], False, shapes)
    runs = run.judged(reference)
    return {
        "slo_tokens_per_s": chosen,
        "slo_fraction": None if bench.slo is not None else bench.slo_fraction,  # None: the SLO was given (--slo)
        "fastest_cloud_only_alone": {"shapes": FASTEST_SHAPES, "tokens_per_s": fastest_lone, "sessions": len(lone)},
        "reproducible_cloud_only_alone": {"shapes": SPLIT_SHAPES, "tokens_per_s": reproducible_lone,
                                          "sessions": len(lone)},
        "compared_shapes": {CLOUD_ONLY: compared_shapes(CLOUD_ONLY), bench.mode: compared_shapes(bench.mode)},
        "capacity_at_slo": capacity_at_slo(runs, chosen),
        "drafter": "recorded real drafts replayed (llama.cpp, lock-step, fixed D)",
        "acceptance": {bench.mode: alpha},
        "draft_len": bench.draft_len,
        "max_new_tokens": bench.max_new_tokens,
        "verifier_cores": sorted(cores) if cores else None,
        "verifier_flags": list(bench.cloud_args),
        "scenario": bench.scenario,
        "runs": runs,
    }


class _CapacityRun:
    """One capacity run's sessions, verifiers and measurements."""

    def __init__(self, bench: CapacityBench, target: str, real, cores: set[int] | None,
                 progress: Callable[[str], None]) -> None:
        self.bench, self.target, self.cores, self.progress = bench, target, cores, progress
        self.vocab = (real.vocab.size, real.vocab.fingerprint)
        self.work = [BenchSession(real.vocab.tokenize(PROMPTS[i % len(PROMPTS)]), seed=i)
                     for i in range(max(bench.sessions))]
        self.recordings: dict[str, dict] = {}  # mode -> the real drafter's blocks by prefix
        self.measured: list[tuple[dict[str, Any], list]] = []  # (run, each session's tokens)

    def cloud_only(self, address: str, session: BenchSession, max_new_tokens: int | None = None):
        return cloud_only_session(address, session, self.vocab, max_new_tokens or self.bench.max_new_tokens,
                                  self.bench.temperature)

    def verifier(self, shapes: str, batching: bool, within: ExitStack) -> tuple[Any, list[str]]:
        """A verifier process in ``shapes`` on the cores, warmed up; (it, one address per session)."""
        from sim.experiment.processes import CloudProcess

        most = max(self.bench.sessions)
        extra = ["--max-draft-len", str(self.bench.draft_len), "--max-sessions", str(max(64, 2 * most)),
                 "--max-sessions-per-client", str(max(64, 2 * most)), "--opens-per-client", "0",  # (one address, many sessions)
                 "--shapes", shapes, *self.bench.cloud_args]
        cloud = within.enter_context(CloudProcess(self.target, self.cores,
                                                  extra_args=extra + ([] if batching else ["--no-batching"])))
        addresses = _links(self.bench.scenario, cloud.port, most, within) or [f"127.0.0.1:{cloud.port}"] * most
        self.cloud_only(addresses[0], self.work[0], WARM_UP_TOKENS)
        return cloud, addresses

    def measure(self, cloud, addresses: list[str], kinds: Sequence[str], batching: bool, shapes: str) -> None:
        """Every session count, each of ``kinds`` (cloud-only or the split's mode)."""
        for n in self.bench.sessions:
            for kind in kinds:
                self.progress(f"{'batched' if batching else 'one forward at a time'}, {shapes} shapes: {n} sessions, "
                              f"{kind}")
                run, outputs = _measure(cloud, addresses, self, self.work[:n], kind, batching)
                self.measured.append(({**run, "shapes": shapes}, outputs))

    def judged(self, reference: list) -> list[dict[str, Any]]:
        """The runs, each marked identical or not to target-only (``reference``), in report order."""
        for run, outputs in self.measured:
            run["identical"] = not run["errors"] and all(o is not None and o == reference[i]
                                                         for i, o in enumerate(outputs))
        return sorted((run for run, _ in self.measured),
                      key=lambda r: (not r["batching"], r["sessions"], r["mode"] != CLOUD_ONLY, r["shapes"]))


def _links(scenario: str | None, port: int, count: int, stack: ExitStack) -> list[str]:
    if scenario is None:
        return []
    from sim.experiment.processes import BackgroundLink
    from sim.link.scenario import load_scenario

    link = load_scenario(scenario).link
    return [stack.enter_context(BackgroundLink(link, port)).address for _ in range(count)]


def _rate(session_result) -> float:
    """A session's tokens/s, from ``cloud_only_session``'s or ``split_session``'s (tokens, started, ended, ...)."""
    tokens, started, ended = session_result[:3]
    return len(tokens) / (ended - started)


def _measure(cloud, addresses: list[str], run: _CapacityRun, work: list[BenchSession], mode: str,
             batching: bool) -> tuple[dict[str, Any], list]:
    """N = len(work) sessions at once: the run's entry of the report (all but ``identical``, which the
    caller sets against the reference) and each session's tokens (None where it failed)."""
    vocab, blocks, bench = run.vocab, run.recordings.get(mode), run.bench
    max_new_tokens, draft_len, temperature = bench.max_new_tokens, bench.draft_len, bench.temperature
    metrics = ("splitspec_engine_forwards_total", "splitspec_engine_rows_total", "splitspec_engine_busy_seconds_total",
               "splitspec_engine_sequences_sum", "splitspec_engine_sequences_count")
    before = {name: cloud.metric(name) for name in metrics}
    cpu_before = cloud.cpu_s()
    results: list = [None] * len(work)
    errors: list[str] = []
    barrier = threading.Barrier(len(work))
    misses = []

    def edge(i: int) -> None:
        try:
            barrier.wait()
            if mode == CLOUD_ONLY:
                results[i] = cloud_only_session(addresses[i], work[i], vocab, max_new_tokens, temperature)
            else:
                replay = ReplayDrafter(blocks, vocab[0])
                results[i] = split_session(addresses[i], work[i], vocab, replay, max_new_tokens, draft_len, temperature)[:3]
                misses.append(replay.misses)
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            errors.append(f"session {i}: {exc}")

    threads = [threading.Thread(target=edge, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = {name: cloud.metric(name) for name in metrics}
    delta = {name: after[name] - before[name] for name in metrics}
    cpu_s = cloud.cpu_s() - cpu_before
    done = [r for r in results if r is not None]
    tokens = sum(len(r[0]) for r in done)
    wall = (max(r[2] for r in done) - min(r[1] for r in done)) if done else 0.0
    per_session = [_rate(r) for r in done]
    forwards = delta["splitspec_engine_forwards_total"]
    return {
        "mode": mode,
        "sessions": len(work),
        "batching": batching,
        "aggregate_tokens_per_s": tokens / wall if wall else 0.0,
        "per_session_tokens_per_s_p50": statistics.median(per_session) if per_session else 0.0,
        "per_session_tokens_per_s_p10": percentile(per_session, 0.1) if per_session else 0.0,
        "cloud_forwards_per_token": forwards / tokens if tokens else 0.0,
        "cloud_cpu_s_per_token": cpu_s / tokens if tokens else 0.0,
        "verifier_busy": delta["splitspec_engine_busy_seconds_total"] / wall if wall else 0.0,
        "mean_batch_rows": delta["splitspec_engine_rows_total"] / forwards if forwards else 0.0,
        "mean_batch_sessions": (delta["splitspec_engine_sequences_sum"] / delta["splitspec_engine_sequences_count"]
                                if delta["splitspec_engine_sequences_count"] else 0.0),
        "replay_misses": sum(misses),
        "errors": errors,
        "wall_s": wall,
    }, [r[0] if r is not None else None for r in results]


def format_capacity_report(report: dict[str, Any]) -> str:
    from tabulate import tabulate

    rows = [
        [r["mode"], r["sessions"], "yes" if r["batching"] else "no", r["shapes"], f"{r['aggregate_tokens_per_s']:.1f}",
         f"{r['per_session_tokens_per_s_p50']:.2f}", f"{r['per_session_tokens_per_s_p10']:.2f}",
         f"{r['cloud_forwards_per_token']:.2f}", f"{r['cloud_cpu_s_per_token'] * 1e3:.0f}", f"{r['verifier_busy']:.0%}",
         f"{r['mean_batch_rows']:.1f}", f"{r['mean_batch_sessions']:.1f}", "yes" if r["identical"] else "NO"]
        for r in report["runs"]
    ]
    table = tabulate(rows, headers=["mode", "N", "batched", "shapes", "agg tok/s", "p50 tok/s", "p10 tok/s", "fwd/tok",
                                    "cloud CPU ms/tok", "busy", "rows/fwd", "sessions/fwd", "identical"])
    alpha = ", ".join(f"{mode} {a:.2f}" for mode, a in report["acceptance"].items())
    capacity = ", ".join(f"{mode} {n}" for mode, n in report["capacity_at_slo"].items())
    fastest, reproducible = report["fastest_cloud_only_alone"], report["reproducible_cloud_only_alone"]
    slo = report["slo_tokens_per_s"]
    chosen = (f"{report['slo_fraction']:g} x the fastest lone cloud-only" if report["slo_fraction"] is not None
              else "set by --slo")
    why = {FASTEST_SHAPES: "its fastest", SPLIT_SHAPES: "batch-invariant"}
    compared = " against ".join(f"{mode} in {shapes} shapes ({why[shapes]})"
                                for mode, shapes in report["compared_shapes"].items())
    return (f"{table}\n\ndrafter: {report['drafter']}; acceptance {alpha}; D={report['draft_len']}\n"
            f"cloud-only alone (median of {fastest['sessions']} sessions one at a time, same cores and threads): "
            f"{fastest['tokens_per_s']:.2f} tokens/s in {fastest['shapes']} shapes (the fastest), "
            f"{reproducible['tokens_per_s']:.2f} in {reproducible['shapes']} shapes (reproducible)\n"
            f"SLO: {slo:.3g} tokens/s per session (p50), {chosen}\n"
            f"capacity at {slo:.3g} tokens/s per session (p50), both batched, {compared}: {capacity}")
