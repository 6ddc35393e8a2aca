"""Refusals answered slowly: a stream refused for want of credentials, a grant or room learns it only after
a delay.

A refusal costs the verifier a connection, an HTTP/2 stream and a parse, and costs a client that simply
tries again nothing: a client under a made-up token, or past its Open rate, that reconnects as fast as it
is answered keeps the verifier's core busy with refusals (measured: 0.73-0.78x of the honest clients'
throughput alone, one strategy at a time, ``bench fairness``). Holding each refusal ``delay_s`` first costs
the verifier a sleeping coroutine and paces such a client to one try per ``delay_s`` per stream. An honest
client refused for room waits that much longer for the news, and would back off anyway. At most
``max_held`` refusals are held at once; past that they go at once (memory stays bounded whatever a client
opens).

Contract. ``await SlowRefusals.hold(code)`` before aborting a stream that was refused with ``code``: it
returns after ``delay_s`` for ``REFUSAL_CODES`` (while fewer than ``max_held`` are held), at once for any
other code (a malformed request is answered as soon as it is found).
"""

from __future__ import annotations

import asyncio

import grpc

__all__ = ["REFUSAL_CODES", "SlowRefusals"]

REFUSAL_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                           grpc.StatusCode.RESOURCE_EXHAUSTED})
MAX_HELD = 1024


class SlowRefusals:
    def __init__(self, delay_s: float, max_held: int = MAX_HELD) -> None:
        self.delay_s = delay_s
        self.max_held = max_held
        self.held = 0  # refusals being held now (on the server's event loop only)

    async def hold(self, code: grpc.StatusCode) -> None:
        if code not in REFUSAL_CODES or self.delay_s <= 0 or self.held >= self.max_held:
            return
        self.held += 1
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.held -= 1
