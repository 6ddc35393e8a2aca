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
each session is decoded once alone with the real llama.cpp drafter, which
records what it proposed after each prefix; in the runs a ``ReplayDrafter``
proposes the same blocks for the same prefixes (verification is exact, so the
prefixes recur; lock-step schedule, fixed D), costing microseconds. The
acceptance the recording reached is reported.

Every session's output is checked against target-only decoding (each session
alone, cloud-only in canonical shapes, one token per forward), so the runs also
test batch invariance under load; the free-shapes runs' identity is luck, and
reported as such. The reference pass's own rate is the lone *reproducible*
cloud-only (canonical shapes), reported beside the fastest.

Contract. ``run_capacity_bench(...)`` returns the report dict (the JSON of
``--json``); ``format_capacity_report`` renders it. No argparse, no printing
but ``progress``; flags are in ``sim.commands.bench``.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from edge.drafter import DraftBlock, ModelFreeDrafter, Speculation, one_hot_block
from shared.params import TOKEN_IDENTICAL_MODES
from shared.stats import percentile
from sim.experiment.runner import DEFAULT_PROMPTS

__all__ = [
    "BenchSession", "ReplayDrafter", "RecordingDrafter", "bench_models", "capacity_at_slo", "cloud_only_session", "compared_shapes",
    "edges_off", "first_core", "format_capacity_report", "record_drafts", "run_capacity_bench", "session_params", "split_session",
]

CLOUD_ONLY = "cloud-only"
FASTEST_SHAPES = "free"  # cloud-only's fastest shapes: what capacity's cloud-only runs in
SPLIT_SHAPES = "canonical"  # batch-invariant, so identity under load is checked: what the split runs in
LONE_SESSIONS = 3  # sessions decoded alone, one after another, for the lone cloud-only rate (their median)
WARM_UP_TOKENS = 4  # a fresh verifier's first forwards are slow: one short session first, unmeasured
PROMPTS = [
    *DEFAULT_PROMPTS,
    "What is the difference between a virus and a bacterium?",
    "Describe how a bicycle works to a child.",
    "Give three reasons to learn a second language.",
    "Summarize the plot of a detective novel in one paragraph.",
    "How do plants turn sunlight into food?",
]


