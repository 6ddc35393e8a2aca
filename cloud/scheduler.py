"""The engine thread: continuous batching of many sessions' forwards.

Everything that touches sessions or the engine runs here, one job at a time
between forwards, so sessions need no locks; jobs with the same ``key`` (a
session) run one after another in the order submitted, as on a single
thread, while jobs of different keys share forwards. A job is a callable; when it
returns ``Steps`` (a generator of ``ForwardItem``), the scheduler drives it:
each forward packs the items every waiting job yields, up to ``max_rows``
rows, so many sessions' verifies (and cloud-only decode steps) share one
target forward. Fairness: verify items (all of their logits wanted) go whole,
from the clients whose share of the verifier's time allows them this forward
(``cloud.time_share``: what rows cost here, fitted to the forwards run; the
least-served client waiting always may): of theirs the oldest always, the rest
as ``cloud.fair_share.allot_verifies`` shares ``max_rows`` across clients (a
job's ``client``, weighted by what the client's rows commit: ``ClientLedger``,
fed by the block stream); a prompt is
prefilled in chunks that fill the rows the verifies leave, the oldest prompt
getting at least ``min_prefill_rows`` per forward even past ``max_rows``, so a
long prompt never starves and never stalls the others for more than a chunk.
``batching=False`` runs one item per forward, oldest first (the same work, for comparison).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from cloud.engine import ForwardItem, Steps, TargetEngine
from cloud.fair_share import ClientLedger, allot_oldest_first, allot_verifies, fair_shares
from cloud.time_share import ForwardCost, TimeShare

__all__ = ["Scheduler", "SchedulerStats"]

log = logging.getLogger(__name__)


@dataclass
class SchedulerStats:
    """Batches the scheduler ran: how many, their rows and sequences (for benchmarks and metrics)."""

    forwards: int = 0
    rows: int = 0
    sequences: int = 0
    max_sequences: int = 0
    sequences_histogram: dict[int, int] = field(default_factory=dict)  # sequences per forward -> forwards
    # Forwards where verifies of two or more clients waited: verify rows each client got, and its
    # equal (unweighted) max-min fair share of ``max_rows`` given what every client waited with.
    contended_rows: dict[str, int] = field(default_factory=dict)
    contended_owed: dict[str, float] = field(default_factory=dict)
    # The latest contended forwards as they were: (rows each client waited with, rows each got), for a
    # benchmark to judge the allocator by a fair share it computes itself.
    contended_log: deque = field(default_factory=lambda: deque(maxlen=10_000))
    max_rows: int = 0  # the most rows one forward fed

    def record(self, rows: int, sequences: int) -> None:
        self.forwards += 1
        self.max_rows = max(self.max_rows, rows)
        self.rows += rows
        self.sequences += sequences
        self.max_sequences = max(self.max_sequences, sequences)
        self.sequences_histogram[sequences] = self.sequences_histogram.get(sequences, 0) + 1

    def record_contention(self, rows: dict[str, int], owed: dict[str, float]) -> None:
        for client, n in rows.items():
            self.contended_rows[client] = self.contended_rows.get(client, 0) + n
        for client, n in owed.items():
            self.contended_owed[client] = self.contended_owed.get(client, 0.0) + n


@dataclass
class _Job:
    steps: Steps
    future: Future
    key: object
    client: str = ""  # who the rows are for (the session's owner): verify rows are shared fairly by client
    item: ForwardItem | None = None  # what it waits for
    waiting_since: float = 0.0
    prefilled: int = 0  # tokens of a chunked item already run


class Scheduler:
    """One engine thread; ``run`` awaits a job's result from asyncio, ``submit`` from any thread.
    Jobs of one ``key`` are ordered by the key's identity (the same object), not equality."""

    def __init__(
        self, engine: TargetEngine, *, max_rows: int = 256, min_prefill_rows: int = 32, batching: bool = True,
        on_forward: Callable[..., None] | None = None, fair: bool = True,
    ) -> None:
        """``on_forward(rows=, sequences=, seconds=)`` is called on the engine thread after each forward.
        ``fair=False`` packs verifies oldest first whatever their clients (to compare against)."""
        # A fixed canonical shape (a GPU's, ``TargetEngine.max_forward_rows``) bounds every forward, prefills included.
        self.hard_cap: int | None = getattr(engine, "max_forward_rows", None)
        if self.hard_cap is not None:
            max_rows, min_prefill_rows = min(max_rows, self.hard_cap), min(min_prefill_rows, self.hard_cap)
        if max_rows < 1 or not 0 < min_prefill_rows <= max_rows:
            raise ValueError("need max_rows >= min_prefill_rows >= 1")
        self.engine = engine
        self.max_rows = max_rows
        self.min_prefill_rows = min_prefill_rows
        self.batching = batching
        self.fair = fair
        self.stats = SchedulerStats()
        self.ledger = ClientLedger()  # read and written on the engine thread only
        self.cost = ForwardCost()  # what a forward's rows cost here (engine thread only)
        self.time_share = TimeShare()  # ... and each client's share of that time (engine thread only)
        self.on_forward = on_forward
        self.pending = 0  # jobs submitted and not finished
        self._pending_lock = threading.Lock()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False
        self._stop_lock = threading.Lock()  # a job is either queued before the stop or refused
        self._thread = threading.Thread(target=self._loop, name="target", daemon=True)
        self._thread.start()

    # -- API ----------------------------------------------------------------
    def submit(self, fn: Callable[[], object], key: object = None, client: str = "") -> Future:
        """Run ``fn`` on the engine thread, after every earlier job of the same ``key`` (None: no
        order); if it returns ``Steps``, drive them, their verify rows counted to ``client``. The
        future gets the result."""
        future: Future = Future()
        with self._stop_lock:
            if self._stopped:
                raise RuntimeError("the scheduler is shut down")
            with self._pending_lock:
                self.pending += 1
            future.add_done_callback(lambda _: self._done())
            self._inbox.put((fn, future, key, client))
        return future

    async def run(self, fn: Callable[[], object], key: object = None, client: str = ""):
        return await asyncio.wrap_future(self.submit(fn, key, client))

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking jobs and end the thread after the current forward; jobs not finished by then
        fail with ``RuntimeError`` (the server drains its calls first). ``wait``: join the thread."""
        with self._stop_lock:
            if not self._stopped:
                self._stopped = True
                self._inbox.put(None)
        if wait and self._thread is not threading.current_thread():
            self._thread.join()

    def _done(self) -> None:
        with self._pending_lock:
            self.pending -= 1

    # -- the engine thread ----------------------------------------------------
    def _loop(self) -> None:
        jobs: list[_Job] = []  # started, waiting for a forward
        queued: list[tuple] = []  # (fn, future, key, client) waiting for an earlier job of their key
        while True:
            try:
                arrivals = [self._inbox.get()] if not jobs and not queued else []
                while True:
                    arrivals.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            if None in arrivals:  # nothing can follow the stop in the inbox (``_stop_lock``)
                stopping = RuntimeError("the verifier is shutting down")
                for job in jobs:
                    job.steps.close()
                    job.future.set_exception(stopping)
                for _, future, *_ in [*queued, *(a for a in arrivals if a is not None)]:
                    if future.set_running_or_notify_cancel():
                        future.set_exception(stopping)
                return
            queued.extend(arrivals)
            busy = {id(job.key) for job in jobs if job.key is not None}
            still = []
            for fn, future, key, client in queued:
                if key is not None and id(key) in busy:
                    still.append((fn, future, key, client))
                    continue
                job = self._start(fn, future, key, client)
                if job is not None:
                    jobs.append(job)
                    if key is not None:
                        busy.add(id(key))
            queued = still
            if jobs:
                self._forward(jobs)
                jobs = [job for job in jobs if not job.future.done()]

    def _start(self, fn: Callable[[], object], future: Future, key: object, client: str) -> _Job | None:
        if not future.set_running_or_notify_cancel():
            return None
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)
            return None
        if not inspect.isgenerator(result):
            future.set_result(result)
            return None
        job = _Job(result, future, key, client)
        self._advance(job, None, first=True)
        return job if not future.done() else None

    @staticmethod
    def _advance(job: _Job, logits, first: bool = False) -> None:
        """Send ``logits`` to the job; it yields its next item or finishes."""
        try:
            job.item = next(job.steps) if first else job.steps.send(logits)
            job.waiting_since, job.prefilled = time.perf_counter(), 0
        except StopIteration as done:
            job.future.set_result(done.value)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            job.future.set_exception(exc)

    def _charge(self, chosen: list[tuple[_Job, ForwardItem, bool]], rows: int, seconds: float) -> None:
        """The forward's seconds into the cost fit, and each client's part of them onto its clock."""
        self.cost.add(rows, seconds)
        by_client: dict[str, int] = {}
        for job, item, _ in chosen:
            by_client[job.client] = by_client.get(job.client, 0) + item.rows
        self.time_share.charge(by_client, self.cost, {c: self.ledger.weight(c) for c in by_client})

    def _note_contention(self, demands: dict[str, int], got: list[tuple[str, int]]) -> None:
        rows: dict[str, int] = {}
        for client, n in got:
            rows[client] = rows.get(client, 0) + n
        self.stats.record_contention(rows, fair_shares(demands, self.max_rows))
        self.stats.contended_log.append((demands, rows))

    def _forward(self, jobs: list[_Job]) -> None:
        """One forward over what ``jobs`` wait for, chosen as the module docstring says."""
        order = sorted(jobs, key=lambda job: job.waiting_since)
        if not self.batching:
            order = order[:1]
        chosen: list[tuple[_Job, ForwardItem, bool]] = []  # (job, item to run, whether it finishes the job's item)
        rows = 0
        verifies = [job for job in order if job.item.logits == "all"]  # first: latency-bound, never split
        weights = {job.client: self.ledger.weight(job.client) for job in verifies}
        wanted = [(job.client, job.item.rows) for job in verifies]
        demands: dict[str, int] = {}  # rows each client waits with
        for client, n in wanted:
            demands[client] = demands.get(client, 0) + n
        budget = self.max_rows  # under a hard cap a waiting prompt keeps its minimum: verifies leave it room
        if self.hard_cap is not None and any(job.item.logits != "all" for job in order):
            budget = max(self.max_rows - self.min_prefill_rows, 1)
        if self.fair:
            allowed = self.time_share.eligible(demands, self.cost)
            turn = [job for job in verifies if job.client in allowed]
            allotted = [turn[i] for i in allot_verifies([(job.client, job.item.rows) for job in turn], budget, weights)]
        else:
            allotted = [verifies[i] for i in allot_oldest_first(wanted, budget)]
        for job in allotted:
            chosen.append((job, job.item, True))
            rows += job.item.rows
        if len(weights) > 1:
            self._note_contention(demands, [(job.client, item.rows) for job, item, _ in chosen])
        prompts = 0
        for job in order:  # then prompts, chunked into what is left (the oldest gets a minimum)
            if job.item.logits == "all":
                continue
            room = self.max_rows - rows
            if not prompts:
                room = max(room, self.min_prefill_rows)
            if self.hard_cap is not None:
                room = min(room, self.hard_cap - rows)
            if room <= 0:
                break
            remaining = job.item.tokens[job.prefilled :]
            take = min(len(remaining), room)
            finishes = take == len(remaining)
            chunk = ForwardItem(job.item.seq, remaining[:take], job.item.logits if finishes else "none",
                                reproducible=job.item.reproducible)
            chosen.append((job, chunk, finishes))
            rows += take
            prompts += 1
        started = time.perf_counter()
        try:
            outputs = self.engine.forward_batch([item for _, item, _ in chosen])
        except BaseException as exc:  # noqa: BLE001 - the forward failed: every job in it fails, the thread lives
            log.exception("target forward failed")
            for job, _, _ in chosen:
                job.steps.close()
                job.future.set_exception(exc)
            return
        seconds = time.perf_counter() - started
        self.stats.record(rows, len(chosen))
        self._charge(chosen, rows, seconds)
        if self.on_forward is not None:
            try:
                self.on_forward(rows=rows, sequences=len(chosen), seconds=seconds)
            except Exception:  # noqa: BLE001 - an observer never stops the engine
                log.exception("forward observer failed")
        for (job, item, finishes), logits in zip(chosen, outputs):
            if finishes:
                self._advance(job, logits)
            else:
                job.prefilled += len(item.tokens)
