"""Opens per identity: one client cannot make the verifier prefill without end (``cloud.open_rate``)."""

from __future__ import annotations

import grpc
from helpers import GENERATE, generate_request, tiny_prompt

from cloud.limits import ServiceLimits
from cloud.open_rate import OpenRate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate_per_identity():
    clock = Clock()
    rate = OpenRate(per_s=2.0, burst=3, clock=clock)
    assert [rate.take("client:a") for _ in range(4)] == [True, True, True, False]
    assert rate.take("client:b")  # another identity has its own bucket
    clock.now = 0.4  # 0.8 of an Open back: not yet one
    assert not rate.take("client:a")
    clock.now = 0.5
    assert rate.take("client:a") and not rate.take("client:a")
    clock.now = 100.0  # refills to the burst, no further
    assert [rate.take("client:a") for _ in range(4)] == [True, True, True, False]


def test_no_bound_at_rate_zero():
    rate = OpenRate(per_s=0.0, burst=1)
    assert all(rate.take("client:a") for _ in range(100))


def test_a_client_past_its_open_rate_is_refused_and_another_is_not(tiny_engine, serve):
    """Generate calls from one identity past the burst are refused RESOURCE_EXHAUSTED with the reason; the
    refusal costs no prefill (no session was made)."""
    server = serve(ServiceLimits(open_burst_per_client=3, opens_per_client_s=0.01))
    request = generate_request(tiny_engine, tiny_prompt(tiny_engine, "The cat sat"), 2)
    codes = []
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_stream(GENERATE, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        for _ in range(5):
            try:
                list(call(request, timeout=30))
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
                assert "opens sessions faster" in exc.details()
    assert codes == [grpc.StatusCode.OK] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
