"""The head start: where one round trip costs more of the cloud's tokens than a good drafter's chain
commits, the session starts with the cloud decoding alone, its first window of empty blocks sent
right behind the Open (``Controller.start``, ``run_decode``), as cloud-only's ``Generate`` streams
without waiting for requests. What the edge knows before the Open comes from the stream's response
headers (``shared.wire.StreamHints``), timed as a round trip. The output is the target's either way."""

from __future__ import annotations

import socket
import threading
from dataclasses import replace

import pytest
from helpers import ControllersSeen, link_for, tiny_drafter, tiny_prompt

from cloud.limits import ServiceLimits
from cloud.server import BackgroundServer, ServerConfig
from edge.controller import Controller
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.link_windows import cloud_window_for
from edge.schedule import SpecConfig
from edge.serving import Job, ServeConfig
from edge.tunables import TUNABLES
from edge.verifier_protocol import LinkHint
from shared.params import Mode, SamplingParams
from shared.wire import BLOCKS_HEADER, TOKEN_TIME_HEADER, TOKEN_TIME_REPRODUCIBLE_HEADER, StreamHints
from sim.experiment.processes import BackgroundLink
from sim.inprocess import LocalVerifier, generate
from sim.link.config import DirectionConfig, LinkConfig

N = 40
TEXT = "It was the best of times"
PARAMS = [SamplingParams(mode=Mode.GREEDY), SamplingParams(mode=Mode.COUPLED, temperature=0.8, seed=4)]


def lock_step() -> SpecConfig:
    """An adaptive session one block at a time: its verifier decodes nothing ahead (``Open.takes_ahead``
    is a pipelined edge's), so every correction costs it a round trip and a long one starts it with the
    cloud alone (a pipelined session in greedy or coupled mode never starts so: ``Controller.start``)."""
    return SpecConfig(4, window=1, controller=Controller(4, 1, 16))


SATELLITE = LinkHint(round_trip_s=0.6, cloud=StreamHints(token_s=0.09, max_blocks_in_flight=16))  # 7.7 tokens a trip


def test_stream_hints_round_trip_and_read_bad_values_as_not_said():
    hints = StreamHints(token_s=0.0905, token_s_reproducible=0.131, max_blocks_in_flight=16)
    assert StreamHints.from_metadata(hints.to_metadata()) == hints
    assert hints.token_s_for(reproducible=True) == 0.131 and hints.token_s_for(reproducible=False) == 0.0905
    assert StreamHints().to_metadata() == ()  # nothing known: nothing said
    assert StreamHints.from_metadata(None) == StreamHints()
    for bad in ("-5", "0", "1e3", " 90", "٣", "9" * 13, "61000000", ""):
        got = StreamHints.from_metadata(((TOKEN_TIME_HEADER, bad), (TOKEN_TIME_REPRODUCIBLE_HEADER, bad),
                                         (BLOCKS_HEADER, bad)))
        assert got == StreamHints(), bad
    assert StreamHints.from_metadata(((TOKEN_TIME_HEADER, b"90000"), ("other", "x"))).token_s == 0.09


def test_the_controller_starts_with_the_cloud_alone_only_where_a_round_trip_outweighs_a_chain():
    long = Controller(max_draft_len=8, window=4, cloud_window=16)
    plan = long.start(round_trip_s=0.6, token_s=0.09)
    # Its window covers a round trip and a retransmission at the cloud's pace (``cloud_window_for``).
    assert plan is not None and plan.draft_len == 0 and plan.window == cloud_window_for(0.6, 0.09) == 21
    assert long.draft_len == 0
    assert long.network_s.value == 0.6 and long.cloud_s_per_token.value == 0.09  # (measured: kept)
    assert plan.predicted_tokens_per_s == pytest.approx(1 / 0.09)
    # The boundary: a round trip and a token worth Tunables.start_chain_tokens of the cloud's.
    token_s = 0.05
    assert Controller(8, 4, 16).start((TUNABLES.start_chain_tokens - 1) * token_s * 1.01, token_s) is not None
    for round_trip_s, token_s in (((TUNABLES.start_chain_tokens - 1) * 0.05 * 0.99, 0.05), (0.1, 0.09), (0.6, 0.0)):
        short = Controller(8, 4, 16)
        assert short.start(round_trip_s, token_s) is None, (round_trip_s, token_s)
        assert short.draft_len == 4 and short.network_s.value is None  # as without a hint
    # A verifier that decodes ahead spends each correction's round trip decoding, as the cloud alone would:
    # no head start, however long the trip.
    ahead = Controller(8, 4, 16)
    ahead.expect_ahead(11)
    assert ahead.start(round_trip_s=0.6, token_s=0.09) is None and ahead.draft_len == 4
    ahead.expect_ahead(0)
    assert ahead.start(round_trip_s=0.6, token_s=0.09) is not None


