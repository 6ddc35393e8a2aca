"""The verifier session's chains: blocks in flight verified in one forward, deferred bonuses, the
token limit and EOS inside a chain, and the blocks a session refuses (or a servicer, past its limit)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from helpers import GREEDY, new_session

from cloud.engine import run_alone
from cloud.session import BlockRejected, PendingBlock
from protos import splitspec_pb2 as pb
from shared import codec
from shared.verdict import StopReason


def test_accepted_chain_defers_bonuses_in_one_forward(tiny_engine, greedy_path):
    """A chain of accepted blocks defers each bonus and shares one forward."""
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt)
    before = session.forwards
    p = len(prompt)
    pending = [PendingBlock(0, p, want[0:4], more_follows=True), PendingBlock(0, p + 4, want[4:7], more_follows=True),
               PendingBlock(0, p + 7, want[7:9], more_follows=False)]
    verdicts = session.verify_chain(pending)
    assert [(v.accepted, v.token, v.bonus) for v in verdicts] == [(4, None, False), (3, None, False), (2, want[9], True)]
    assert [v.is_deferred for v in verdicts] == [True, True, False]
    assert session.forwards == before + 1 and not pending
    assert session.tokens[p:] == want[:10] and session.epoch == 0


def test_a_chain_longer_than_the_row_bound_is_verified_across_forwards(tiny_engine, greedy_path):
    """No verify forward feeds more than ``max_rows`` rows (``--max-batch-rows``): a chain past it is cut
    there, the rest verified in the next forward as if it had arrived later; the tokens are the same."""
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt, max_rows=8)
    p = len(prompt)
    pending = [PendingBlock(0, p, want[0:4], more_follows=True), PendingBlock(0, p + 4, want[4:8], more_follows=True),
               PendingBlock(0, p + 8, want[8:12], more_follows=False)]
    # (The prefill's last row stands for the first position: a block's rows are its drafts.)
    steps = [run_alone(session.verify_chain_steps(pending), tiny_engine) for _ in range(2)]
    assert [step.rows for step in steps] == [8, 4] and not pending  # 8 + 4 would be 12 rows: cut after the second
    assert [len(step.verdicts) for step in steps] == [2, 1]
    assert session.tokens[p:] == want[:13]
    unbounded = new_session(tiny_engine, prompt)
    pending = [PendingBlock(0, p, want[0:4], more_follows=True), PendingBlock(0, p + 4, want[4:8], more_follows=True),
               PendingBlock(0, p + 8, want[8:12], more_follows=False)]
    assert run_alone(unbounded.verify_chain_steps(pending), tiny_engine).rows == 12  # the control: one forward


def test_a_deferred_bonus_is_answered_by_an_empty_block_without_a_forward(tiny_engine, greedy_path):
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt)
    p = len(prompt)
    (deferred,) = session.verify_chain([PendingBlock(0, p, want[:5], more_follows=True)])
    assert deferred.is_deferred
    forwards = session.forwards
    (bonus,) = session.verify_chain([PendingBlock(0, p + 5, [])])
    assert (bonus.accepted, bonus.token, bonus.bonus) == (0, want[5], True)
    assert session.forwards == forwards  # the deferred row answered it
    (next_round,) = session.verify_chain([PendingBlock(0, p + 6, want[6:9])])
    assert next_round.token == want[9] and session.tokens[p:] == want[:10]


def test_the_token_limit_and_eos_end_a_generation_inside_a_chain(tiny_engine, greedy_path):
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt, max_new_tokens=6)
    p = len(prompt)
    verdicts = session.verify_chain([PendingBlock(0, p, want[:4], more_follows=True),
                                     PendingBlock(0, p + 4, want[4:8], more_follows=True)])
    assert [v.done for v in verdicts] == [False, True] and verdicts[-1].stop_reason is StopReason.LENGTH
    assert verdicts[-1].accepted == 2 and verdicts[-1].token is None and session.tokens[p:] == want[:6]
    eos = next(iter(tiny_engine.eos_token_ids))
    ended = new_session(tiny_engine, prompt)
    original = ended.engine.eos_token_ids
    try:
        ended.engine.eos_token_ids = {want[2]}  # the target's third token ends the text
        (verdict,) = ended.verify_chain([PendingBlock(0, p, want[:5], more_follows=True)])
    finally:
        ended.engine.eos_token_ids = original
    assert (verdict.done, verdict.stop_reason, verdict.accepted) == (True, StopReason.EOS, 3)
    assert eos in tiny_engine.eos_token_ids


@pytest.mark.parametrize(
    "block, message",
    [
        (PendingBlock(1, 0, [5]), "ahead"),
        (PendingBlock(0, 0, [], more_follows=True), "empty block"),
        (PendingBlock(0, 0, [5] * 17), "exceeds"),
    ],
    ids=["epoch-ahead", "empty-more-follows", "too-long"],
)
def test_blocks_that_cannot_continue_the_session_are_refused(tiny_engine, greedy_path, block, message):
    prompt, _ = greedy_path
    session = new_session(tiny_engine, prompt)
    if block.start_position == 0:
        block = PendingBlock(block.epoch, len(prompt), block.drafts, block.q, block.more_follows)
    with pytest.raises(BlockRejected, match=message):
        session.verify_chain([block])


def test_the_cloud_bounds_blocks_in_flight(tiny_engine, greedy_path):
    """More blocks waiting than the limit ends the stream; the check runs before any forward. Empty
    blocks (a token each: a cloud stretch's) have a limit of their own, beside those with drafts."""
    from cloud.limits import ServiceLimits
    from cloud.servicer import VerifierServicer
    from cloud.stream_end import Abort
    from shared.wire import OpenRequest

    prompt, want = greedy_path
    servicer = VerifierServicer(tiny_engine, ServiceLimits(max_blocks_in_flight=2, max_empty_blocks=3))

    async def scenario(blocks: int, empty: int = 0):
        entry = await servicer.handshake.new_session(OpenRequest(GREEDY, prompt, 40), 16, owner="test")
        frames: asyncio.Queue = asyncio.Queue()
        for b in range(blocks):  # all queued before the servicer looks: one drain sees them together
            payload = codec.encode_tokens(want[2 * b : 2 * b + 2], tiny_engine.vocab_size).data
            draft = pb.Draft(epoch=0, start_position=len(prompt) + 2 * b, payload=payload,
                             more_follows=b < blocks - 1 or empty > 0)
            frames.put_nowait((draft, time.perf_counter()))
        for b in range(empty):  # (behind the drafted ones, each asking for a token)
            position = len(prompt) + 2 * blocks + b
            frames.put_nowait((pb.Draft(epoch=0, start_position=position), time.perf_counter()))
        forwards = entry.session.forwards
        verdicts = servicer.blocks.verdicts(entry, entry.stream, frames, [])
        out = []
        try:
            async for verdict, *_ in verdicts:
                out.append(verdict)
                if len(out) == blocks + empty:
                    break
        except Abort as exc:
            return exc, entry.session.forwards - forwards
        finally:
            await verdicts.aclose()
            servicer.table.remove(entry)
        return out, entry.session.forwards - forwards

    verdicts, forwards = asyncio.run(asyncio.wait_for(scenario(2), 30))
    assert [v.accepted for v in verdicts] == [2, 2] and forwards == 1  # within the limit: one shared forward
    refused, forwards = asyncio.run(asyncio.wait_for(scenario(3), 30))
    assert isinstance(refused, Abort) and refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than 2 blocks in flight" in str(refused) and forwards == 0
    verdicts, _ = asyncio.run(asyncio.wait_for(scenario(2, empty=3), 30))
    assert [v.accepted for v in verdicts] == [2, 2, 0, 0, 0]  # five in flight, two with drafts and three empty
    refused, forwards = asyncio.run(asyncio.wait_for(scenario(0, empty=4), 30))
    assert isinstance(refused, Abort) and "more than 3 empty blocks in flight" in str(refused) and forwards == 0
    servicer.scheduler.shutdown()


def test_a_row_bound_below_one_block_is_refused_at_start(tiny_engine):
    """One block is verified in one forward, so ``max_batch_rows`` must hold a whole block and its branches."""
    from cloud.limits import ServiceLimits
    from cloud.servicer import VerifierServicer

    with pytest.raises(ValueError, match="max_batch_rows 64 is below one block's rows, 65"):
        VerifierServicer(tiny_engine, ServiceLimits(max_batch_rows=64))  # 32 drafts + 1, 4 branches of 8
    VerifierServicer(tiny_engine, ServiceLimits(max_batch_rows=64, max_branches=0))  # 33 rows: fits
