"""Batched verification: batch invariance of the engine, the scheduler's packing, many edges at once."""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest
import torch
from helpers import remote, tiny_drafter, tiny_prompt

from cloud.engine import ForwardItem, TargetEngine, run_alone, torch_threads
from cloud.invariance import rowdot
from cloud.invariance.free_products import ROWDOT, ROWDOT512
from cloud.invariance.padding import RowPadding
from cloud.invariance.products import PackedLinear
from cloud.limits import ServiceLimits
from cloud.scheduler import Scheduler
from cloud.server import BackgroundServer, ServerConfig
from edge.schedule import SpecConfig
from protos import splitspec_pb2 as pb
from shared.params import Mode, SamplingParams
from sim.bench.fuzz import send_raw_stream
from sim.bench.hostile_frames import HostileFrames
from sim.bench.invariance import chunked_beside_mates, one_at_a_time
from sim.inprocess import generate


@pytest.mark.parametrize("trial", range(3))
def test_a_rows_logits_are_bit_identical_alone_in_a_block_or_beside_batch_mates(tiny_engine, trial):
    rng = random.Random(trial)
    tokens = [1] + [rng.randrange(3, 500) for _ in range(rng.randrange(70, 160))]
    start = rng.randrange(5, 60)
    alone = one_at_a_time(tiny_engine, tokens, start)
    packed = chunked_beside_mates(tiny_engine, tokens, start, rng)
    assert torch.equal(alone, packed)


@pytest.mark.skipif(not rowdot.available(), reason="rowdot needs x86-64 with AVX2 and FMA and a C compiler")
def test_an_engine_on_one_thread_runs_canonical_products_on_rowdot_and_keeps_a_rows_bits(tiny_models):
    """A cloud on one core (as the simulation pins it) takes rowdot for canonical products
    (``cloud.invariance.products.canonical_path``); the engine's own check and a row's bits agree."""
    rng = random.Random(7)
    tokens = [1] + [rng.randrange(3, 500) for _ in range(120)]
    with torch_threads(1):
        engine = TargetEngine(tiny_models["target"])
        paths = {m.canonical for m in engine.model.modules() if isinstance(m, PackedLinear)}
        assert paths & {ROWDOT, ROWDOT512} and engine.invariant, paths
        alone = one_at_a_time(engine, tokens, 40)
        packed = chunked_beside_mates(engine, tokens, 40, rng)
    assert torch.equal(alone, packed)


def test_gemma_rows_are_bit_identical_across_batches_including_the_sliding_window(gemma_engine):
    rng = random.Random(5)
    tokens = [2] + [rng.randrange(100, 20_000) for _ in range(530)]  # past the 512-token local window
    start = 500
    assert torch.equal(one_at_a_time(gemma_engine, tokens, start), chunked_beside_mates(gemma_engine, tokens, start, rng))


def test_products_run_on_the_padding_and_threads_the_engine_checked_at_load(tiny_engine):
    """Paddings by tile (2 rows on oneDNN, 4 on an AMD EPYC's BLAS, 16 on an AVX-512 Xeon's); the engine's
    thread count (one, where the CPU splits products between threads by row count) holds inside its
    forwards only."""
    assert (RowPadding(False)(5), RowPadding(False, 16)(3), RowPadding(True, 8)(9), RowPadding(True)(1)) == (5, 16, 16, 4)
    assert tiny_engine.invariant and tiny_engine.padding.tile in (2, 4, 8, 16)
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    with torch_threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before


def test_free_shapes_compute_the_same_model(tiny_models, tiny_engine):
    free = TargetEngine(tiny_models["target"], shapes="free")
    rng = random.Random(3)
    tokens = [1] + [rng.randrange(3, 500) for _ in range(80)]
    want = one_at_a_time(tiny_engine, tokens, 20)
    got = one_at_a_time(free, tokens, 20)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert tiny_engine.invariant and not free.invariant


