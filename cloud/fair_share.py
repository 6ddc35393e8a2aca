"""Fair share of a forward's verify rows across clients: the pure choice, and each client's weight.

Contract. ``allot_verifies`` picks which waiting verify items go into one
forward: the oldest always goes; items are never split; every client with
items waiting is owed a weighted max-min fair share of ``max_rows`` (a client
that needs less than its share leaves the rest to the others, by water
filling); each client's items go oldest first while they fit its share, and
rows still free then go to any item that fits, oldest first (no row is left
idle for fairness' sake). A client is the session owner the handshake
computes (a verified identity, ``cloud.identity``). ``ClientLedger`` keeps per client the
committed tokens per verified row over its latest ``WINDOW_ROWS`` rows (the
weight is that, clamped to ``[floor, 1]``: a cloud-only client, which drafts
nothing, weighs 1), and the acceptance of its drafts over its latest
``WINDOW_DRAFTS``; a client whose acceptance is under ``ACCEPTANCE_FLOOR``
over at least ``CAP_AFTER_DRAFTS`` drafts is *capped*: the handshake opens its
new sessions with a shorter draft length (``Opened.max_draft_len``), and the
block stream lowers its open sessions' limit for their blocks of later epochs
(``Verdict.draft_limit``). The ledger remembers the ``MAX_CLIENTS`` clients
recorded most recently. No I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ACCEPTANCE_FLOOR", "CAP_AFTER_DRAFTS", "MAX_CLIENTS", "WINDOW_DRAFTS", "WINDOW_ROWS", "ClientLedger", "allot_oldest_first", "allot_verifies", "fair_shares", "WEIGHT_FLOOR"]

WEIGHT_FLOOR = 0.25  # committed per row: garbage at D=16, window 4 makes ~0.15 (stale decodes included); D=4 all wrong 0.2
WINDOW_ROWS = 512  # a client's weight is read over about its latest this many verified rows
# A client whose drafts are accepted less often than this is capped: garbage is accepted ~never (1 in V),
# the weakest drafter rung measured here (q2_k, coupled) ~0.26 per drafted token.
ACCEPTANCE_FLOOR = 0.1
WINDOW_DRAFTS = 512  # ... read over about its latest this many verified drafts
CAP_AFTER_DRAFTS = 64  # a client is capped only once this many of its drafts were verified (a block is not a trend)
MAX_CLIENTS = 4096  # clients the ledger remembers; the one recorded longest ago is forgotten first


def fair_shares(demands: Mapping[str, int], capacity: int, weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """Weighted max-min fair rows per client (water filling): a client never gets more than its
    demand, and what it leaves is shared among the others by weight. Unknown weights are 1."""
    weights = weights or {}
    left = {c: d for c, d in demands.items() if d > 0}
    shares = {c: 0.0 for c in demands}
    room = float(capacity)
    while left and room > 1e-9:
        total = sum(weights.get(c, 1.0) for c in left)
        per = room / total  # rows per unit of weight this round
        sated = {c for c, d in left.items() if d - shares[c] <= per * weights.get(c, 1.0) + 1e-9}
        if not sated:
            for c in left:
                shares[c] += per * weights.get(c, 1.0)
            break
        for c in sated:
            room -= left[c] - shares[c]
            shares[c] = float(left[c])
            del left[c]
    return shares


def allot_verifies(
    items: Sequence[tuple[str, int]], max_rows: int, weights: Mapping[str, float] | None = None
) -> list[int]:
    """Indices of ``items`` ((client, rows) each, oldest first) that go into one forward, as the
    module docstring says; in the order given."""
    if not items:
        return []
    demands: dict[str, int] = {}
    for client, rows in items:
        demands[client] = demands.get(client, 0) + rows
    shares = fair_shares(demands, max_rows, weights)
    chosen = {0}  # the oldest always goes
    used = items[0][1]
    taken = {items[0][0]: items[0][1]}
    for i, (client, rows) in enumerate(items[1:], start=1):
        if used + rows <= max_rows and taken.get(client, 0) + rows <= shares[client] + 1e-9:
            chosen.add(i)
            used += rows
            taken[client] = taken.get(client, 0) + rows
    for i, (_, rows) in enumerate(items):  # work conserving: what the shares left idle
        if i not in chosen and used + rows <= max_rows:
            chosen.add(i)
            used += rows
    return sorted(chosen)


def allot_oldest_first(items: Sequence[tuple[str, int]], max_rows: int) -> list[int]:
    """Indices of ``items`` ((client, rows) each, oldest first) that go into one forward packed oldest
    first, whatever their clients (the rule before fair share; kept to compare against)."""
    chosen, used = [], 0
    for i, (_, rows) in enumerate(items):
        if not chosen or used + rows <= max_rows:
            chosen.append(i)
            used += rows
    return chosen


@dataclass
class Window:
    """The latest steps' (count, hits), about ``size`` counts' worth (a step weighs by its count)."""

    size: int
    steps: deque[tuple[int, int]] = field(default_factory=deque)
    count: int = 0
    hits: int = 0

    def add(self, count: int, hits: int) -> None:
        if count <= 0:
            return
        self.steps.append((count, hits))
        self.count += count
        self.hits += hits
        while self.count - self.steps[0][0] >= self.size:
            old_count, old_hits = self.steps.popleft()
            self.count -= old_count
            self.hits -= old_hits

    @property
    def rate(self) -> float | None:
        return self.hits / self.count if self.count else None


@dataclass
class ClientStats:
    """One client's verify work, as the ledger and Prometheus observe it."""

    rows: int = 0  # verified rows run for it
    committed: int = 0  # tokens those rows committed
    per_row: Window = field(default_factory=lambda: Window(WINDOW_ROWS))  # (rows, committed) of its latest steps
    acceptance: Window = field(default_factory=lambda: Window(WINDOW_DRAFTS))  # (drafts, accepted) of its latest


@dataclass
class ClientLedger:
    """Per-client acceptance, kept on the engine thread (every ``record`` and ``weight`` runs there), for the
    ``max_clients`` clients recorded most recently."""

    floor: float = WEIGHT_FLOOR
    max_clients: int = MAX_CLIENTS
    clients: OrderedDict[str, ClientStats] = field(default_factory=OrderedDict)  # least recently recorded first

    def record(self, client: str, *, rows: int, committed: int, drafted: int = 0, accepted: int = 0) -> None:
        """A verify step of ``client``'s: ``rows`` verified committed ``committed`` tokens, and of the
        ``drafted`` drafts it verified (live and rebased) ``accepted`` were accepted."""
        if rows <= 0:
            return
        stats = self.clients.get(client)
        if stats is None:
            while len(self.clients) >= self.max_clients:  # bounded memory: a forgotten client starts afresh
                self.clients.popitem(last=False)
            stats = self.clients[client] = ClientStats()
        else:
            self.clients.move_to_end(client)
        stats.rows += rows
        stats.committed += committed
        stats.per_row.add(rows, committed)
        stats.acceptance.add(drafted, accepted)

    def weight(self, client: str) -> float:
        stats = self.clients.get(client)
        per_row = None if stats is None else stats.per_row.rate
        return 1.0 if per_row is None else min(1.0, max(self.floor, per_row))

    def drafts_seen(self, client: str) -> int:
        """How many of ``client``'s verified drafts its acceptance is read over (0: not recorded)."""
        stats = self.clients.get(client)
        return 0 if stats is None else int(stats.acceptance.count)

    def capped(self, client: str) -> bool:
        if self.drafts_seen(client) < CAP_AFTER_DRAFTS:
            return False
        return self.clients[client].acceptance.rate < ACCEPTANCE_FLOOR