class RecordingDrafter:
    """Wraps a real drafter and records, per (seed, sequence drafted from), the block it proposed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.stats = inner.stats
        self.blocks: dict[tuple, DraftBlock] = {}
        self._spec = Speculation.start([])
        self._seed = 0

    def begin(self, prompt: Sequence[int], params) -> None:
        self._spec = Speculation.start(prompt)
        self._seed = params.seed
        self.inner.begin(prompt, params)

    def draft(self, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        key = (self._seed, *self._spec.tokens)
        block = self.inner.draft(n, stop)
        self.blocks[key] = block
        self._spec.tokens.extend(block.tokens)
        return block

    def commit(self, tokens: Sequence[int]) -> None:
        self._spec.commit(tokens)
        self.inner.commit(tokens)

    def rewind(self) -> None:
        self._spec.rewind()
        self.inner.rewind()

    def close(self) -> None:
        self.inner.close()


class ReplayDrafter(ModelFreeDrafter):
    """Proposes the blocks a ``RecordingDrafter`` recorded, keyed by (seed, sequence drafted from);
    an unrecorded sequence gets an empty block (the cloud then decodes that position alone)."""

    def __init__(self, blocks: dict[tuple, DraftBlock], vocab_size: int) -> None:
        super().__init__(vocab_size)
        self.blocks = blocks
        self.misses = 0

    def propose_block(self, n: int) -> DraftBlock:
        block = self.blocks.get((self._params.seed, *self._spec.tokens))
        if block is None:
            self.misses += 1
            return one_hot_block([], self._params)
        return DraftBlock(block.tokens[:n], block.q[:n] if block.q else block.q)


@dataclass(frozen=True)
class BenchSession:
    prompt: list[int]
    seed: int


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


def run_capacity_bench(
    *,
    sessions: Sequence[int] = (1, 2, 4, 8, 16),
    mode: str = "coupled",
    slo: float | None = None,
    slo_fraction: float = 0.5,
    max_new_tokens: int = 32,
    draft_len: int = 8,
    temperature: float = 0.8,
    compare_unbatched: bool = False,
    compare_free_shapes: bool = False,
    target: str | None = None,
    drafter: str | None = None,
    tiny: bool = False,
    scenario: str | None = None,
    cloud_cores: set[int] | None = None,
    cloud_args: Sequence[str] = (),
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The capacity report (see the module docstring). ``tiny``: generated tiny models (tests).
    ``slo``: tokens/s per session (p50) for capacity; None: ``slo_fraction`` of the fastest lone
    cloud-only rate, measured first.
    ``compare_unbatched``: also run every N with the verifiers serving one forward at a time;
    ``compare_free_shapes``: also run each side in its other shapes (the split in free shapes,
    cloud-only in canonical), to see what invariance costs each.
    ``scenario``: each edge reaches the verifier through its own emulated link of that scenario.
    ``cloud_cores``: where the verifiers run (default: the first core; an empty set: unpinned,
    e.g. on a GPU machine); ``cloud_args``: more ``splitspec-cloud serve`` flags (--device,
    --dtype; the bench sets --shapes). ValueError on bad arguments."""
    if not sessions or min(sessions) < 1:
        raise ValueError("--sessions needs counts >= 1")
    if mode not in TOKEN_IDENTICAL_MODES:
        raise ValueError(f"mode {mode!r}: capacity compares outputs token for token, so greedy or coupled")
    if mode == "greedy":
        temperature = 0.0
    if max_new_tokens < 1 or draft_len < 1:
        raise ValueError("max_new_tokens and draft_len must be >= 1")
    if slo is not None and slo <= 0:
        raise ValueError("--slo must be > 0 tokens/s")
    if slo is None and not 0 < slo_fraction <= 1:
        raise ValueError("--slo-fraction must be in (0, 1]")
    if "--shapes" in cloud_args:
        raise ValueError("the bench sets each verifier's --shapes itself")
    with tempfile.TemporaryDirectory(prefix="splitspec-capacity-") as tmp, ExitStack() as stack:
        target, drafter = bench_models(target, drafter, tiny, tmp)
        from edge.drafter_choice import open_llama_drafter
        from sim.experiment.processes import CloudProcess

        real = open_llama_drafter(drafter, n_threads=1)
        stack.callback(real.close)
        vocab = (real.vocab.size, real.vocab.fingerprint)
        work = [BenchSession(real.vocab.tokenize(PROMPTS[i % len(PROMPTS)]), seed=i) for i in range(max(sessions))]
        cores = (cloud_cores or None) if cloud_cores is not None else first_core()
        stack.enter_context(edges_off(cores))
        recordings: dict[str, dict] = {}
        measured: list[tuple[dict[str, Any], list]] = []  # (run, each session's tokens): identity once the reference is in

        def verifier(shapes: str, batching: bool, within: ExitStack) -> tuple[Any, list[str]]:
            """A verifier process in ``shapes`` on ``cores``, warmed up; (it, one address per session)."""
            extra = ["--max-draft-len", str(draft_len), "--max-sessions", str(max(64, 2 * max(sessions))),
                     "--max-sessions-per-client", str(max(64, 2 * max(sessions))), "--shapes", shapes, *cloud_args]
            cloud = within.enter_context(CloudProcess(target, cores, extra_args=extra + ([] if batching else ["--no-batching"])))
            addresses = _links(scenario, cloud.port, max(sessions), within) or [f"127.0.0.1:{cloud.port}"] * max(sessions)
            cloud_only_session(addresses[0], work[0], vocab, WARM_UP_TOKENS, temperature)
            return cloud, addresses

        def measure(cloud, addresses: list[str], kinds: Sequence[str], batching: bool, shapes: str) -> None:
            for n in sessions:
                for kind in kinds:
                    progress(f"{'batched' if batching else 'one forward at a time'}, {shapes} shapes: {n} sessions, {kind}")
                    run, outputs = _measure(cloud, addresses, work[:n], vocab, kind, recordings.get(kind),
                                            max_new_tokens, draft_len, temperature, batching)
                    measured.append(({**run, "shapes": shapes}, outputs))

        lone = work[:LONE_SESSIONS]
        with ExitStack() as fastest:
            free_cloud, free_addresses = verifier(FASTEST_SHAPES, True, fastest)
            progress(f"the fastest cloud-only alone: {FASTEST_SHAPES} shapes, {len(lone)} sessions one at a time")
            fastest_lone = statistics.median(
                _rate(cloud_only_session(free_addresses[0], s, vocab, max_new_tokens, temperature)) for s in lone)
            chosen = slo if slo is not None else slo_fraction * fastest_lone
            progress(f"fastest lone cloud-only {fastest_lone:.2f} tokens/s; SLO {chosen:.3g} tokens/s per session")
            measure(free_cloud, free_addresses, [CLOUD_ONLY], True, FASTEST_SHAPES)
            with ExitStack() as canonical:
                cloud, addresses = verifier(SPLIT_SHAPES, True, canonical)
                progress(f"reference: {len(work)} sessions decoded alone, cloud-only, {SPLIT_SHAPES} shapes")
                timed = [cloud_only_session(addresses[0], s, vocab, max_new_tokens, temperature) for s in work]
                reference = [t[0] for t in timed]
                reproducible_lone = statistics.median(_rate(t) for t in timed[:len(lone)])
                progress(f"recording the real drafter's blocks ({mode}, D={draft_len})")
                recordings[mode], alpha = record_drafts(real, addresses[0], work, vocab, max_new_tokens, draft_len,
                                                        temperature)
                measure(cloud, addresses, [mode, *[CLOUD_ONLY] * compare_free_shapes], True, SPLIT_SHAPES)
            if compare_free_shapes:
                measure(free_cloud, free_addresses, [mode], True, FASTEST_SHAPES)
        if compare_unbatched:
            for shapes, kind in ((FASTEST_SHAPES, CLOUD_ONLY), (SPLIT_SHAPES, mode)):
                with ExitStack() as per_cloud:
                    measure(*verifier(shapes, False, per_cloud), [kind], False, shapes)
    for run, outputs in measured:
        run["identical"] = not run["errors"] and all(o is not None and o == reference[i] for i, o in enumerate(outputs))
    runs = sorted((run for run, _ in measured),
                  key=lambda r: (not r["batching"], r["sessions"], r["mode"] != CLOUD_ONLY, r["shapes"]))
    return {
        "slo_tokens_per_s": chosen,
        "slo_fraction": None if slo is not None else slo_fraction,  # None: the SLO was given (--slo)
        "fastest_cloud_only_alone": {"shapes": FASTEST_SHAPES, "tokens_per_s": fastest_lone, "sessions": len(lone)},
        "reproducible_cloud_only_alone": {"shapes": SPLIT_SHAPES, "tokens_per_s": reproducible_lone,
                                          "sessions": len(lone)},
        "compared_shapes": {CLOUD_ONLY: compared_shapes(CLOUD_ONLY), mode: compared_shapes(mode)},
        "capacity_at_slo": capacity_at_slo(runs, chosen),
        "drafter": "recorded real drafts replayed (llama.cpp, lock-step, fixed D)",
        "acceptance": {mode: alpha},
        "draft_len": draft_len,
        "max_new_tokens": max_new_tokens,
        "verifier_cores": sorted(cores) if cores else None,
        "verifier_flags": list(cloud_args),
        "scenario": scenario,
        "runs": runs,
    }


