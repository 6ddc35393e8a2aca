"""A cloud stretch sends its empty blocks a frame of several at a time (``Draft.empty_blocks``,
``edge.pipeline.stretch_top_up``): the verifier's event loop, on the target's core, wakes once a
frame instead of once a token, and the output is the target's all the same. An older verifier
(``Opened.max_empty_blocks`` 0) gets a frame per block, as before. (The verifier's side:
``tests/cloud/test_service_hostile.py``.)"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import tiny_drafter, tiny_prompt

from cloud.limits import ServiceLimits
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.pipeline import Pipeline, stretch_top_up
from edge.schedule import FixedSchedule, SpecConfig
from shared.params import Mode, SamplingParams
from sim.inprocess import generate

N = 40
TEXT = "It was the best of times"


@dataclass
class _Empty:
    start_position: int
    size: int = 0
    more_follows: bool = False
    void: bool = False
    first: bool = False


class _CloudAlone(FixedSchedule):
    """A schedule that keeps the cloud decoding alone, ``window`` empty blocks in flight (as the
    controller's stretch does), whatever it measures."""

    def adopt(self, terms, draft_len_cap, hedge_cap, branch_len):
        self.draft_len, self.window = 0, min(self.window, terms.max_blocks_in_flight)
        return self.plan()


class _Stretch(SpecConfig):
    def schedule(self):
        return _CloudAlone(0, self.window)


def test_a_stretch_tops_its_window_up_a_quarter_at_a_time():
    pipe = Pipeline(0, 16, FixedSchedule(0, 16))
    pipe.max_empty_blocks = 16
    first = pipe.next_block(committed_end=10, end_limit=100)
    assert pipe.may_send() and (first.start_position, first.drafts, first.empty_blocks) == (10, 0, 16)
    for i in range(16):
        pipe.sent(_Empty(10 + i))
    for _ in range(4):
        assert not pipe.may_send()  # room for fewer than a quarter of the window: wait
        pipe.answered()
        pipe.settle(_Empty(0), 1, correction=False, stale=False)
    assert pipe.may_send() and stretch_top_up(16, 16) == 4
    top_up = pipe.next_block(committed_end=14, end_limit=100)
    assert (top_up.start_position, top_up.empty_blocks) == (26, 4)
    assert pipe.next_block(committed_end=14, end_limit=28).empty_blocks == 2  # within the token limit


def test_to_an_older_verifier_a_stretch_sends_a_frame_per_block():
    pipe = Pipeline(0, 16, FixedSchedule(0, 16))  # max_empty_blocks 1: Opened.max_empty_blocks not said
    assert stretch_top_up(16, 1) == 1 and stretch_top_up(3, 16) == 1  # (and a window under 4: a block a frame)
    for i in range(15):
        pipe.sent(_Empty(10 + i))
    assert pipe.may_send() and pipe.next_block(committed_end=10, end_limit=100).empty_blocks == 1


class _Counting(GrpcVerifier):
    """Counts the Draft frames sent and the blocks they stand for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.frames: list[int] = []

    def send(self, epoch, start_position, block, more_follows, *, before_opened=False, empty_blocks=1):
        self.frames.append(empty_blocks)
        super().send(epoch, start_position, block, more_follows, before_opened=before_opened,
                     empty_blocks=empty_blocks)


@pytest.mark.parametrize("params", [SamplingParams(mode=Mode.GREEDY),
                                    SamplingParams(mode=Mode.COUPLED, temperature=0.8, seed=4)],
                         ids=["greedy", "coupled"])
def test_a_stretch_over_grpc_sends_a_frame_per_few_tokens_and_changes_no_token(tiny_engine, tiny_models, tiny_vocab,
                                                                                serve, params):
    prompt = tiny_prompt(tiny_engine, TEXT)
    drafter = tiny_drafter(tiny_models, "drafter_noisy")
    try:
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=N, spec=SpecConfig(0)).tokens
        server = serve(ServiceLimits())
        verifier = _Counting(VerifierEndpoint(server.address, *tiny_vocab))
        got = run_decode(drafter, verifier, prompt, params, max_new_tokens=N, spec=_Stretch(1, window=16))
    finally:
        drafter.close()
    assert got.tokens == want
    assert sum(verifier.frames) <= N and max(verifier.frames) == 16  # (the first position came with the Opened)
    assert len(verifier.frames) <= N / stretch_top_up(16, 16) + 1, verifier.frames
