"""``bench fairness``'s attackers: clients that try to take more of a shared verifier than their share.

Each strategy loops until told to stop, as one identity (its bearer token), reopening whatever the
verifier ends; none reads a verdict it does not need. They are the findings of the fleet-trust issue:

- ``garbage``: random drafts at the verifier's largest D and window (``run_decode``, so a real edge's
  pipeline): rows that commit next to nothing;
- ``salami``: blocks of the largest D whose first ``SALAMI_RIGHT`` drafts are the target's own (known from
  a target-only run), the rest random: acceptance just above what gets a client capped;
- ``slow_reader``: ``streams`` Decode streams that send empty blocks and read nothing (their HTTP/2
  window fills and the verifier's writes stall);
- ``keep_alive``: ``streams`` Decode streams that each send one empty block a second (a slot held for a
  one-row forward now and then);
- ``flood``: Decode streams that send 1 MiB frames as fast as the verifier takes them, reading nothing;
- ``made_up``: Decode streams under a token the verifier does not know, opened as fast as it answers.

Contract: ``STRATEGIES`` maps a name to ``strategy(target, token, stop)``; ``target`` is an
``AttackTarget``. A strategy returns once ``stop`` is set, never raises for what the verifier does.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from edge.drafter import DraftBlock, ModelFreeDrafter, one_hot_block
from protos import splitspec_pb2 as pb
from shared import codec
from shared.wire import SLOW_READER_OPTIONS, sampling_to_proto

__all__ = ["AttackTarget", "GarbageDrafter", "STRATEGIES", "SalamiDrafter"]

DECODE = "/splitspec.v1.Verifier/Decode"
SALAMI_RIGHT = 5  # right drafts at the head of each salami block
JUNK = b"\x01" * (1 << 20)


@dataclass(frozen=True)
class AttackTarget:
    """What an attacker knows: the verifier's address, the vocabulary, a prompt and its target-only
    continuation, the sampling, the verifier's largest D and window, and how many streams to hold."""

    address: str
    vocab_size: int
    fingerprint: bytes
    prompt: list[int]
    want: list[int]  # the target's own continuation of ``prompt`` (greedy)
    params: object  # shared.params.SamplingParams
    max_draft_len: int
    window: int
    streams: int = 16
    max_new_tokens: int = 64