def bench_models(target: str | None, drafter: str | None, tiny: bool, tmp: str) -> tuple[str, str | None]:
    if tiny:
        from sim.fixtures.tiny_models import write_tiny_models

        paths = write_tiny_models(tmp, seed=0)
        return paths["target"], paths["drafter_noisy"]
    from cloud.models import resolve_target

    if target is not None and drafter is None:
        raise ValueError("a target needs a matching drafter GGUF (--drafter)")
    return str(resolve_target(target)), drafter


def first_core() -> set[int] | None:
    import os

    try:
        return {sorted(os.sched_getaffinity(0))[0]}
    except AttributeError:  # pragma: no cover - not Linux
        return None


@contextmanager
def edges_off(cores: set[int] | None):
    """Keep this process (the edges) off the verifier's ``cores`` while the context lasts."""
    import os

    try:
        mine = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        yield
        return
    others = mine - (cores or set())
    if cores and others:
        os.sched_setaffinity(0, others)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def _links(scenario: str | None, port: int, count: int, stack: ExitStack) -> list[str]:
    if scenario is None:
        return []
    from sim.experiment.processes import BackgroundLink
    from sim.link.scenario import load_scenario

    link = load_scenario(scenario).link
    return [stack.enter_context(BackgroundLink(link, port)).address for _ in range(count)]


