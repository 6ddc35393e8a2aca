"""Refusals answered slowly (``cloud.refusals``): a stream refused for its credentials or for room is told
so after ``--refusal-delay``, a malformed one at once, and no more than ``max_held`` are held at a time.

Real servers on loopback, raw streams.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from helpers import DECODE, HeldSession

from cloud.identity import Credentials
from cloud.limits import ServiceLimits
from cloud.refusals import SlowRefusals

TOKEN = "a-token-0123456789"


def timed_first(server, engine, token, **kwargs) -> tuple[str, float]:
    started = time.perf_counter()
    session = HeldSession(server.address, engine, token, **kwargs)
    try:
        return session.first(), time.perf_counter() - started
    finally:
        session.close()


@pytest.mark.parametrize("delay_s", [0.0, 1.0])
def test_a_wrong_token_and_a_full_client_are_told_after_the_delay(tiny_engine, serve, delay_s):
    server = serve(ServiceLimits(refusal_delay_s=delay_s, max_streams_per_client=1),
                   credentials=Credentials({"alice": TOKEN}))
    code, took = timed_first(server, tiny_engine, "made-up-token")
    assert code == "UNAUTHENTICATED" and delay_s <= took < delay_s + 2.0
    held = HeldSession(server.address, tiny_engine, TOKEN)
    try:
        assert held.first() == "opened"
        code, took = timed_first(server, tiny_engine, TOKEN)  # past the client's one stream
        assert code == "RESOURCE_EXHAUSTED" and delay_s <= took < delay_s + 2.0
    finally:
        held.close()


def test_a_malformed_open_is_answered_at_once(tiny_engine, serve):
    server = serve(ServiceLimits(refusal_delay_s=2.0))
    channel = grpc.insecure_channel(server.address)
    try:
        started = time.perf_counter()
        call = channel.stream_stream(DECODE, request_serializer=lambda b: b, response_deserializer=lambda b: b)(
            iter([b"\xff\xff not a frame"]), timeout=10)
        with pytest.raises(grpc.RpcError) as error:
            next(call)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and time.perf_counter() - started < 1.0
    finally:
        channel.close()


def test_no_more_than_max_held_refusals_wait_at_once():
    refusals = SlowRefusals(0.3, max_held=2)

    async def three_refusals_and_a_bad_request() -> list[float]:
        async def timed(code):
            started = time.perf_counter()
            await refusals.hold(code)
            return time.perf_counter() - started

        codes = [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3 + [grpc.StatusCode.INVALID_ARGUMENT]
        return await asyncio.gather(*(timed(code) for code in codes))

    took = asyncio.run(three_refusals_and_a_bad_request())
    assert [t >= 0.29 for t in took] == [True, True, False, False] and refusals.held == 0
