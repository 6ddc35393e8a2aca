"""One gRPC ``Decode`` stream to the verifier, synchronous to its caller.

A reader thread moves the cloud's frames into a queue so that every wait has a
deadline. Each wait ends in a frame of the kind asked for, ``LinkLost`` (the
stream broke, closed, or stayed silent past the deadline: the session may be
resumed on a new stream) or ``VerifierError`` (the cloud refused). Every frame
each way is counted on the session's ``LinkMeter``. Knows nothing of sessions.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

import grpc

from edge.channel import BAD_INPUT_CODES, describe_rpc_error
from edge.link_meter import LinkMeter
from edge.verifier_protocol import LinkLost, VerifierError
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared.wire import REPLICA_HEADER

__all__ = ["DecodeStream", "STREAM_ANSWER_S", "STREAM_MAX_IDLE_S"]

log = logging.getLogger(__name__)

_END = object()
# ``GrpcVerifier.connect(stream=True)``: how long to wait for the cloud to answer a new stream's headers, and
# how long an unused stream is kept for the Open (below the cloud's default --open-timeout of 30 s).
STREAM_ANSWER_S = 2.0
STREAM_MAX_IDLE_S = 20.0

# Statuses of a stream that broke rather than was refused: the session can be resumed. INTERNAL is
# what HTTP/2 reports for a connection torn mid-frame; ABORTED, a session another stream took over.
_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
}


class DecodeStream:
    """The current ``Decode`` call on a channel: ``restart`` replaces it, ``close`` ends it."""

    def __init__(self, channel: grpc.Channel, address: str, meter: LinkMeter) -> None:
        self._channel, self._address, self._meter = channel, address, meter
        self._requests: queue.Queue = queue.Queue()
        self._responses: queue.Queue = queue.Queue()
        self.call = None  # the gRPC call (None: none started, or closed)
        self._started: float | None = None  # monotonic start of the call while it has sent nothing
        self._reader: threading.Thread | None = None

    @property
    def used(self) -> bool:
        """Whether the current call has sent a frame (only such a call can hold a session)."""
        return self.call is not None and self._started is None

    def is_fresh(self) -> bool:
        """Whether the current call has sent nothing yet, is alive, and is young enough that the
        cloud is still waiting for its Open."""
        return (self.call is not None and self._started is not None and not self.call.done()
                and time.monotonic() - self._started < STREAM_MAX_IDLE_S)

    def restart(self, replica: str) -> None:
        """A fresh call; the old one, if any, is cancelled and its queues dropped. ``replica``: the
        replica to name in the headers (a proxy routes by it, deploy/envoy.yaml; "": none)."""
        if self.call is not None:
            self._requests.put(_END)
            self.call.cancel()
        self._started = time.monotonic()  # (None once a frame has been sent on it)
        self._requests, self._responses = queue.Queue(), queue.Queue()
        metadata = ((REPLICA_HEADER, replica),) if replica else None
        self.call = pb_grpc.VerifierStub(self._channel).Decode(iter(self._requests.get, _END), metadata=metadata)
        self._reader = threading.Thread(
            target=_read_forever, args=(self.call, self._responses), name="edge-link-reader", daemon=True
        )
        self._reader.start()

    def wait_for_headers(self, timeout_s: float) -> tuple | None:
        """The cloud's answer to the current call's headers (its response metadata; empty when the call
        ended instead), or None when none came within ``timeout_s``."""
        answered = threading.Event()
        call = self.call
        headers: list = [()]

        def wait() -> None:  # (returns on the headers or when the call ends)
            with contextlib.suppress(grpc.RpcError):
                headers[0] = tuple(call.initial_metadata() or ())
            answered.set()

        threading.Thread(target=wait, name="edge-stream-headers", daemon=True).start()
        return headers[0] if answered.wait(timeout_s) else None

    def headers(self) -> tuple:
        """The cloud's answer to the current call's headers: call only once a frame has come on it (they
        precede it, so this does not wait); empty when there is none."""
        if self.call is None:
            return ()
        with contextlib.suppress(grpc.RpcError):
            return tuple(self.call.initial_metadata() or ())
        return ()

    def send(self, frame: pb.EdgeFrame) -> None:
        self._started = None  # the stream is in use
        self._meter.count_up(frame)
        self._requests.put(frame)

    def receive(self, kind: str, timeout_s: float) -> pb.CloudFrame:
        """The next cloud frame, which must be a ``kind``; ``LinkLost`` when the stream broke or
        nothing came within ``timeout_s`` (the call is cancelled then)."""
        try:
            item = self._responses.get(timeout=timeout_s)
        except queue.Empty:
            self.call.cancel()
            raise LinkLost(f"no {kind} from the cloud within {timeout_s:g}s") from None
        if isinstance(item, grpc.RpcError):
            if item.code() in _TRANSIENT:
                raise LinkLost(f"lost the cloud at {self._address}: {describe_rpc_error(item)}") from item
            raise VerifierError(f"cloud ended the session: {describe_rpc_error(item)}",
                                item.code() in BAD_INPUT_CODES) from item
        if item is _END:
            raise LinkLost(f"cloud closed the stream before sending the {kind}")
        self._meter.count_down(item)
        if item.WhichOneof("kind") != kind:
            raise VerifierError(f"expected {kind} from the cloud, got {item.WhichOneof('kind')}")
        return item

    def has_frame(self) -> bool:
        """Whether ``receive`` would return (or raise) without waiting."""
        return not self._responses.empty()

    def abandon(self) -> None:
        """Drop the call now, as an edge that vanished would."""
        if self.call is not None:
            self._requests.put(_END)
            self.call.cancel()
            self.call = None

    def close(self) -> None:
        """End the call: what was queued goes out first (the reader is given 5 s to see the end)."""
        if self.call is not None:
            self._requests.put(_END)
            if self._reader:
                self._reader.join(timeout=5)
            self.call.cancel()
            self.call = None


def _read_forever(call, responses: queue.Queue) -> None:
    try:
        for message in call:
            responses.put(message)
        responses.put(_END)
    except grpc.RpcError as error:
        responses.put(error)