def _prefill_job(engine, tokens):
    seq = engine.new_sequence()

    def job():
        logits = yield ForwardItem(seq, tokens, "last")
        return logits

    return job


def _hold(scheduler):
    """Block the engine thread until the returned event is set (so later jobs queue up together);
    returns once the engine thread holds."""
    gate, holding = threading.Event(), threading.Event()
    scheduler.submit(lambda: (holding.set(), gate.wait(10)))
    holding.wait(10)
    return gate


def test_the_scheduler_packs_waiting_sessions_into_one_forward(tiny_engine):
    scheduler = Scheduler(tiny_engine)
    try:
        prompts = [[1, *range(10 + i, 30 + 3 * i)] for i in range(6)]
        gate = _hold(scheduler)
        futures = [scheduler.submit(_prefill_job(tiny_engine, p)) for p in prompts]
        gate.set()
        results = [f.result(10) for f in futures]
    finally:
        scheduler.shutdown()
    assert scheduler.stats.forwards == 1 and scheduler.stats.max_sequences == 6
    for prompt, got in zip(prompts, results):
        assert torch.equal(got, run_alone(_prefill_job(tiny_engine, prompt)(), tiny_engine))


def test_no_batching_runs_one_sequence_per_forward(tiny_engine):
    scheduler = Scheduler(tiny_engine, batching=False)
    try:
        gate = _hold(scheduler)
        futures = [scheduler.submit(_prefill_job(tiny_engine, [1, 5, 6, 7 + i])) for i in range(4)]
        gate.set()
        for future in futures:
            future.result(10)
    finally:
        scheduler.shutdown()
    assert scheduler.stats.forwards == 4 and scheduler.stats.max_sequences == 1


def test_jobs_of_one_session_run_in_order_while_others_share_forwards(tiny_engine):
    scheduler = Scheduler(tiny_engine)
    order: list[str] = []
    seq, other = tiny_engine.new_sequence(), tiny_engine.new_sequence()

    def step(name, target, tokens):
        def job():
            order.append(f"{name} start")
            yield ForwardItem(target, tokens)
            order.append(f"{name} end")
        return job

    try:
        gate = _hold(scheduler)
        first = scheduler.submit(step("a1", seq, [1, 2, 3]), key=seq)
        second = scheduler.submit(step("a2", seq, [4]), key=seq)  # must wait for a1: same session
        third = scheduler.submit(step("b", other, [1, 9]), key=other)
        gate.set()
        for future in (first, second, third):
            future.result(10)
    finally:
        scheduler.shutdown()
    assert order.index("a1 end") < order.index("a2 start")
    assert order.index("b start") < order.index("a1 end")  # b shared a1's forward
    assert seq.length == 4


def test_a_long_prompt_is_prefilled_in_chunks_and_does_not_stall_a_verify(tiny_engine):
    scheduler = Scheduler(tiny_engine, max_rows=16, min_prefill_rows=4)
    rng = random.Random(2)
    long_prompt = [1] + [rng.randrange(3, 500) for _ in range(120)]
    short = tiny_engine.new_sequence()
    tiny_engine.forward(short, [1, 40, 41], last_only=True)
    finished: list[str] = []
    try:
        gate = _hold(scheduler)
        prefill = scheduler.submit(_prefill_job(tiny_engine, long_prompt))
        prefill.add_done_callback(lambda _: finished.append("prefill"))
        verify = scheduler.submit(lambda: (yield ForwardItem(short, [42, 43, 44])))
        verify.add_done_callback(lambda _: finished.append("verify"))
        gate.set()
        logits = prefill.result(30)
        verify.result(30)
    finally:
        scheduler.shutdown()
    assert finished == ["verify", "prefill"]
    assert scheduler.stats.forwards >= len(long_prompt) // 16  # chunks of at most 16 rows
    assert torch.equal(logits, run_alone(_prefill_job(tiny_engine, long_prompt)(), tiny_engine))


