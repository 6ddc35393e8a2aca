"""Live sessions of the verifier: a bounded table that one client cannot fill.

A session is *attached* while a stream drives it and *parked* when its
stream broke: a parked session stays resumable by its ticket for ``ttl_s``.
The ticket's owner may also take over an attached session (its edge
reconnected before the server noticed the old stream was dead); each attach
bumps the entry's ``stream`` number, and a stream acts on its session only
while the number is still its own.
The table never holds more than ``max_sessions`` entries. When it is full, a
new session evicts the longest-parked one (a parked session is only a
convenience: its edge can reopen with its committed tokens); failing that, it
*preempts* an attached session that holds its slot without using it: attached
for at least ``window_s`` and fewer than ``min_tokens`` tokens committed in the
last ``window_s`` (a stream that sends a keep-alive block now and then). A
preempted session is dropped and its stream ends at its next step; its edge
reopens with its committed tokens. Failing that too, slots are shared
max-min among owners: a new session of an owner holding at least two fewer
than the owner holding the most preempts one of that owner's (the one that
committed least lately), so identities that fill the table among them cannot
keep another out. Only a table whose owners hold about equal shares, every
session in use, can refuse. No owner (a verified identity,
``cloud.identity``) holds more than ``max_per_owner`` entries, attached or
parked, nor reserves more than its share of KV bytes (``kv_share``). Each
session reserves its worst-case KV cache (prompt plus new tokens) against
``max_tokens``; a reservation that does not fit evicts parked
sessions first, then is refused. Everything here is bookkeeping: no I/O, and
the clock is injectable.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cloud.session import VerifierSession
from shared.wire import session_id_of

__all__ = ["SessionTable", "SessionEntry", "TableFull"]


class TableFull(RuntimeError):
    """No room for another session (the table, or the owner's share of it)."""


@dataclass
class SessionEntry:
    session_id: str
    ticket: bytes
    session: VerifierSession
    owner: str = ""
    attached: bool = True  # a stream is driving it
    stream: int = 0  # bumped on every attach: the stream that holds the current number drives the session
    tokens: int = 0  # KV cache positions reserved (prompt + max new tokens)
    last_active: float = field(default_factory=time.monotonic)
    attached_at: float = field(default_factory=time.monotonic)  # when its current stream took it
    commits: deque = field(default_factory=deque)  # (time, tokens) of its recent verdicts that committed any
    preempted: bool = False  # dropped to make room while attached: its stream ends at its next step

    def committed_since(self, since: float) -> int:
        """Tokens its verdicts committed from ``since`` on (those before are forgotten)."""
        while self.commits and self.commits[0][0] < since:
            self.commits.popleft()
        return sum(tokens for _, tokens in self.commits)


class SessionTable:
    def __init__(
        self,
        max_sessions: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_per_owner: int | None = None,
        max_tokens: int | None = None,
        keep_slot: tuple[float, int] = (5.0, 4),
        kv_share: tuple[int, int] = (0, 0),
    ) -> None:
        """``keep_slot``: (``window_s``, ``min_tokens``), what an attached session must commit to
        keep its slot when the table is full (``min_tokens`` 0: never preempt). ``kv_share``: (KV bytes a
        position costs, KV bytes one owner's sessions may reserve together; either 0: no bound)."""
        self.max_sessions = max_sessions
        self.window_s, self.min_tokens = keep_slot
        self.kv_bytes_per_position, self.max_kv_bytes_per_owner = kv_share
        self.max_per_owner = max_per_owner or max_sessions
        self.max_tokens = max_tokens  # KV positions all sessions may reserve (None: no budget)
        self.ttl_s = ttl_s
        self._clock = clock
        self._by_ticket: dict[bytes, SessionEntry] = {}
        self.evicted = 0  # parked sessions dropped to make room
        self.preempted = 0  # attached sessions that held a slot unused, dropped to make room

    def __len__(self) -> int:
        return len(self._by_ticket)

    def entries(self) -> list[SessionEntry]:
        """The sessions held now, attached or parked."""
        return list(self._by_ticket.values())

    @property
    def parked(self) -> int:
        return sum(not e.attached for e in self._by_ticket.values())

    @property
    def reserved_tokens(self) -> int:
        return sum(e.tokens for e in self._by_ticket.values())

    def reserve(self, owner: str = "", tokens: int = 0) -> None:
        """Make room for a session of ``owner`` reserving ``tokens`` KV positions, or raise ``TableFull``.

        Reaps expired sessions, then makes room (``_make_room``) among the
        owner's own sessions when the owner is at its share, and among anyone's
        when the table or the token budget is full.
        """
        self.reap()
        mine = [e for e in self._by_ticket.values() if e.owner == owner]
        if len(mine) >= self.max_per_owner and not self._make_room(mine):
            raise TableFull(
                f"this client already drives {len(mine)} sessions, the limit per client; finish or close one first"
            )
        if (len(self._by_ticket) >= self.max_sessions and not self._make_room(list(self._by_ticket.values()))
                and not self._take_from_the_largest(owner)):
            raise TableFull(f"the verifier is at its limit of {self.max_sessions} sessions; retry later")
        self._fit_owner_bytes(owner, tokens)
        self._fit_tokens(tokens, owner=owner)

    def resize(self, entry: SessionEntry, tokens: int) -> None:
        """``entry`` now reserves ``tokens`` KV positions (a conversation's next turn), or ``TableFull``."""
        self._fit_owner_bytes(entry.owner, tokens, keep=entry)
        self._fit_tokens(tokens, keep=entry)
        entry.tokens = tokens

    def _fit_owner_bytes(self, owner: str, tokens: int, keep: SessionEntry | None = None) -> None:
        """Room in ``owner``'s KV share for a reservation of ``tokens`` positions beside its sessions but
        ``keep`` (``_make_room`` among them)."""
        per_position, most = self.kv_bytes_per_position, self.max_kv_bytes_per_owner
        if not (per_position and most):
            return
        if tokens * per_position > most:
            raise TableFull(f"a session reserving {tokens} KV positions needs {_mib(tokens * per_position)} of KV "
                            f"cache, over this client's share of {_mib(most)}; ask for fewer new tokens or a "
                            "shorter prompt")

        def mine() -> list[SessionEntry]:
            return [e for e in self._by_ticket.values() if e.owner == owner and e is not keep]

        while (sum(e.tokens for e in mine()) + tokens) * per_position > most:
            if not self._make_room(mine()):
                used = sum(e.tokens for e in mine()) * per_position
                raise TableFull(f"this client's sessions reserve {_mib(used)} of KV cache and this one needs "
                                f"{_mib(tokens * per_position)}: its share is {_mib(most)}; finish or close one first")

    def _fit_tokens(self, tokens: int, keep: SessionEntry | None = None, owner: str = "") -> None:
        """Room for a reservation of ``tokens`` beside every session but ``keep`` (``_make_room``)."""
        if self.max_tokens is None:
            return
        if tokens > self.max_tokens:
            raise TableFull(f"a session reserving {tokens} KV positions exceeds the verifier's budget of "
                            f"{self.max_tokens}; ask for fewer new tokens or a shorter prompt")

        def others() -> list[SessionEntry]:
            return [e for e in self._by_ticket.values() if e is not keep]

        while sum(e.tokens for e in others()) + tokens > self.max_tokens:
            if not self._make_room(others()) and not self._take_from_the_largest(keep.owner if keep else owner,
                                                                                  keep):
                raise TableFull(f"the verifier's KV cache budget is full ({self.reserved_tokens} of "
                                f"{self.max_tokens} positions reserved); retry later or ask for fewer new tokens")

    def add(self, session: VerifierSession, owner: str = "", tokens: int = 0) -> SessionEntry:
        """Keep ``session`` for ``owner``, reserving ``tokens`` KV positions; ``TableFull`` if no room."""
        self.reserve(owner, tokens)
        ticket = secrets.token_bytes(16)
        entry = SessionEntry(
            session_id=session_id_of(ticket), ticket=ticket, session=session, owner=owner,
            tokens=tokens,
        )
        entry.last_active = entry.attached_at = self._clock()
        self._by_ticket[entry.ticket] = entry
        return entry

    def resume(self, ticket: bytes, owner: str | None = None) -> SessionEntry | None:
        """Attach an unexpired session by its ticket (and, when given, its owner) to a new stream.

        A session still attached is taken over: the old stream is dead or
        about to be, and its number (``stream``) no longer matches.
        """
        self.reap()
        entry = self._by_ticket.get(bytes(ticket))
        if entry is None or (owner is not None and entry.owner != owner):
            return None
        entry.attached = True
        entry.stream += 1
        entry.last_active = entry.attached_at = self._clock()
        return entry

    def touch(self, entry: SessionEntry, committed: int = 0) -> None:
        """``entry`` took a step that committed ``committed`` tokens."""
        entry.last_active = self._clock()
        if committed:
            entry.commits.append((entry.last_active, committed))

    def detach(self, entry: SessionEntry) -> None:
        """The stream ended without finishing: park the session for ``ttl_s``."""
        entry.attached = False
        entry.last_active = self._clock()

    def remove(self, entry: SessionEntry) -> None:
        self._by_ticket.pop(entry.ticket, None)

    def reap(self) -> int:
        """Drop parked sessions idle past the TTL; returns how many."""
        now = self._clock()
        expired = [t for t, e in self._by_ticket.items() if not e.attached and now - e.last_active > self.ttl_s]
        for ticket in expired:
            del self._by_ticket[ticket]
        return len(expired)

    def _take_from_the_largest(self, owner: str, keep: SessionEntry | None = None) -> bool:
        """Slots shared max-min among owners: when ``owner`` holds at least two sessions fewer than the
        owner holding the most, preempt that owner's session that committed least lately (``keep``
        spared). False when no owner holds that many more."""
        counts: dict[str, int] = {}
        for entry in self._by_ticket.values():
            counts[entry.owner] = counts.get(entry.owner, 0) + 1
        largest = max(counts, key=counts.__getitem__, default=None)
        if largest is None or counts[largest] < counts.get(owner, 0) + 2:
            return False
        since = self._clock() - self.window_s
        victims = [e for e in self._by_ticket.values() if e.owner == largest and e is not keep]
        if not victims:
            return False
        self._preempt(min(victims, key=lambda e: (e.committed_since(since), e.last_active)))
        return True

    def _preempt(self, victim: SessionEntry) -> None:
        self.remove(victim)
        victim.preempted = True
        victim.stream += 1  # its stream verifies nothing more (``BlockStream``)
        self.preempted += 1

    def _make_room(self, entries: list[SessionEntry]) -> bool:
        """Drop one of ``entries``: the longest-parked, else the attached one that commits least while
        under ``min_tokens`` a window; False when every one is in use."""
        parked = [e for e in entries if not e.attached]
        if parked:
            self.remove(min(parked, key=lambda e: e.last_active))
            self.evicted += 1
            return True
        now = self._clock()
        idle = {id(e): e.committed_since(now - self.window_s) for e in entries
                if self.min_tokens and now - e.attached_at >= self.window_s}
        idle = {key: tokens for key, tokens in idle.items() if tokens < self.min_tokens}
        if not idle:
            return False
        self._preempt(min((e for e in entries if id(e) in idle), key=lambda e: (idle[id(e)], e.last_active)))
        return True


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