class Recording(LocalVerifier):
    """Records each block sent as (start position, drafts), the head start's included."""

    def __init__(self, engine, link_hint=None, **limits) -> None:
        super().__init__(engine, link_hint=link_hint, **limits)
        self.blocks: list[tuple[int, int]] = []

    def send(self, epoch, start_position, block, more_follows, *, empty_blocks=1):
        super().send(epoch, start_position, block, more_follows, empty_blocks=empty_blocks)
        self.blocks.extend((start_position + i, len(block.tokens)) for i in range(empty_blocks))


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "coupled"])
def test_a_head_start_sends_empty_blocks_behind_the_open_and_changes_no_token(tiny_engine, drafters, params):
    prompt = tiny_prompt(tiny_engine, TEXT)
    want = generate(tiny_engine, drafters["drafter_f32"], prompt, params, max_new_tokens=N, spec=SpecConfig(0)).tokens
    hint = LinkHint(0.6, StreamHints(token_s=0.09, max_blocks_in_flight=6))
    link = Recording(tiny_engine, hint)
    got = run_decode(drafters["drafter_f32"], link, prompt, params, max_new_tokens=N,
                     spec=lock_step())
    assert got.tokens == want
    # Six empty blocks (the verifier's hint) for the positions after the first, before any verdict was read.
    assert link.blocks[:6] == [(len(prompt) + 1 + i, 0) for i in range(6)]
    assert got.stats.rounds >= 6
    # The controls: the same session with no hint starts drafting, and so does a pipelined one with the hint
    # (the verifier decodes ahead after its corrections): a drafted block goes first.
    for control_hint, spec in ((None, lock_step()), (hint, SpecConfig(4, window=4, controller=Controller(4, 4, 16)))):
        control = Recording(tiny_engine, control_hint)
        again = run_decode(drafters["drafter_f32"], control, prompt, params, max_new_tokens=N, spec=spec)
        assert again.tokens == want and control.blocks[0][1] > 0, control_hint


def test_a_head_start_keeps_to_the_token_limit(tiny_engine, drafters):
    prompt = tiny_prompt(tiny_engine, TEXT)
    link = Recording(tiny_engine, SATELLITE)
    got = run_decode(drafters["drafter_f32"], link, prompt, PARAMS[0], max_new_tokens=3,
                     spec=lock_step())
    want = generate(tiny_engine, drafters["drafter_f32"], prompt, PARAMS[0], max_new_tokens=3,
                    spec=SpecConfig(0)).tokens
    # The first token comes with the Opened; two empty blocks behind the Open ask for the other two.
    assert got.tokens == want and link.blocks == [(len(prompt) + 1, 0), (len(prompt) + 2, 0)]


def test_the_cloud_alone_pipelined_sends_its_window_behind_the_open(tiny_engine, drafters):
    """A fixed schedule with no drafts and more than one block in flight is the cloud alone: its empty blocks go
    behind the Open (the verifier's hint of blocks in flight), as Generate streams; measured on acespec-50k
    before, such a session of 64 tokens lost about a round trip (+0.08-0.15 s) to cloud-only. Lock-step
    target-only (one block at a time) keeps to one; the output is target-only's either way."""
    prompt = tiny_prompt(tiny_engine, TEXT)
    want = generate(tiny_engine, drafters["drafter_f32"], prompt, PARAMS[0], max_new_tokens=N, spec=SpecConfig(0)).tokens
    hint = LinkHint(0.1, StreamHints(token_s=0.09, max_blocks_in_flight=6))

    class BeforeTheFirstVerdict(Recording):
        def receive(self):
            self.sent_before = getattr(self, "sent_before", list(self.blocks))
            return super().receive()

    sent_first = {}
    for window in (4, 1):
        link = BeforeTheFirstVerdict(tiny_engine, hint)
        got = run_decode(drafters["drafter_f32"], link, prompt, PARAMS[0], max_new_tokens=N,
                         spec=SpecConfig(0, window=window))
        assert got.tokens == want, window
        sent_first[window] = link.sent_before
    assert sent_first[4] == [(len(prompt) + 1 + i, 0) for i in range(6)] and sent_first[1] == []