class GarbageDrafter(ModelFreeDrafter):
    """Well-formed blocks of uniformly random tokens, always ``n`` long."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        super().__init__(vocab_size)
        self.rng = random.Random(seed)

    def propose_block(self, n: int) -> DraftBlock:
        return one_hot_block([self.rng.randrange(3, self.vocab_size) for _ in range(n)], self._params)


class SalamiDrafter(GarbageDrafter):
    """Blocks whose first ``SALAMI_RIGHT`` drafts continue ``full`` (prompt + the target's own tokens)
    where the speculation still follows it, the rest random."""

    def __init__(self, vocab_size: int, seed: int, full: list[int]) -> None:
        super().__init__(vocab_size, seed)
        self.full = full

    def propose_block(self, n: int) -> DraftBlock:
        at = len(self._spec.tokens)
        right = self.full[at:at + SALAMI_RIGHT] if self._spec.tokens == self.full[:at] else []
        garbage = [self.rng.randrange(3, self.vocab_size) for _ in range(n - len(right))]
        return one_hot_block([*right, *garbage][:n], self._params)


def _open(target: AttackTarget) -> bytes:
    encoded = codec.encode_tokens(target.prompt, target.vocab_size)
    return pb.EdgeFrame(open=pb.Open(vocab_size=target.vocab_size, vocab_fingerprint=target.fingerprint,
                                     sampling=sampling_to_proto(target.params), prompt=encoded.data,
                                     max_new_tokens=target.max_new_tokens)).SerializeToString()


def _empty_block(target: AttackTarget) -> bytes:
    return pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=len(target.prompt) + 1)).SerializeToString()


def _stream(target: AttackTarget, token: str, frames, stop: threading.Event, options=(), read: bool = False) -> None:
    """One Decode stream sending ``frames``: reads its replies when ``read``, else its first and then
    nothing, holding the stream until it ends or ``stop``; ends quietly whatever the verifier does."""
    with grpc.insecure_channel(target.address, options=list(options)) as channel:
        call = channel.stream_stream(DECODE, request_serializer=lambda b: b, response_deserializer=lambda b: b)(
            frames, timeout=120, metadata=(("authorization", f"Bearer {token}"),))
        try:
            if read:
                for _ in call:
                    pass
            else:
                next(call)
                while call.is_active() and not stop.wait(0.1):
                    pass
        except (grpc.RpcError, StopIteration):
            pass
        finally:
            call.cancel()


def _until(stop: threading.Event, every_s: float):
    """Sleeps ``every_s`` between yields until ``stop``."""
    while not stop.wait(every_s):
        yield


def _held_streams(target: AttackTarget, token: str, stop: threading.Event, frames_of: Callable, **kwargs) -> None:
    """``target.streams`` streams of ``frames_of()``, each reopened when it ends, until ``stop``."""

    def hold() -> None:
        while not stop.is_set():
            _stream(target, token, frames_of(), stop, **kwargs)

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(target.streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def garbage(target: AttackTarget, token: str, stop: threading.Event) -> None:
    _decode_loop(target, token, stop, lambda seed: GarbageDrafter(target.vocab_size, seed))


def salami(target: AttackTarget, token: str, stop: threading.Event) -> None:
    full = [*target.prompt, *target.want]
    _decode_loop(target, token, stop, lambda seed: SalamiDrafter(target.vocab_size, seed, full), window=1)


def _decode_loop(target: AttackTarget, token: str, stop: threading.Event, drafter_of, window: int | None = None) -> None:
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from edge.schedule import SpecConfig
    from edge.verifier_protocol import VerifierError

    seed = 0
    while not stop.is_set():
        verifier = GrpcVerifier(VerifierEndpoint(target.address, target.vocab_size, target.fingerprint,
                                                 auth_token=token), outage_budget_s=2.0)
        try:
            run_decode(drafter_of(seed), verifier, target.prompt, target.params, max_new_tokens=target.max_new_tokens,
                       spec=SpecConfig(target.max_draft_len, window=window or target.window),
                       on_tokens=lambda _: stop.is_set())
        except (VerifierError, grpc.RpcError, RuntimeError):
            time.sleep(0.05)  # refused or ended: try again
        finally:
            verifier.close()
        seed += 1


def _empty_blocks_every(target: AttackTarget, token: str, stop: threading.Event, every_s: float, **kwargs) -> None:
    """``target.streams`` streams that each open and then send an empty block every ``every_s``."""

    def frames():
        yield _open(target)
        for _ in _until(stop, every_s):
            yield _empty_block(target)

    _held_streams(target, token, stop, frames, **kwargs)


def slow_reader(target: AttackTarget, token: str, stop: threading.Event) -> None:
    _empty_blocks_every(target, token, stop, 0.02, options=SLOW_READER_OPTIONS)


def keep_alive(target: AttackTarget, token: str, stop: threading.Event) -> None:
    _empty_blocks_every(target, token, stop, 1.0, read=True)


def flood(target: AttackTarget, token: str, stop: threading.Event) -> None:
    junk = pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=len(target.prompt) + 1, payload=JUNK)).SerializeToString()

    def frames():
        yield _open(target)
        while not stop.is_set():
            yield junk

    _held_streams(target, token, stop, frames, options=SLOW_READER_OPTIONS)


def made_up(target: AttackTarget, token: str, stop: threading.Event) -> None:
    def frames():
        yield _open(target)

    made = 0
    while not stop.is_set():
        _stream(target, f"made-up-{token}-{made}", frames(), stop, read=True)
        made += 1


STRATEGIES: dict[str, Callable[[AttackTarget, str, threading.Event], None]] = {
    "garbage": garbage, "salami": salami, "slow_reader": slow_reader, "keep_alive": keep_alive, "flood": flood,
    "made_up": made_up,
}
