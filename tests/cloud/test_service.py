"""The edge client and the verifier service over real loopback gRPC."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter

import grpc
import pytest
from helpers import (
    accepted_unchecked,
    exact_distribution,
    link_for,
    rejection_sampling,
    remote,
    target_fit,
    tiny_drafter,
    tiny_prompt,
)

from cloud.limits import ServiceLimits
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.report import SPLIT, EdgeReport
from edge.schedule import SpecConfig
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.wire import sampling_to_proto
from sim.inprocess import generate

SAMPLINGS = [
    SamplingParams(mode=Mode.GREEDY),
    SamplingParams(mode=Mode.COUPLED, temperature=0.8, seed=4),
    SamplingParams(mode=Mode.COUPLED, temperature=1.0, top_p=0.9, seed=9),
]


@pytest.mark.parametrize("params", SAMPLINGS, ids=lambda p: f"{p.mode.value}-T{p.temperature}")
def test_edge_run_is_token_identical_to_target_only(tiny_models, tiny_engine, tiny_vocab, verifier, params):
    drafter = tiny_drafter(tiny_models)
    try:
        for text in ("The cat sat on the mat.", "We have 3 dogs"):
            prompt = tiny_prompt(tiny_engine, text)
            want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=32, spec=SpecConfig(0))
            for draft_len in (3, 8):
                got, link = remote(verifier, tiny_vocab, drafter, prompt, params, draft_len)
                assert got.tokens == want.tokens
                assert link.bytes_up > 0 and link.bytes_down > 0
                # One round trip per verify() call, each net of the cloud's time and inside the generation.
                assert len(link.rtt_samples_s) == got.stats.rounds and min(link.rtt_samples_s) > 0
                cloud_s = sum(block.cloud_s for block in link.block_log)
                assert sum(link.rtt_samples_s) + cloud_s < got.stats.wall_s
                assert got.stats.rounds < len(want.tokens)  # drafts were accepted
    finally:
        drafter.close()


@pytest.mark.slow
def test_rejection_mode_over_the_network_samples_the_target(tiny_models, tiny_engine, tiny_vocab, serve):
    # A session per sample, a thousand from one address as fast as they go: no bound on the Open rate here
    # (the bound has its own test: test_open_rate.py).
    verifier = serve(ServiceLimits(max_draft_len=16, session_ttl_s=30, rejection_to=("all",), opens_per_client_s=0))
    prompt = tiny_prompt(tiny_engine, "It was the best of times")

    def params_for(seed: int) -> SamplingParams:
        return rejection_sampling(seed, draft_top_k=4)

    exact = exact_distribution(tiny_engine, prompt, params_for(0))
    drafter = tiny_drafter(tiny_models)
    samples, n = [], 1000
    channel = grpc.insecure_channel(verifier.address)  # one connection, a session per sample
    try:
        for seed in range(n):
            got, _ = remote(verifier, tiny_vocab, drafter, prompt, params_for(seed), draft_len=2, max_new_tokens=3,
                            channel=channel)
            samples.append(tuple(got.tokens))
        # The control: the same samples, one session in ten with its drafts accepted unchecked.
        unchecked = target_fit(accepted_unchecked(samples, drafter, prompt, params_for), exact)
    finally:
        channel.close()
        drafter.close()
    fit = target_fit(Counter(samples), exact)
    assert fit.fits(), fit
    assert not unchecked.fits(), unchecked


def test_concurrent_sessions_each_get_their_own_output(tiny_models, tiny_engine, tiny_vocab, verifier):
    jobs = [(text, seed) for text in ("The cat sat", "We have 3 dogs", "It was the best", "Hello world") for seed in (1, 2)]
    drafters = [tiny_drafter(tiny_models) for _ in jobs]
    expected = []
    for (text, seed), drafter in zip(jobs, drafters):
        params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=seed)
        expected.append(generate(tiny_engine, drafter, tiny_prompt(tiny_engine, text), params, max_new_tokens=40,
                                 spec=SpecConfig(0)).tokens)
    results: list = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def worker(i):
        text, seed = jobs[i]
        params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=seed)
        barrier.wait()
        results[i] = remote(verifier, tiny_vocab, drafters[i], tiny_prompt(tiny_engine, text), params, 5, 40)[0].tokens

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for drafter in drafters:
        drafter.close()
    assert results == expected
    assert len({tuple(r) for r in results}) == len(jobs)  # really different sessions


def test_cloud_only_generate_matches_target_only(tiny_models, tiny_engine, tiny_vocab, verifier):
    params = SamplingParams(mode=Mode.COUPLED, temperature=0.8, seed=3)
    prompt = tiny_prompt(tiny_engine, "The cat sat on the mat.")
    drafter = tiny_drafter(tiny_models)
    want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=25, spec=SpecConfig(0)).tokens
    drafter.close()
    encoded = codec.encode_tokens(prompt, tiny_vocab[0])
    request = pb.GenerateRequest(
        vocab_size=tiny_vocab[0], vocab_fingerprint=tiny_vocab[1], sampling=sampling_to_proto(params),
        prompt=encoded.data, prompt_compressed=encoded.compressed, max_new_tokens=25,
    )
    with grpc.insecure_channel(verifier.address) as channel:
        chunks = list(pb_grpc.VerifierStub(channel).Generate(request, timeout=60))
    tokens = [t for c in chunks for t in codec.decode_tokens(c.tokens, c.compressed, tiny_vocab[0], max_tokens=64).tolist()]
    assert tokens == want and chunks[-1].done and chunks[-1].stop_reason == pb.STOP_REASON_LENGTH


def test_metrics_count_what_happened(tiny_models, tiny_engine, tiny_vocab, verifier):
    metrics = verifier.server.metrics
    drafter = tiny_drafter(tiny_models, "drafter_f32")
    try:
        result, link = remote(verifier, tiny_vocab, drafter, tiny_prompt(tiny_engine, "Hello"), SamplingParams(mode=Mode.GREEDY), 4, 20)
    finally:
        drafter.close()
    value = lambda name: metrics.registry.get_sample_value(name) or 0.0  # noqa: E731
    assert value("splitspec_drafted_tokens_total") == result.stats.drafted
    assert value("splitspec_accepted_tokens_total") == result.stats.accepted
    assert value("splitspec_target_forwards_total") == result.stats.target_forwards
    # The prefill, then one per drafted block: the first position is answered from the prefill's last row.
    assert result.stats.target_forwards == result.stats.rounds
    assert value("splitspec_bytes_in_total") == link.bytes_up
    assert value("splitspec_bytes_out_total") == link.bytes_down
    assert metrics.registry.get_sample_value("splitspec_accepted_at_position_total", {"position": "0"}) >= 1
    assert metrics.registry.get_sample_value("splitspec_verify_latency_seconds_count") == result.stats.rounds
    # Every verify step that ran a forward (all but the prefill), by its rows: at most the block's drafts and one.
    steps = {sample.labels["rows"]: sample.value for family in metrics.registry.collect() for sample in family.samples
             if sample.name == "splitspec_verify_service_seconds_count"}
    assert sum(steps.values()) == result.stats.target_forwards - 1 and {int(rows) for rows in steps} <= set(range(1, 6))


def test_edge_run_cli_json(tiny_models, verifier):
    result = subprocess.run(
        [sys.executable, "-m", "sim.cli", "edge", "run", "--cloud", verifier.address, "--drafter", tiny_models["drafter_f32"],
         "--prompt", "The cat sat", "--max-new-tokens", "20", "--temperature", "0", "--json", "--timings",
         "--schedule", "lockstep"],  # (blocks in flight overlap in the cloud: their times would not add up)
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = EdgeReport.from_json(json.loads(result.stdout))
    assert report.kind == SPLIT and len(report.tokens) == 20
    assert report.bytes_up > 0 and report.bytes_down > 0
    assert len(report.blocks) == report.decode.rounds and report.drafter.drafted == report.decode.drafted
    # Each round trip is its verify() call's time less the cloud's, and the calls lie inside
    # wall_s; at least half the rounds are >= the median, so median <= 2 * (their sum) / rounds.
    # Over loopback the serialisation and the hops still take time: the median is > 0.
    cloud_s = sum(block.cloud_s for block in report.blocks)
    bound_ms = 2e3 * (report.wall_s - cloud_s) / report.decode.rounds
    assert 0 < report.rtt_ms < bound_ms, (report.rtt_ms, report.wall_s, cloud_s)


def test_gemma_pair_over_the_network_is_token_identical(gemma_engine):
    from cloud.server import BackgroundServer, ServerConfig
    from edge.drafter_choice import open_llama_drafter

    drafter = open_llama_drafter(None, n_threads=1)
    vocab = (drafter.vocab.size, drafter.vocab.fingerprint)
    assert vocab == (gemma_engine.vocab_size, gemma_engine.fingerprint)
    prompt = drafter.vocab.tokenize("The three primary colors are")
    try:
        with BackgroundServer(gemma_engine, ServerConfig(port=0)) as server:
            for params in (SamplingParams(mode=Mode.GREEDY), SamplingParams(mode=Mode.COUPLED, temperature=0.7, seed=1)):
                want = generate(gemma_engine, drafter, prompt, params, max_new_tokens=24, spec=SpecConfig(0))
                got, link = remote(server, vocab, drafter, prompt, params, draft_len=6, max_new_tokens=24)
                assert got.tokens == want.tokens
                assert got.stats.acceptance_rate > 0.5
    finally:
        drafter.close()


def test_a_stream_opened_ahead_carries_the_generation(tiny_models, tiny_engine, tiny_vocab, verifier):
    """``connect(stream=True)``: the cloud answers the stream's headers at once, and the Open then
    goes on that stream; a stream never used sends no Close and fails nothing."""
    import time

    params = SamplingParams(mode=Mode.COUPLED, temperature=0.8, seed=4)
    prompt = tiny_prompt(tiny_engine, "The cat sat on the mat.")
    drafter = tiny_drafter(tiny_models)
    try:
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=20, spec=SpecConfig(0)).tokens
        link = link_for(verifier, tiny_vocab)
        started = time.monotonic()
        link.connect(stream=True)
        assert time.monotonic() - started < 1.9  # answered, not waited out (two seconds)
        ahead = link._stream.call
        got = run_decode(drafter, link, prompt, params, max_new_tokens=20, spec=SpecConfig(4, window=2))
        assert got.tokens == want
        assert ahead.code() == grpc.StatusCode.OK  # it carried the session to its end (not cancelled for another)
        link.close()
        unused = link_for(verifier, tiny_vocab)
        unused.connect(stream=True)
        unused.close()
    finally:
        drafter.close()
    time.sleep(0.2)  # (the cloud sees the unused stream end)
    failed = [s for family in verifier.server.metrics.registry.collect() for s in family.samples
              if s.name == "splitspec_sessions_failed_total" and s.value]
    assert failed == []


def test_a_stream_the_cloud_ended_before_the_open_is_replaced(tiny_models, tiny_engine, tiny_vocab):
    """The cloud ends a stream that sends no Open within ``open_timeout_s``; a stream opened ahead
    and ended so (or just old) is replaced on ``open``, and the output is unchanged."""
    import time

    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig

    params = SamplingParams(mode=Mode.GREEDY)
    prompt = tiny_prompt(tiny_engine, "Hello there")
    drafter = tiny_drafter(tiny_models)
    config = ServerConfig(port=0, limits=ServiceLimits(max_draft_len=16, open_timeout_s=0.3))
    try:
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=12, spec=SpecConfig(0)).tokens
        with BackgroundServer(tiny_engine, config) as server:
            link = link_for(server, tiny_vocab)
            link.connect(stream=True)
            ahead = link._stream.call
            time.sleep(1.0)
            assert ahead.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # the cloud gave up on it
            got = run_decode(drafter, link, prompt, params, max_new_tokens=12, spec=SpecConfig(4, window=2))
            assert got.tokens == want and not link.recoveries  # a new stream, not a recovery from the dead one
            link.close()
    finally:
        drafter.close()


def test_the_first_token_s_cloud_time_counts_the_prefill(gemma_engine):
    """Generate's first chunk and the Opened's first verdict both report the cloud's time from the
    request, the prefill included (the sim splits time to first token into the cloud's and the rest)."""
    from cloud.server import BackgroundServer, ServerConfig
    from edge.cloud_only import cloud_only_generate
    from edge.drafter_choice import open_llama_drafter

    drafter = open_llama_drafter(None, n_threads=1)
    vocab = (drafter.vocab.size, drafter.vocab.fingerprint)
    prompt = drafter.vocab.tokenize(" ".join(["The three primary colors are red, yellow and blue."] * 48))
    params = SamplingParams(mode=Mode.GREEDY)
    try:
        with BackgroundServer(gemma_engine, ServerConfig(port=0)) as server:
            base = cloud_only_generate(VerifierEndpoint(server.address, *vocab), prompt, params, max_new_tokens=6)
            step = sorted(chunk.cloud_s for chunk in base.chunk_log[1:])[2]  # one decode step (median of five)
            assert base.chunk_log[0].cloud_s > 2 * step  # a prefill of ~600 rows (about 8 steps here), then the token
            link = link_for(server, vocab)
            run_decode(drafter, link, prompt, params, max_new_tokens=6, spec=SpecConfig(4, window=2))
            assert 2 * step < link.first_token_cloud_s <= link.open_s
    finally:
        drafter.close()


def test_a_link_that_keeps_dropping_is_survived_or_fails_fast_when_told(tiny_models, tiny_engine, tiny_vocab, verifier):
    import time

    from edge.verifier_protocol import VerifierError
    from sim.experiment.processes import BackgroundLink
    from sim.inprocess import generate
    from sim.link.config import LinkConfig

    drafter = tiny_drafter(tiny_models)
    params = SamplingParams(mode=Mode.GREEDY)
    prompt = tiny_prompt(tiny_engine, "The cat sat")
    size, fingerprint = tiny_vocab
    try:
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=60, spec=SpecConfig(0))
        # Every connection dies after ~1 kB: after Open and a few blocks.
        with BackgroundLink(LinkConfig(cut_after_bytes=1000), verifier.port) as link:
            resuming = GrpcVerifier(VerifierEndpoint(link.address, size, fingerprint), verdict_timeout_s=20)
            got = run_decode(drafter, resuming, prompt, params, max_new_tokens=60, spec=SpecConfig(2))
            assert got.tokens == want.tokens and len(resuming.recoveries) >= 2
            once = GrpcVerifier(VerifierEndpoint(link.address, size, fingerprint), outage_budget_s=0)
            started = time.monotonic()
            with pytest.raises(VerifierError, match="lost the cloud.*resuming is off") as caught:
                run_decode(drafter, once, prompt, params, max_new_tokens=60, spec=SpecConfig(2))
            assert time.monotonic() - started < 15
            assert caught.value.partial.tokens == want.tokens[: len(caught.value.partial.tokens)]
    finally:
        drafter.close()


