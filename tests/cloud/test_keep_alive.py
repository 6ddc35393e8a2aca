"""Keep-alive streams: a session that does not use its slot cannot keep it from one that would.

Two ways to hold a slot without using it, both cheap for the client: an empty block now and then (each
answered by a one-row forward, so the stream never idles), and stale blocks (answered without a
forward). A stream whose verdicts commit nothing for ``idle_timeout_s`` is parked, however many blocks
it sends; and when the table is full, a session that committed fewer than ``min_tokens_to_keep_slot``
tokens in the last ``idle_timeout_s`` gives its slot to the new session (its stream ends ``ABORTED``,
and its edge reopens with its committed tokens).
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from helpers import greedy_continuation, tiny_prompt

from cloud.limits import ServiceLimits
from cloud.session_table import SessionTable
from protos import splitspec_pb2 as pb
from shared import codec
from shared.params import Mode, SamplingParams
from shared.wire import sampling_to_proto

DECODE = "/splitspec.v1.Verifier/Decode"


# -- the rule, on the table alone ---------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def full_table(clock: Clock, min_tokens: int = 4) -> tuple[SessionTable, list]:
    table = SessionTable(max_sessions=2, ttl_s=60, clock=clock, keep_slot=(5.0, min_tokens))
    return table, [table.add(session=None, owner=f"client:{i}") for i in range(2)]  # (no session is needed)


def test_a_full_table_preempts_the_attached_session_that_commits_least_below_the_floor():
    clock = Clock()
    table, (busy, keep_alive) = full_table(clock)
    for second in range(6):
        clock.now = float(second)
        table.touch(busy, committed=3)  # 3 tokens a second
        table.touch(keep_alive, committed=1 if second % 3 == 0 else 0)  # a token every 3 s
    clock.now = 6.0
    newcomer = table.add(session=None, owner="client:new")
    assert keep_alive.preempted and not busy.preempted
    assert table.resume(keep_alive.ticket) is None and table.preempted == 1
    assert {e.owner for e in table.entries()} == {busy.owner, newcomer.owner}


def test_a_session_in_use_or_just_attached_keeps_its_slot():
    clock = Clock()
    table, (first, second) = full_table(clock)
    clock.now = 4.0  # attached for less than the window: never preempted, whatever it committed
    with pytest.raises(RuntimeError, match="limit of 2 sessions"):
        table.add(session=None, owner="client:new")
    clock.now = 10.0
    for entry in (first, second):
        table.touch(entry, committed=4)  # the floor, within the window
    with pytest.raises(RuntimeError, match="limit of 2 sessions"):
        table.add(session=None, owner="client:new")
    clock.now = 15.5  # their commits have left the window
    table.add(session=None, owner="client:new")
    assert table.preempted == 1


def test_a_floor_of_zero_never_preempts():
    clock = Clock()
    table, _ = full_table(clock, min_tokens=0)
    clock.now = 100.0
    with pytest.raises(RuntimeError, match="limit of 2 sessions"):
        table.add(session=None, owner="client:new")


# -- on a real verifier --------------------------------------------------------------------------
def open_frame(engine, prompt, max_new_tokens: int = 1500) -> bytes:
    encoded = codec.encode_tokens(prompt, engine.vocab_size)
    return pb.EdgeFrame(open=pb.Open(vocab_size=engine.vocab_size, vocab_fingerprint=engine.fingerprint,
                                     sampling=sampling_to_proto(SamplingParams(mode=Mode.GREEDY)),
                                     prompt=encoded.data, max_new_tokens=max_new_tokens)).SerializeToString()


def draft_frame(engine, epoch: int, start: int, tokens: list[int]) -> bytes:
    encoded = codec.encode_tokens(tokens, engine.vocab_size)
    return pb.EdgeFrame(draft=pb.Draft(epoch=epoch, start_position=start, payload=encoded.data,
                                       compressed=encoded.compressed)).SerializeToString()


class Stream:
    """A raw Decode stream whose frames the test sends one by one and whose replies a thread reads."""

    def __init__(self, address: str, first: bytes, token: str | None = None) -> None:
        self._frames: list[bytes | None] = [first]
        self._ready = threading.Condition()
        self.channel = grpc.insecure_channel(address)
        self.call = self.channel.stream_stream(DECODE, request_serializer=lambda b: b,
                                               response_deserializer=pb.CloudFrame.FromString)(
            self._send(), timeout=60, metadata=(("authorization", f"Bearer {token}"),) if token else None)
        self.replies: list[pb.CloudFrame] = []
        self.status: grpc.StatusCode | None = None
        self.details = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _send(self):
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._frames)
                frame = self._frames.pop(0)
            if frame is None:
                return
            yield frame

    def _read(self) -> None:
        try:
            for reply in self.call:
                self.replies.append(reply)
        except grpc.RpcError as exc:
            self.status, self.details = exc.code(), exc.details()

    def send(self, frame: bytes | None) -> None:
        with self._ready:
            self._frames.append(frame)
            self._ready.notify()

    def ended(self, within_s: float) -> bool:
        self._reader.join(within_s)
        return not self._reader.is_alive()

    def close(self) -> None:
        self.send(None)
        self.call.cancel()
        self.channel.close()


def wait_for(predicate, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_a_keep_alive_stream_gives_its_slot_to_a_new_session(tiny_engine, serve):
    """An empty block a second commits a token a second: under the floor of 4 in 2 s, so the next
    Open is served and the keep-alive stream ends ABORTED at its next block (before: RESOURCE_EXHAUSTED
    for the newcomer, for as long as the keep-alive went on)."""
    server = serve(ServiceLimits(max_sessions=1, idle_timeout_s=2.0, min_tokens_to_keep_slot=4))
    prompt = tiny_prompt(tiny_engine, "The cat sat")
    keep_alive = Stream(server.address, open_frame(tiny_engine, prompt))
    newcomer = None
    try:
        assert wait_for(lambda: keep_alive.replies, 20), "no Opened"
        for _ in range(3):  # 3 s of keep-alive: the session is older than the window
            keep_alive.send(draft_frame(tiny_engine, 0, len(prompt), []))
            time.sleep(1.0)
        newcomer = Stream(server.address, open_frame(tiny_engine, prompt, 8))
        assert wait_for(lambda: newcomer.replies or newcomer.status, 20)
        assert newcomer.status is None and newcomer.replies[0].WhichOneof("kind") == "opened", newcomer.details
        keep_alive.send(draft_frame(tiny_engine, 0, len(prompt), []))
        assert keep_alive.ended(20)
        assert keep_alive.status == grpc.StatusCode.ABORTED and "gave its slot" in keep_alive.details
    finally:
        keep_alive.close()
        if newcomer is not None:
            newcomer.close()


def test_stale_blocks_do_not_keep_a_stream_alive(tiny_engine, serve):
    """After a correction, blocks of the old epoch are stale and (with stale decodes off) answered with
    nothing committed: a stream that sends only those is parked after ``idle_timeout_s``, however often
    it sends them."""
    server = serve(ServiceLimits(max_sessions=2, idle_timeout_s=1.5, decode_stale=False, session_ttl_s=60))
    table = server.server.servicer.table
    prompt = tiny_prompt(tiny_engine, "The cat sat")
    wrong = (greedy_continuation(tiny_engine, prompt, 1)[0] + 1) % tiny_engine.vocab_size
    stream = Stream(server.address, open_frame(tiny_engine, prompt))
    try:
        assert wait_for(lambda: stream.replies, 20), "no Opened"
        stream.send(draft_frame(tiny_engine, 0, len(prompt), [wrong]))  # rejected: the session's epoch is 1
        assert wait_for(lambda: len(stream.replies) == 2, 20)
        started = time.monotonic()
        while not stream.ended(0.2) and time.monotonic() - started < 15:
            stream.send(draft_frame(tiny_engine, 0, len(prompt), [wrong]))
        assert stream.status == grpc.StatusCode.DEADLINE_EXCEEDED, (stream.status, len(stream.replies))
        assert time.monotonic() - started < 6
        assert all(r.verdict.stale for r in stream.replies[2:]) and len(stream.replies) > 4
        assert wait_for(lambda: table.parked == 1, 5)
    finally:
        stream.close()


def test_identities_that_fill_the_table_give_a_slot_to_one_that_holds_none(tiny_engine, serve):
    """Slots are shared max-min among identities: one client holding every slot, each in use (a block every
    0.2 s), still gives one to a client that holds none (before: RESOURCE_EXHAUSTED)."""
    from cloud.identity import Credentials

    credentials = Credentials({"heavy": "heavy-token", "light": "light-token"})
    server = serve(ServiceLimits(max_sessions=3, max_sessions_per_client=3), credentials=credentials)
    prompt = tiny_prompt(tiny_engine, "The cat sat")
    heavy = [Stream(server.address, open_frame(tiny_engine, prompt), "heavy-token") for _ in range(3)]
    light = None
    try:
        assert wait_for(lambda: all(s.replies for s in heavy), 20), "no Opened"
        for _ in range(10):  # 2 s of use: ten tokens each, never idle
            for stream in heavy:
                stream.send(draft_frame(tiny_engine, 0, len(prompt), []))
            time.sleep(0.2)
        light = Stream(server.address, open_frame(tiny_engine, prompt, 8), "light-token")
        assert wait_for(lambda: light.replies or light.status, 20)
        assert light.status is None and light.replies[0].WhichOneof("kind") == "opened", light.details
        for stream in heavy:
            stream.send(draft_frame(tiny_engine, 0, len(prompt), []))
        assert wait_for(lambda: sum(s.status == grpc.StatusCode.ABORTED for s in heavy) == 1, 20)
        assert server.server.servicer.table.preempted == 1
    finally:
        for stream in [*heavy, *([light] if light else [])]:
            stream.close()