def test_the_cloud_alone_keeps_in_flight_what_a_long_link_asks(tiny_engine, drafters):
    """Over a long round trip the cloud alone keeps a round trip and a retransmission's worth of empty
    blocks in flight (``cloud_window_for``: 21 at 0.6 s and 90 ms a token), where the verifier lets it
    (``SessionTerms.empty_in_flight``), and sixteen on a short one; measured over satellite, sixteen
    made 0.79x of Generate's pace: each lost packet held the edge's next frames back, and the cloud
    waited (docs/results/2026-12-07-cloud-window-zen5-epyc)."""
    prompt = tiny_prompt(tiny_engine, TEXT)
    want = generate(tiny_engine, drafters["drafter_f32"], prompt, PARAMS[0], max_new_tokens=48,
                    spec=SpecConfig(0)).tokens

    class Counting(Recording):
        def receive(self):  # (the first verdict answers the first position, which no block asked for)
            self.answered = getattr(self, "answered", -1) + 1
            self.most = max(getattr(self, "most", 0), len(self.blocks) - self.answered)
            return super().receive()

    most = {}
    for round_trip_s, allowed in ((0.6, 64), (0.6, 16), (0.1, 64)):
        link = Counting(tiny_engine, LinkHint(round_trip_s, StreamHints(token_s=0.09, max_blocks_in_flight=allowed)),
                        max_blocks_in_flight=allowed)
        got = run_decode(drafters["drafter_f32"], link, prompt, PARAMS[0], max_new_tokens=48,
                         spec=SpecConfig(0, window=4))
        assert got.tokens == want
        most[round_trip_s, allowed] = link.most
    assert cloud_window_for(0.6, 0.09) == 21
    assert most == {(0.6, 64): 21, (0.6, 16): 16, (0.1, 64): 16}


def test_a_fixed_schedule_or_a_short_round_trip_gets_no_head_start(tiny_engine, drafters):
    prompt = tiny_prompt(tiny_engine, TEXT)
    fixed = Recording(tiny_engine, SATELLITE)  # no controller: the caller's schedule is the schedule
    run_decode(drafters["drafter_f32"], fixed, prompt, PARAMS[0], max_new_tokens=N, spec=SpecConfig(4, window=4))
    near = Recording(tiny_engine, LinkHint(0.02, StreamHints(0.09, 0.09, 16)))
    run_decode(drafters["drafter_f32"], near, prompt, PARAMS[0], max_new_tokens=N,
               spec=SpecConfig(4, window=4, controller=Controller(4, 4, 16)))
    assert fixed.blocks[0][1] > 0 and near.blocks[0][1] > 0


def test_the_stream_headers_say_the_cloud_s_pace_and_a_head_start_goes_over_grpc(tiny_models, tiny_vocab,
                                                                                   tiny_engine):
    """Over a real link: a fresh verifier hints nothing of its pace; once it has decoded alone its
    headers say its seconds per token and its blocks in flight, and the edge times them. A head start
    the hint allows goes behind the Open, and the tokens are the target's."""
    drafter = tiny_drafter(tiny_models)
    prompt = tiny_prompt(tiny_engine, TEXT)
    limits = ServiceLimits(session_ttl_s=30, max_blocks_in_flight=5)
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=limits)) as server:
            fresh = link_for(server, tiny_vocab)
            fresh.connect(stream=True)
            assert fresh.link_hint is not None and fresh.link_hint.round_trip_s > 0
            assert fresh.link_hint.cloud == StreamHints(max_blocks_in_flight=5)  # it has decoded nothing yet
            fresh.close()
            for params in [*PARAMS, SamplingParams(mode=Mode.COUPLED, temperature=0.8, seed=4, reproducible=True)]:
                want = run_decode(drafter, link_for(server, tiny_vocab), prompt, params, max_new_tokens=N,
                                  spec=SpecConfig(0)).tokens
                link = link_for(server, tiny_vocab)
                link.connect(stream=True)
                assert 0 < link.link_hint.cloud.token_s_for(params.reproducible) < 5
                # Loopback is no satellite: the link is told one (what the edge knows is its input).
                link.link_hint = LinkHint(0.6, replace(link.link_hint.cloud, token_s=0.09, token_s_reproducible=0.09))
                got = run_decode(drafter, link, prompt, params, max_new_tokens=N,
                                 spec=lock_step())
                assert got.tokens == want
                assert [b.drafts for b in list(link.block_log)[:6]] == [0] * 6  # the first position, five behind it
    finally:
        drafter.close()


def _long_link():
    """A link whose round trip (0.3 s) is worth far more than ``Tunables.start_chain_tokens`` of the tiny target's."""
    return LinkConfig(up=DirectionConfig(delay_s=0.15), down=DirectionConfig(delay_s=0.15))