def test_a_failing_job_or_forward_fails_only_its_own_callers(tiny_engine):
    scheduler = Scheduler(tiny_engine)

    def broken():
        yield ForwardItem(tiny_engine.new_sequence(), [1, 2])
        raise ValueError("broken session")

    try:
        gate = _hold(scheduler)
        bad = scheduler.submit(broken)
        good = scheduler.submit(_prefill_job(tiny_engine, [1, 2, 3]))
        gate.set()
        with pytest.raises(ValueError, match="broken session"):
            bad.result(10)
        assert good.result(10).shape == (1, tiny_engine.vocab_size)
        # A forward that fails (a token outside the embedding) fails its jobs; the thread lives on.
        with pytest.raises(IndexError):
            scheduler.submit(_prefill_job(tiny_engine, [1, 10**6])).result(10)
        assert scheduler.submit(lambda: 42).result(10) == 42
    finally:
        scheduler.shutdown()


PARAMS = [SamplingParams(mode=Mode.GREEDY), SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=7)]


def _edges_at_once(server, tiny_models, tiny_engine, tiny_vocab, jobs, hostile=None):
    """Run ``jobs`` [(text, params, draft_len, max_new)] as concurrent edges; their token lists.

    The engine thread is held until every edge's Open waits (so the prompts share a forward for
    sure: free-running edges can fall into turns, each one's block arriving while the other's
    runs), then for 20 ms out of every 25, as a big target's forward would hold it (the tiny
    target's take a millisecond): sessions' work queues up meanwhile and is packed together.
    """
    scheduler = server.server.servicer.scheduler
    stop, holding = threading.Event(), threading.Event()

    def until_every_open_waits():
        holding.set()
        deadline = time.monotonic() + 60
        while scheduler.pending - 1 < len(jobs) and time.monotonic() < deadline:  # less this hold
            time.sleep(0.001)

    def slow_engine():
        scheduler.submit(until_every_open_waits).result()
        while not stop.wait(0.005):
            scheduler.submit(lambda: time.sleep(0.02)).result()

    slower = threading.Thread(target=slow_engine)
    slower.start()
    holding.wait(10)
    try:
        return _run_edges(server, tiny_models, tiny_engine, tiny_vocab, jobs, hostile)
    finally:
        stop.set()
        slower.join()


def _run_edges(server, tiny_models, tiny_engine, tiny_vocab, jobs, hostile):
    drafters = [tiny_drafter(tiny_models) for _ in jobs]
    results: list = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs) + (hostile is not None))

    def edge(i):
        text, params, draft_len, max_new = jobs[i]
        barrier.wait()
        results[i] = remote(server, tiny_vocab, drafters[i], tiny_prompt(tiny_engine, text), params, draft_len, max_new)[0].tokens

    threads = [threading.Thread(target=edge, args=(i,)) for i in range(len(jobs))]
    if hostile is not None:
        threads.append(threading.Thread(target=lambda: (barrier.wait(), hostile())))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    for drafter in drafters:
        drafter.close()
    return results


def _assert_target_only(tiny_models, tiny_engine, jobs, results):
    """Each edge's tokens equal target-only decoding of its (text, params, _, max_new) job."""
    drafter = tiny_drafter(tiny_models)
    try:
        for (text, params, _, max_new), got in zip(jobs, results):
            want = generate(tiny_engine, drafter, tiny_prompt(tiny_engine, text), params, max_new_tokens=max_new,
                            spec=SpecConfig(0))
            assert got == want.tokens
    finally:
        drafter.close()


@pytest.mark.parametrize("sessions", [2, 8])
def test_concurrent_edges_equal_target_only_and_share_forwards(tiny_models, tiny_engine, tiny_vocab, sessions):
    texts = ["The cat sat", "We have 3 dogs", "It was the best of times", "Hello", "A dog ran up", "She said no",
             "The sun is red", "I see a big cat"]
    jobs = [(texts[i], PARAMS[i % 2], (2, 4, 7)[i % 3], 20 + 5 * i) for i in range(sessions)]
    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(max_draft_len=16))) as server:
        results = _edges_at_once(server, tiny_models, tiny_engine, tiny_vocab, jobs)
        stats = server.server.servicer.scheduler.stats
    _assert_target_only(tiny_models, tiny_engine, jobs, results)
    assert stats.max_sequences >= 2  # sessions really shared forwards


