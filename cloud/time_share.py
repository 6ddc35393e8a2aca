"""Fair share of the verifier's time across forwards: what each client's rows cost, and who waits a turn.

``cloud.fair_share`` shares one forward's ``max_rows`` among the clients waiting; while their rows fit
(the usual case), it lets every row in, so a client that sends long blocks makes every forward, and so
every other client's verdict, slower by what its rows cost. Where rows cost time (a CPU, a GPU past its
ridge), that is the share that matters. Here each client has a virtual clock (start-time fair queuing): a
forward charges each client in it its part of the forward's time, the fixed part split evenly among the
clients in it and the per-row part by its rows (``ForwardCost``, fitted to the forwards measured), over
the client's weight (``ClientLedger.weight``: what its rows commit); a client whose clock runs more than
a quantum (a forward's cost) ahead of the least-served client waiting sits this forward out. Rows
that cost nothing (a GPU below its ridge) charge every client in a forward alike, so nobody waits a turn;
the more rows cost, the more a client's share of forwards follows its share of time. A client that has
been away starts at the clock of the clients waiting (no credit for idle time).

Contract. ``ForwardCost.add(rows, seconds)`` after each forward; ``TimeShare.eligible(waiting, cost)`` the
clients whose items may go into the next forward (never empty when ``waiting`` is not: the least-served
client always may); ``TimeShare.charge(rows_by_client, cost, weights)`` after the forward. Pure: no
clock, no I/O; called on the engine thread only. Remembers ``MAX_CLIENTS`` clients.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from cloud.fair_share import MAX_CLIENTS

__all__ = ["ForwardCost", "TimeShare"]

COST_DECAY = 0.98  # each forward's weight in the fit, per later forward (about the latest 50 count)
MIN_QUANTUM_S = 1e-3  # the quantum when the fit has nothing yet


@dataclass
class ForwardCost:
    """A forward's seconds as ``fixed_s + per_row_s * rows``: least squares over the forwards ``add``ed,
    each weighing ``COST_DECAY`` less per later one. Until rows have varied, all of it is fixed."""

    decay: float = COST_DECAY
    _n: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0

    def add(self, rows: int, seconds: float) -> None:
        d = self.decay
        self._n, self._x, self._y = d * self._n + 1, d * self._x + rows, d * self._y + seconds
        self._xx, self._xy = d * self._xx + rows * rows, d * self._xy + rows * seconds

    @property
    def per_row_s(self) -> float:
        if self._n == 0:
            return 0.0
        spread = self._xx - self._x * self._x / self._n
        if spread <= 1e-9 * max(self._xx, 1.0):
            return 0.0
        return max(0.0, (self._xy - self._x * self._y / self._n) / spread)

    @property
    def fixed_s(self) -> float:
        if self._n == 0:
            return 0.0
        return max(0.0, (self._y - self.per_row_s * self._x) / self._n)


@dataclass
class TimeShare:
    """Each client's virtual clock: verifier seconds charged to it over its weight."""

    max_clients: int = MAX_CLIENTS
    clocks: OrderedDict[str, float] = field(default_factory=OrderedDict)  # least recently charged first
    now: float = 0.0  # the least-served waiting client's clock at the latest forward

    def eligible(self, waiting: Mapping[str, int], cost: ForwardCost) -> set[str]:
        """Of the ``waiting`` clients (the rows each waits with), those no more than a quantum ahead of the
        least served: a forward's cost with the most rows any of them waits with (two clients waiting with
        the same rows are never kept apart by when each arrived). Moves ``now`` to the least-served waiting
        client's clock: a client back from away starts there."""
        if not waiting:
            return set()
        clocks = {c: max(self.clocks.get(c, self.now), self.now) for c in waiting}  # (no credit for time away)
        self.now = min(clocks.values())  # (a client alone moves it too: one that comes back starts there)
        quantum = max(cost.fixed_s + cost.per_row_s * max(waiting.values()), MIN_QUANTUM_S)
        return {c for c, clock in clocks.items() if clock - self.now <= quantum + 1e-12}

    def charge(self, rows: Mapping[str, int], cost: ForwardCost, weights: Mapping[str, float]) -> None:
        """A forward ran ``rows`` for each client in it: each one's part of its cost, over its weight."""
        if not rows:
            return
        fixed = cost.fixed_s / len(rows)
        for client, n in rows.items():
            clock = max(self.clocks.pop(client, self.now), self.now)
            self.clocks[client] = clock + (fixed + cost.per_row_s * n) / max(weights.get(client, 1.0), 1e-3)
        while len(self.clocks) > self.max_clients:  # bounded memory: a forgotten client starts afresh
            self.clocks.popitem(last=False)
