"""``splitspec bench fairness``: honest edges beside attacking clients, on the verifier as shipped and as it was.

One in-process verifier on loopback. ``honest`` edges (each its own bearer token) replay a real
drafter's blocks (recorded in process first, greedy, so the drafter's CPU time is not in the timed
runs) through ``run_decode`` over ``GrpcVerifier``: alone, then beside ``attackers`` identities (their
own tokens) each running every one of ``strategies`` at once (``sim.bench.attackers``: garbage drafts at
the largest D and window, salami blocks, slow readers, keep-alive streams, 1 MiB frame floods, made-up
tokens), in a process of their own (their client-side work does not share the verifier's interpreter).
The honest round starts once the verifier has judged every drafting attacker (``CAP_AFTER_DRAFTS``
drafts verified) and the holding ones have held their streams past the idle timeout. Two verifiers: as
shipped (fair share, caps) and one that packs verifies oldest first with no cap (the rule before fair
share: ``oldest_first``).

Each verifier (alone, as shipped, oldest first) is a fresh server in the same harness (the RSS and log
watch, the attackers' core kept apart), and its honest tokens/s is the median of ``rounds`` honest rounds
(one round is a few tenths of a second on the tiny models: a single one moved ±15% from run to run, and
the first round on a fresh server ran slower than the rest).

Reported: the honest tokens/s each way (median, and every round's) and the refusals they met; the attackers' share of verify rows
in forwards where both waited, against a max-min fair share this bench computes itself from what each
client waited with in each such forward (not the allocator's own figure, so the check can fail) and
against an equal share per client; the verifier process's RSS growth over the attack; the most rows
any forward fed against ``--max-batch-rows``; the log records with a traceback; and whether every
honest output equals target-only decoding. The tiny target's forwards take about a millisecond, so
nothing would queue: each forward is held ``forward_ms`` plus ``row_ms`` per row, as a big target's
would be (rows cost time, which is what the attackers exploit).

Contract. ``run_fairness_bench(FairnessBench(...))`` returns the report dict; no argparse,
no printing (flags are in ``sim.commands.bench.fairness``).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from edge.schedule import SpecConfig
from sim.bench.attackers import STRATEGIES, AttackTarget, GarbageDrafter

__all__ = ["FairnessBench", "GarbageDrafter", "run_fairness_bench"]

_PROMPTS = ["The cat sat", "We have 3 dogs", "It was the best of times", "Hello there", "A dog ran up",
            "She said no", "The sun is red", "I see a big cat"]


@dataclass(frozen=True)
class FairnessBench:
    """What ``run_fairness_bench`` runs (``splitspec bench fairness``'s flags)."""

    honest: int = 4  # honest edges
    attackers: int = 2  # attacking identities, each running every one of ``strategies`` at once
    strategies: tuple[str, ...] = ("garbage",)  # ``sim.bench.attackers.STRATEGIES`` names
    streams: int = 8  # streams each holding strategy (slow readers, keep-alive, floods) keeps open
    max_new_tokens: int = 32  # per honest edge
    draft_len: int = 4  # the honest edges' D
    max_draft_len: int = 16  # the verifier's largest D: the attackers'
    max_blocks_in_flight: int = 4  # the verifier's window: the attackers'
    rounds: int = 5  # honest rounds per verifier; its tokens/s is their median
    forward_ms: float = 5.0  # each forward held this long, as a big target's
    row_ms: float = 0.2  # ... plus this per row
    timeout_s: float = 120.0

    def checked(self) -> FairnessBench:
        if self.honest < 1 or self.attackers < 0 or self.max_new_tokens < 1 or self.draft_len < 1 or self.rounds < 1:
            raise ValueError("need honest >= 1, attackers >= 0, max_new_tokens >= 1, draft_len >= 1, rounds >= 1")
        unknown = sorted(set(self.strategies) - set(STRATEGIES))
        if unknown or not self.strategies:
            raise ValueError(f"strategies must be among {', '.join(STRATEGIES)}, got {', '.join(unknown) or 'none'}")
        return self


HOLDING = {"slow_reader", "keep_alive", "flood"}  # strategies that hold streams rather than draft
DRAFTING = {"garbage", "salami"}  # ... that draft, and are judged by the ledger


def run_fairness_bench(bench: FairnessBench) -> dict[str, Any]:
    """The report; tiny generated models on CPU. ValueError on a bad count or strategy."""
    from cloud.limits import ServiceLimits

    bench = bench.checked()
    with tempfile.TemporaryDirectory(prefix="splitspec-fairness-") as tmp, _cores_apart() as attacker_core:
        run = _FairnessRun(bench, tmp)
        run.attacker_core = attacker_core
        limits = ServiceLimits(max_draft_len=bench.max_draft_len, max_blocks_in_flight=bench.max_blocks_in_flight)
        alone = run.measured(limits, fair=True, attack=False)
        fair = run.measured(limits, fair=True)
        oldest = run.measured(replace(limits, capped_draft_len=0), fair=False)
    return {
        "honest": bench.honest,
        "attackers": bench.attackers,
        "strategies": list(bench.strategies),
        "max_new_tokens": bench.max_new_tokens,
        "rounds": bench.rounds,
        "honest_tok_s_alone": alone["tok_s"],
        "honest_tok_s_with_attackers": fair["tok_s"],
        "honest_ratio": fair["tok_s"] / alone["tok_s"],
        "honest_rounds_tok_s": {"alone": alone["rounds_tok_s"], "with_attackers": fair["rounds_tok_s"],
                                "oldest_first": oldest["rounds_tok_s"]},
        "honest_refused": alone["refused"] + fair["refused"],
        "attacker_row_share": fair["row_share"],
        "fair_row_share": fair["owed_share"],
        "independent_fair_row_share": fair["independent_share"],
        "equal_row_share": bench.attackers / (bench.honest + bench.attackers),
        "contended_rows": fair["contended_rows"],
        "rss_growth_mb": fair["rss_growth_mb"],
        "max_forward_rows": fair["max_forward_rows"],
        "max_batch_rows": limits.max_batch_rows,
        "tracebacks": fair["tracebacks"],
        "identical": alone["identical"] and fair["identical"] and oldest["identical"],
        "attackers_capped": fair["attackers_capped"],
        "honest_capped": fair["honest_capped"],
        # The same attack on the rule before fair share and caps (verifies packed oldest first):
        "oldest_first": {"honest_tok_s_with_attackers": oldest["tok_s"], "honest_ratio": oldest["tok_s"] / alone["tok_s"],
                         "attacker_row_share": oldest["row_share"], "honest_refused": oldest["refused"]},
    }


def max_min_shares(demands: dict[str, int], capacity: int) -> dict[str, float]:
    """Water-filling: each client gets its demand or an equal split of what is left, whichever is less.
    Written here on purpose, not imported from ``cloud.fair_share``: the bench judges the allocator by a
    share it computes itself."""
    left, shares = float(capacity), {}
    waiting = sorted(demands, key=demands.__getitem__)
    for i, client in enumerate(waiting):
        shares[client] = min(float(demands[client]), left / (len(waiting) - i))
        left -= shares[client]
    return shares


def independent_share(log, max_rows: int, is_attacker) -> float:
    """The attackers' max-min fair share of the rows of ``log``'s contended forwards ((demands, got)
    per forward), each forward's capacity being what it could feed: ``max_rows`` or the demand."""
    owed = total = 0.0
    for demands, _got in log:
        shares = max_min_shares(demands, min(max_rows, sum(demands.values())))
        owed += sum(v for c, v in shares.items() if is_attacker(c))
        total += sum(shares.values())
    return owed / total if total else 0.0


class _FairnessRun:
    """The tiny target (its forwards held as a big one's), the honest edges' recorded blocks and
    target-only outputs, and the rounds run against verifiers on loopback."""

    def __init__(self, bench: FairnessBench, tmp: str) -> None:
        from cloud.engine import TargetEngine
        from cloud.identity import Credentials
        from edge.llama_drafter import LlamaDrafter
        from shared.params import Mode, SamplingParams
        from sim.bench.bench_sessions import RecordingDrafter
        from sim.fixtures.tiny_models import write_tiny_models
        from sim.inprocess import generate

        self.bench = bench
        self.attacker_core: int | None = None  # where the attackers' process runs (``_cores_apart``)
        # Every edge its own client (its token is its name: loopback only), each a share of the verifier.
        names = [f"honest-{i}" for i in range(bench.honest)] + [f"attacker-{j}" for j in range(bench.attackers)]
        self.credentials = Credentials({name: name for name in names})
        self.params = SamplingParams(mode=Mode.GREEDY, temperature=0.0)
        paths = write_tiny_models(tmp)
        self.engine = TargetEngine(paths["target"])
        recorder = RecordingDrafter(LlamaDrafter(paths["drafter_noisy"], n_ctx=2048, n_threads=1))
        try:
            self.prompts = [recorder.inner.vocab.tokenize(_PROMPTS[i % len(_PROMPTS)] + " " * (i // len(_PROMPTS)))
                            for i in range(bench.honest)]
            self.want = [generate(self.engine, recorder.inner, p, self.params, max_new_tokens=bench.max_new_tokens,
                                  spec=SpecConfig(0)).tokens for p in self.prompts]
            for p in self.prompts:
                generate(self.engine, recorder, p, self.params, max_new_tokens=bench.max_new_tokens,
                         spec=SpecConfig(bench.draft_len))
        finally:
            recorder.close()
        self.blocks = recorder.blocks
        forward_batch = self.engine.forward_batch

        def held_forward(items):  # (on the engine thread) a big target's cost, on the tiny one's logits
            out = forward_batch(items)
            time.sleep(1e-3 * (bench.forward_ms + bench.row_ms * sum(item.rows for item in items)))
            return out

        self.engine.forward_batch = held_forward

    def connect(self, server, token: str):
        from edge.endpoint import VerifierEndpoint
        from edge.grpc_verifier import GrpcVerifier

        verifier = GrpcVerifier(VerifierEndpoint(server.address, self.engine.vocab_size, self.engine.fingerprint,
                                                 auth_token=token))
        verifier.connect()
        return verifier

    def honest_round(self, server) -> dict[str, Any]:
        """Every honest edge at once, replaying its recorded blocks: their tokens/s together, outputs, and
        the refusals they met (each a message)."""
        from edge.decode_loop import run_decode
        from sim.bench.bench_sessions import ReplayDrafter

        bench, got, refused = self.bench, [None] * self.bench.honest, []

        def edge(i: int) -> None:
            try:
                verifier = self.connect(server, f"honest-{i}")
                got[i] = run_decode(ReplayDrafter(self.blocks, self.engine.vocab_size), verifier, self.prompts[i],
                                    self.params, max_new_tokens=bench.max_new_tokens,
                                    spec=SpecConfig(bench.draft_len)).tokens
                verifier.close()
            except Exception as exc:  # noqa: BLE001 - a refusal is what the bench counts
                refused.append(f"honest-{i}: {type(exc).__name__}: {exc}")

        started = time.perf_counter()
        threads = [threading.Thread(target=edge, args=(i,)) for i in range(bench.honest)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(bench.timeout_s)
        wall = time.perf_counter() - started
        return {"tok_s": sum(len(g or []) for g in got) / wall, "got": got, "refused": refused}

    def targets(self, server) -> list[AttackTarget]:
        bench = self.bench
        return [AttackTarget(server.address, self.engine.vocab_size, self.engine.fingerprint,
                             self.prompts[j % bench.honest], self.want[j % bench.honest], self.params,
                             bench.max_draft_len, bench.max_blocks_in_flight, bench.streams, bench.max_new_tokens)
                for j in range(bench.attackers)]

    def measured(self, limits, fair: bool, attack: bool = True) -> dict[str, Any]:
        """``rounds`` honest rounds on a fresh verifier, beside the attackers where ``attack`` (``fair``: shares
        and caps as shipped; else verifies packed oldest first, no cap: the rule before fair share)."""
        import multiprocessing
        import statistics

        from cloud.server import BackgroundServer, ServerConfig

        bench = self.bench
        with BackgroundServer(self.engine, ServerConfig(port=0, limits=limits, credentials=self.credentials)) as server, \
                _Watch() as watch:
            scheduler = server.server.servicer.scheduler
            scheduler.fair = fair
            spawn = multiprocessing.get_context("spawn")
            stop = spawn.Event()
            attackers = spawn.Process(target=run_attackers, daemon=True,
                                      args=(self.targets(server), bench.strategies, stop, self.attacker_core))
            if attack:
                attackers.start()
            try:
                if attack:
                    self._wait_until_judged(scheduler, limits)
                # What the honest rounds contend with, from here (the attackers contended among themselves before).
                stats = scheduler.stats
                rows_before, owed_before = dict(stats.contended_rows), dict(stats.contended_owed)
                stats.contended_log.clear()
                rounds = [self.honest_round(server) for _ in range(bench.rounds)]
                rows = {c: n - rows_before.get(c, 0) for c, n in stats.contended_rows.items()}
                owed = {c: n - owed_before.get(c, 0.0) for c, n in stats.contended_owed.items()}
                log = list(stats.contended_log)
            finally:
                stop.set()
                if attack:
                    attackers.join(bench.timeout_s)
                    if attackers.is_alive():
                        attackers.kill()
            ledger = scheduler.ledger  # (every attacker stopped: read from this thread)
            bad = [c for c in rows if c.startswith("client:attacker-")]
            rates = [r["tok_s"] for r in rounds]
            return {
                "tok_s": statistics.median(rates), "rounds_tok_s": [round(r, 1) for r in rates],
                "identical": all(r["got"] == self.want for r in rounds),
                "refused": [message for r in rounds for message in r["refused"]],
                "row_share": sum(rows[c] for c in bad) / (sum(rows.values()) or 1),
                "owed_share": sum(owed.get(c, 0.0) for c in bad) / (sum(owed.values()) or 1.0),
                "independent_share": independent_share(log, limits.max_batch_rows,
                                                       lambda c: c.startswith("client:attacker-")),
                "contended_rows": sum(rows.values()),
                "max_forward_rows": scheduler.stats.max_rows,
                "rss_growth_mb": watch.rss_growth_mb(), "tracebacks": watch.tracebacks,
                "attackers_capped": sum(ledger.capped(f"client:attacker-{j}") for j in range(bench.attackers)),
                "honest_capped": sum(ledger.capped(f"client:honest-{i}") for i in range(bench.honest)),
            }

    def _wait_until_judged(self, scheduler, limits) -> None:
        """Until every drafting attacker has flooded long enough to be judged (the ledger has seen
        ``CAP_AFTER_DRAFTS`` of its drafts: a fixed head start was too short on some machines, and the
        round then measured attackers the verifier had not yet weighed), and the holding ones have held
        their streams past the idle timeout (what they would hold, they hold by then)."""
        from cloud.fair_share import CAP_AFTER_DRAFTS

        bench = self.bench
        drafting = bench.attackers if DRAFTING & set(bench.strategies) else 0
        held_s = limits.idle_timeout_s + 1.0 if HOLDING & set(bench.strategies) else 0.0

        def judged() -> bool:  # (on the engine thread, which alone reads the ledger)
            return all(scheduler.ledger.drafts_seen(f"client:attacker-{j}") >= CAP_AFTER_DRAFTS
                       for j in range(drafting))

        flooding_since = time.monotonic()
        while not scheduler.submit(judged).result(bench.timeout_s) or time.monotonic() - flooding_since < held_s:
            if time.monotonic() - flooding_since > bench.timeout_s:
                raise RuntimeError(f"the attackers were not judged within {bench.timeout_s:.0f} s")
            time.sleep(0.05)


ATTACKER_CORE = -1  # the attackers' process runs on the last core; the verifier and honest edges on the rest


@contextmanager
def _cores_apart():
    """Where there are two cores or more, this process (the verifier and the honest edges, alone and
    attacked alike) on all but the last for the block, which it yields for the attackers (else None):
    the attackers' own CPU is not the verifier's."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        yield None
        return
    _pin(set(cores[:ATTACKER_CORE]))
    try:
        yield cores[ATTACKER_CORE]
    finally:
        _pin(set(cores))


def _pin(cores: set[int]) -> None:
    """Every thread of this process on ``cores`` (Linux sets affinity per thread)."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except OSError:  # (a thread that ended meanwhile)
            pass


def run_attackers(targets: list[AttackTarget], strategies: tuple[str, ...], stop, core: int | None = None) -> None:
    """(In a process of its own, on ``core`` when given.) Every identity of ``targets`` runs every
    strategy at once until ``stop``."""
    if core is not None:
        _pin({core})
    threads = [threading.Thread(target=STRATEGIES[name], args=(target, f"attacker-{j}", stop), daemon=True)
               for j, target in enumerate(targets) for name in strategies]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(30)


class _Watch:
    """While open: the process's RSS (its most, against what it was at the start, sampled every 0.2 s)
    and the log records that carry a traceback."""

    def __enter__(self) -> _Watch:
        import logging

        import psutil

        self._process = psutil.Process()
        self._start = self._peak = self._process.memory_info().rss
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        self.tracebacks: list[str] = []
        watch = self

        class Tracebacks(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.exc_info or "Traceback" in record.getMessage():
                    watch.tracebacks.append(f"{record.name}: {record.getMessage()[:200]}")

        self._handler = Tracebacks(level=logging.DEBUG)
        logging.getLogger().addHandler(self._handler)
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.2):
            self._peak = max(self._peak, self._process.memory_info().rss)

    def rss_growth_mb(self) -> float:
        return round((self._peak - self._start) / 2**20, 1)

    def __exit__(self, *exc) -> None:
        import logging

        self._done.set()
        self._sampler.join(1)
        logging.getLogger().removeHandler(self._handler)
