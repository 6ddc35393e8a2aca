"""A stream's frame queue is bounded in bytes as well as frames (``cloud.frame_queue``)."""

from __future__ import annotations

import asyncio

from cloud.frame_queue import FrameQueue
from protos import splitspec_pb2 as pb


def frame(nbytes: int):
    return (pb.Draft(payload=b"\x01" * nbytes), 0.0)


def test_the_reader_waits_past_the_bytes_and_one_frame_always_goes_in():
    async def scenario():
        queue = FrameQueue(maxsize=10, max_bytes=1000)
        await queue.put(frame(5000))  # empty: one frame goes in, whatever its size
        assert queue.full() and queue.bytes > 1000
        late = asyncio.create_task(queue.put(frame(10)))
        await asyncio.sleep(0.01)
        assert not late.done()  # held: the reader reads nothing more
        queue.get_nowait()
        await asyncio.wait_for(late, 1)
        assert queue.qsize() == 1 and 0 < queue.bytes < 1000
        for _ in range(3):
            await queue.put(frame(100))
        assert not queue.full() and queue.qsize() == 4
        await queue.put(object())  # a marker (EOF, CLOSE) holds no bytes
        while not queue.empty():
            queue.get_nowait()
        assert queue.bytes == 0

    asyncio.run(scenario())