def test_on_a_long_link_edge_run_times_the_round_trip_and_starts_with_the_cloud_alone(tiny_models, tiny_vocab,
                                                                                     tiny_engine):
    """Over an emulated 0.3 s round trip, with nothing told: the stream's headers are timed, the session
    starts with a window of empty blocks behind its Open, and the output is the target's alone."""
    drafter = tiny_drafter(tiny_models)
    prompt = tiny_prompt(tiny_engine, TEXT)
    params = PARAMS[1]
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(session_ttl_s=30))) as server, \
                BackgroundLink(_long_link(), server.port) as link:
            want = run_decode(drafter, link_for(server, tiny_vocab), prompt, params, max_new_tokens=N,
                              spec=SpecConfig(0)).tokens  # (direct: it also has the cloud decode alone once)
            far = GrpcVerifier(VerifierEndpoint(link.address, *tiny_vocab))
            far.connect(stream=True)
            assert far.link_hint.round_trip_s >= 0.29 and far.link_hint.cloud.token_s > 0
            got = run_decode(drafter, far, prompt, params, max_new_tokens=N,
                             spec=lock_step())
    finally:
        drafter.close()
    assert got.tokens == want
    assert [b.drafts for b in far.block_log[:17]] == [0] * 17  # the first position, sixteen behind it


def test_edge_serve_starts_a_request_from_what_the_last_one_measured_of_the_link(tiny_models, tiny_engine):
    """``edge serve`` opens its stream with the request: with nothing measured (no probe), its first
    session on a long link starts drafting, and the next starts from what that one measured (its round
    trip, and the cloud's pace its stream's headers said), with the cloud alone. A service that probed
    the link first (``measure_link``, as ``edge serve`` does beside its server) starts its first
    session with the cloud alone. All answer as the target alone would."""
    drafter = tiny_drafter(tiny_models, "drafter_noisy")
    config = dict(model_name="tiny", schedule="adaptive", draft_len=4, window=1)  # (lock-step: see ``lock_step``)
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(session_ttl_s=30))) as server, \
                BackgroundLink(_long_link(), server.port) as link:
            service = ControllersSeen.for_drafter(drafter, ServeConfig(cloud=link.address, **config), "gemma")
            prompt = service.text_prompt("The cat sat on the mat.")
            # (direct: the cloud has decoded alone before, so its headers say its pace)
            want = run_decode(drafter, link_for(server, (drafter.vocab.size, drafter.vocab.fingerprint)), prompt,
                              PARAMS[0], max_new_tokens=12, spec=SpecConfig(0)).tokens
            results = [service.run(Job(prompt, PARAMS[0], 12), lambda text: None, threading.Event()) for _ in range(2)]
            outs = [result.tokens for result in results]
            service.close()
            probed = ControllersSeen.for_drafter(drafter, ServeConfig(cloud=link.address, **config), "gemma")
            hint = probed.measure_link()
            outs.append(probed.run(Job(prompt, PARAMS[0], 12), lambda text: None, threading.Event()).tokens)
            probed.close()
    finally:
        drafter.close()
    assert outs == [want, want, want]
    first, second = service.controllers
    # No round trip known yet: it started drafting, its blocks verified or, guessing wrong the tokens the cloud
    # decoded ahead of them on the long link, answered stale.
    assert results[0].decode.drafted + results[0].decode.stale > 0
    assert service.last_link.round_trip_s >= 0.29 and service.last_link.cloud.token_s > 0
    assert second.drafted_blocks == 0 and second.draft_len == 0 and second.switches == 0  # the cloud alone
    assert hint.round_trip_s >= 0.29 and hint.cloud.token_s > 0
    [probed_first] = probed.controllers
    assert probed_first.drafted_blocks == 0 and probed_first.draft_len == 0  # the cloud alone from the first


def test_a_link_probe_with_no_cloud_gives_up_and_says_nothing(tiny_models):
    """``measure_link`` against an address nothing answers on: None after its time, nothing kept,
    no exception (``edge serve`` goes on; its first request starts drafting)."""
    drafter = tiny_drafter(tiny_models)
    try:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{unused.getsockname()[1]}"  # bound, not listening: connections are refused
            service = ControllersSeen.for_drafter(
                drafter, ServeConfig(cloud=address, model_name="tiny", schedule="adaptive", connect_timeout_s=0.2),
                "gemma")
            assert service.measure_link(give_up_after_s=0.5, every_s=0.2) is None
            service.close()
    finally:
        drafter.close()
    assert service.last_link is None