def test_a_full_session_table_refuses_with_resource_exhausted(serve, tiny_models, tiny_engine, tiny_vocab):
    from cloud.limits import ServiceLimits
    from edge.verifier_protocol import VerifierError

    params = SamplingParams(mode=Mode.GREEDY)
    prompt = tiny_prompt(tiny_engine, "Hello")
    server = serve(ServiceLimits(max_sessions=1))
    holder = link_for(server, tiny_vocab)
    holder.open(prompt, params, 10, 4)  # holds the only slot
    try:
        refused = link_for(server, tiny_vocab)
        with pytest.raises(VerifierError, match="RESOURCE_EXHAUSTED"):
            refused.open(prompt, params, 10, 4)
        refused.close()
    finally:
        holder.close()
    # The slot is free again once the holder closed its session.
    drafter = tiny_drafter(tiny_models)
    try:
        got, _ = remote(server, tiny_vocab, drafter, prompt, params, 4, max_new_tokens=8)
    finally:
        drafter.close()
    assert len(got.tokens) == 8


def test_health_and_reflection_describe_the_service(verifier):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(verifier.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(health_pb2.HealthCheckRequest(service="splitspec.v1.Verifier"), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert "splitspec.v1.Verifier" in names and "grpc.health.v1.Health" in names