def test_a_hostile_stream_beside_honest_batch_mates_changes_nothing(tiny_models, tiny_engine, tiny_vocab):
    jobs = [(text, PARAMS[1], 4, 30) for text in ("The cat sat", "We have 3 dogs", "Hello world")]
    frames = HostileFrames(tiny_vocab[0], tiny_vocab[1], tiny_prompt(tiny_engine, "It was"), 16, random.Random(1))
    endings: list = []

    def hostile():
        with grpc.insecure_channel(server.address) as channel:
            for _ in range(30):
                messages, ending = frames.stream()
                endings.append(send_raw_stream(channel, messages, ending, owner="hostile", deadline_s=10)[0])

    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(max_draft_len=16))) as server:
        results = _edges_at_once(server, tiny_models, tiny_engine, tiny_vocab, jobs, hostile=hostile)
    _assert_target_only(tiny_models, tiny_engine, jobs, results)
    assert len(endings) == 30 and grpc.StatusCode.INVALID_ARGUMENT in endings


def test_a_client_that_vanishes_mid_batch_gives_its_slot_back(tiny_models, tiny_engine, tiny_vocab):
    params = PARAMS[0]
    prompt = tiny_prompt(tiny_engine, "The cat sat")
    frames = HostileFrames(tiny_vocab[0], tiny_vocab[1], prompt, 16, random.Random(2))
    opening = frames.valid_open().SerializeToString()
    draft = pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=len(prompt) + 1, payload=b"\x00")).SerializeToString()
    limits = ServiceLimits(max_sessions=2, max_sessions_per_client=2, max_draft_len=16)
    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=limits)) as server:
        with grpc.insecure_channel(server.address) as channel:
            for _ in range(2):  # two sessions opened, a block sent, then the clients vanish
                send_raw_stream(channel, [opening, draft], "abandon", owner="vanishing", deadline_s=5)
        deadline = time.monotonic() + 10
        table = server.server.servicer.table
        while table.parked < len(table) and time.monotonic() < deadline:
            time.sleep(0.05)
        # The vanished sessions are parked; two honest edges still get a slot each and exact output.
        jobs = [("The cat sat", params, 4, 12), ("Hello", params, 3, 12)]
        results = _edges_at_once(server, tiny_models, tiny_engine, tiny_vocab, jobs)
        assert len(table) <= 2
    _assert_target_only(tiny_models, tiny_engine, jobs, results)


def test_a_full_kv_budget_refuses_with_resource_exhausted_and_recovers(tiny_models, tiny_engine, tiny_vocab):
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from edge.verifier_protocol import VerifierError

    params = PARAMS[0]
    prompt = tiny_prompt(tiny_engine, "Hello")
    budget = len(prompt) + 40 + 10  # room for one session of 40 new tokens, not two
    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(max_kv_tokens=budget))) as server:
        holder = GrpcVerifier(VerifierEndpoint(server.address, *tiny_vocab))
        holder.open(prompt, params, 40, 4)
        try:
            refused = GrpcVerifier(VerifierEndpoint(server.address, *tiny_vocab))
            with pytest.raises(VerifierError, match="RESOURCE_EXHAUSTED.*KV cache budget"):
                refused.open(prompt, params, 40, 4)
            refused.close()
        finally:
            holder.close()
        # The holder's reservation is released with its session: a new one fits again.
        jobs = [("Hello", params, 4, 40)]
        results = _edges_at_once(server, tiny_models, tiny_engine, tiny_vocab, jobs)
    _assert_target_only(tiny_models, tiny_engine, jobs, results)