def session_params(seed: int, temperature: float):
    """A session's sampling: greedy at temperature 0, else coupled with its own seed (split and
    cloud-only alike, so both must produce target-only's tokens)."""
    from shared.params import Mode, SamplingParams

    if temperature == 0:
        return SamplingParams(mode=Mode.GREEDY)
    return SamplingParams(mode=Mode.COUPLED, temperature=temperature, seed=seed)


def cloud_only_session(address: str, session: BenchSession, vocab, max_new_tokens: int, temperature: float):
    from edge.cloud_only import cloud_only_generate
    from edge.endpoint import VerifierEndpoint

    started = time.perf_counter()
    result = cloud_only_generate(VerifierEndpoint(address, *vocab), session.prompt,
                                 session_params(session.seed, temperature), max_new_tokens=max_new_tokens)
    return result.tokens, started, time.perf_counter()


def split_session(address: str, session: BenchSession, vocab, drafter, max_new_tokens: int, draft_len: int,
           temperature: float):
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier

    link = GrpcVerifier(VerifierEndpoint(address, *vocab))
    started = time.perf_counter()
    result = run_decode(drafter, link, session.prompt, session_params(session.seed, temperature),
                        max_new_tokens=max_new_tokens, draft_len=draft_len)
    return result.tokens, started, time.perf_counter(), result.stats


def record_drafts(real, address, work, vocab, max_new_tokens, draft_len, temperature):
    """Each session decoded alone with the real drafter: the blocks it proposed, and its acceptance."""
    blocks: dict = {}
    drafted = accepted = 0
    for session in work:
        recorder = RecordingDrafter(real)
        _, _, _, stats = split_session(address, session, vocab, recorder, max_new_tokens, draft_len, temperature)
        blocks.update(recorder.blocks)
        drafted += stats.drafted
        accepted += stats.accepted
    return blocks, accepted / drafted if drafted else 0.0


def _rate(session_result) -> float:
    """A session's tokens/s, from ``cloud_only_session``'s or ``split_session``'s (tokens, started, ended, ...)."""
    tokens, started, ended = session_result[:3]
    return len(tokens) / (ended - started)


def _measure(cloud, addresses, work, vocab, mode, blocks, max_new_tokens, draft_len, temperature,
             batching) -> tuple[dict[str, Any], list]:
    """N = len(work) sessions at once: the run's entry of the report (all but ``identical``, which the
    caller sets against the reference) and each session's tokens (None where it failed)."""
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
