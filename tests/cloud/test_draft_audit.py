"""The draft audit: rejection mode refuses drafts not sampled from the q̃ sent with them.

The pure math (``shared.draft_audit``) against slow references and by simulation of honest
sessions; then a real verifier on loopback with the tiny models: a naive forgery is refused with
the message, a forgery shaped around the known noise is ended, honest rejection-mode decoding is
not, ``--modes`` and ``--rejection-to`` refuse what is not served. Each attack has a
control: with the audit off the same forgery goes through.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import threading
import time

import grpc
import numpy as np
import pytest
from helpers import tiny_drafter, tiny_prompt

from cloud.cli import build_parser
from cloud.identity import Credentials
from cloud.limits import ServiceLimits
from cloud.server import BackgroundServer, ServerConfig
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from protos import splitspec_pb2 as pb
from shared import draft_audit
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist, draft_noise, quantize, sampled_indices
from shared.wire import sampling_to_proto
from sim.bench.fuzz import run_shaped_forgery, send_forged_stream
from sim.bench.hostile_frames import HostileFrames, neutral_q, shaped_q

INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION

GRANTED = ("all",)  # rejection mode granted to every client (it is served to nobody by default)


def _random_q(rng: np.random.Generator, top_k: int, prob_bits: int, vocab: int = 1000) -> SparseDist:
    ids = rng.choice(vocab, size=min(vocab, 3 * top_k), replace=False)
    return quantize(rng.dirichlet(np.full(ids.size, rng.choice([0.03, 0.3, 3.0]))), top_k, prob_bits, ids=ids)


# ---------------------------------------------------------------- the pure math


def test_sampled_indices_are_the_searchsorted_rule_per_position():
    rng = np.random.default_rng(0)
    for _ in range(200):
        bits = int(rng.integers(1, 17))
        q = [_random_q(rng, int(rng.integers(1, 65)), bits) for _ in range(int(rng.integers(1, 9)))]
        seed, start = int(rng.integers(0, 2**63)), int(rng.integers(0, 10**6))
        want = [int(np.searchsorted(np.cumsum(d.weights), int(draft_noise(seed, start + i, bits)), side="right"))
                for i, d in enumerate(q)]
        assert sampled_indices(q, seed, start).tolist() == want


def test_the_audit_finds_the_first_draft_that_is_not_its_draw():
    rng = np.random.default_rng(1)
    q = [_random_q(rng, 16, 8) for _ in range(8)]
    drawn = [int(d.support[i]) for d, i in zip(q, sampled_indices(q, 7, 100))]
    audit = draft_audit.audit_block(drawn, q, 7, 100)
    assert audit.unsampled is None
    assert np.allclose(audit.scores, draft_audit.surprise(drawn, q))  # the reference score
    for bad in (0, 5, 7):
        other = [t for t in q[bad].support.tolist() if t != drawn[bad]]
        if other:
            assert draft_audit.unsampled([*drawn[:bad], other[0], *drawn[bad + 1:]], q, 7, 100) == bad
    assert draft_audit.unsampled(drawn, q, 8, 100) is not None  # another seed's noise draws other tokens


def test_the_score_is_an_e_value_under_every_q():
    """E_{x~q̃}[exp(score)] = sum_x q̃(x) / (n q̃(x)) = 1: honest drafts have no drift upwards."""
    rng = np.random.default_rng(2)
    for _ in range(50):
        dist = _random_q(rng, int(rng.integers(1, 65)), int(rng.integers(1, 17)))
        scores = draft_audit.surprise(dist.support.tolist(), [dist] * dist.support.size)
        probs = dist.weights / float(1 << dist.prob_bits)
        assert float(np.sum(probs * np.exp(scores))) == pytest.approx(1.0, abs=1e-12)
        assert float(np.sum(probs * scores)) <= 1e-12  # E[score] = H(q̃) - ln n <= 0


def test_cusum_is_the_lindley_recursion():
    rng = np.random.default_rng(3)
    for _ in range(100):
        scores, start, h = rng.normal(0, 2, size=int(rng.integers(1, 20))), float(rng.uniform(0, 5)), 6.0
        statistic, crossed = start, None
        for i, score in enumerate(scores):
            statistic = max(0.0, statistic + score)
            if crossed is None and statistic >= h:
                crossed = i
        got, got_crossed = draft_audit.cusum(start, scores, h)
        assert got == pytest.approx(statistic) and got_crossed == crossed


def test_the_threshold_and_its_detection_bounds():
    assert draft_audit.THRESHOLD == pytest.approx(math.log(2**16 / 1e-4)) == pytest.approx(20.30, abs=0.01)
    assert draft_audit.positions_to_alarm(16 / 256) == 8  # weight 2^-8, support 16 (the default draft_top_k)
    assert draft_audit.positions_to_alarm(64 / 256) == 15
    assert draft_audit.positions_to_alarm(128 / 256) == 30 <= 32


def _q_pool(rng: np.random.Generator, top_k: int, bits: int, size: int = 400) -> list[SparseDist]:
    """Random q̃ of one session's draft_top_k and prob_bits: quantized Dirichlet draws, and (a third)
    one heavy token with a tail at the smallest weight, the q̃ whose honest draws score highest."""
    pool = []
    for _ in range(size):
        if rng.random() < 0.3:
            n = int(rng.integers(2, top_k + 1))
            pool.append(SparseDist(rng.choice(1000, n, replace=False), np.array([(1 << bits) - (n - 1), *[1] * (n - 1)]),
                                   bits))
        else:
            pool.append(_random_q(rng, top_k, bits))
    return pool


def _honest_sessions(sessions: int, positions: int, threshold: float, seed: int, flatten: bool = False,
                     ) -> tuple[int, float]:
    """Simulated honest sessions, drafts drawn by the drafter's own rule (``sampled_indices``, each
    session its own seed) from random q̃: (how many the CUSUM ended at ``threshold``, the highest
    statistic seen). ``flatten``: a miscalibrated drafter instead, whose draws are uniform over each
    q̃'s support (the control)."""
    rng = np.random.default_rng(seed)
    pools = {(top_k, bits): _q_pool(rng, top_k, bits) for top_k in (4, 16, 64) for bits in (8, 12)}
    ended, peak = 0, 0.0
    for session in range(sessions):
        pool = pools[list(pools)[session % len(pools)]]
        q = [pool[i] for i in rng.integers(len(pool), size=positions)]
        if flatten:
            drafts = [int(d.support[rng.integers(d.support.size)]) for d in q]
            scores = draft_audit.surprise(drafts, q)
        else:
            drafts = [int(d.support[i]) for d, i in zip(q, sampled_indices(q, seed * sessions + session, 1000))]
            audit = draft_audit.audit_block(drafts, q, seed * sessions + session, 1000)
            assert audit.unsampled is None
            scores = audit.scores
        statistic = 0.0
        for block in range(0, positions, 8):
            statistic, crossed = draft_audit.cusum(statistic, scores[block : block + 8], threshold)
            peak = max(peak, statistic)
            if crossed is not None:
                ended += 1
                break
    return ended, peak


def test_false_alarms_on_simulated_honest_sessions_stay_under_the_bound():
    """P(an honest session of n drafts is ended) <= n e^-h. At the service's threshold none of the
    simulated sessions is; at a threshold where the bound is 5% (h = ln(n / 0.05)) some are, fewer
    than the bound allows; the control (a drafter whose draws do not follow its q̃) is ended far more."""
    n = 256
    ended, peak = _honest_sessions(300, n, draft_audit.THRESHOLD, seed=0)
    assert ended == 0 and peak < 0.6 * draft_audit.THRESHOLD, peak
    loose = math.log(n / 0.05)
    ended, _ = _honest_sessions(300, n, loose, seed=1)
    assert ended / 300 <= 0.05, ended
    control, _ = _honest_sessions(100, n, loose, seed=2, flatten=True)
    assert control / 100 >= 0.5, control


def test_a_shaped_forgery_is_the_draw_and_a_wire_valid_q():
    rng = random.Random(0)
    for _ in range(300):
        bits, top_k = rng.choice([4, 8, 12]), rng.choice([1, 2, 16, 64])
        r, want = rng.randrange(1 << bits), 5
        others = rng.sample(range(6, 1000), top_k)
        for dist in (shaped_q(want, r, bits, top_k, others), neutral_q(want, r, bits, top_k, others)):
            if dist is None:
                continue
            assert dist.support.size <= top_k and (np.diff(dist.weights) <= 0).all()
            cumulative = np.cumsum(dist.weights)
            assert int(dist.support[int(np.searchsorted(cumulative, r, side="right"))]) == want


# ---------------------------------------------------------------- a real verifier


@pytest.fixture(scope="module")
def endless(tiny_engine):
    """The tiny target without an EOS: a forgery runs until the audit (or its length) ends it."""
    engine = copy.copy(tiny_engine)
    engine.eos_token_ids = set()
    return engine


@pytest.fixture(scope="module")
def server(serve_module, endless):
    return serve_module(ServiceLimits(max_draft_len=16, rejection_to=GRANTED), engine=endless)


@pytest.fixture(scope="module")
def unaudited(serve_module, endless):
    """The control: the same verifier with the audit off."""
    limits = ServiceLimits(max_draft_len=16, audit_drafts=False, rejection_to=GRANTED)
    return serve_module(limits, engine=endless)


@pytest.fixture(scope="module")
def prompt(tiny_engine):
    return tiny_prompt(tiny_engine, "The cat sat on the mat.")


@pytest.fixture(scope="module")
def frames(tiny_engine, prompt):
    return HostileFrames(tiny_engine.vocab_size, tiny_engine.fingerprint, prompt, 16, random.Random(0))


def _forged_call(address: str, frames: HostileFrames, seed: int, garbage: bool):
    messages = [frames.rejection_open(seed).SerializeToString(),
                frames.forged_draft(frames.P, seed, 16 if garbage else 4, garbage=garbage).SerializeToString()]
    with grpc.insecure_channel(address) as channel:
        return send_forged_stream(channel, messages, 1, "forger", deadline_s=20)


def _forged(server, check: str = "unsampled") -> float:
    """Sessions the audit ended so far, by ``check``."""
    return server.server.metrics.registry.get_sample_value("splitspec_forged_drafts_total", {"check": check}) or 0.0


@pytest.mark.parametrize("garbage", [False, True], ids=["naive", "garbage-at-max-D"])
def test_a_forged_block_is_refused_with_the_message(server, unaudited, frames, garbage):
    before = _forged(server)
    for seed in range(3):
        code, details, verdicts = _forged_call(server.address, frames, seed, garbage)
        assert (code, verdicts) == (INVALID, 0), (code, details)
        assert details.startswith("draft not sampled from its q̃"), details
    assert _forged(server) == before + 3
    deadline = time.monotonic() + 5
    while len(server.server.servicer.table) and time.monotonic() < deadline:  # released as the RPC ends
        time.sleep(0.05)
    assert len(server.server.servicer.table) == 0  # the sessions are over, not parked
    # The control: without the audit the same blocks are verified and answered.
    code, details, verdicts = _forged_call(unaudited.address, frames, 0, garbage)
    assert verdicts == 1, (code, details)


def test_a_shaped_forgery_at_weight_2_8_is_ended_within_32_positions(server, unaudited, tiny_vocab, prompt):
    """The forger knows the seed: where the wire allows it, its token is the draw at weight 2^-8,
    elsewhere the draw of a uniform q̃ (no test on q̃ can see that one). The audit ends it within
    ``positions_to_alarm(16 / 256)`` = 8 drafts at weight 2^-8 (of about 140 positions); without the
    audit it runs to its length."""
    bound = draft_audit.positions_to_alarm(16 / 256)
    for seed in range(2):
        outcome = run_shaped_forgery(VerifierEndpoint(server.address, *tiny_vocab), prompt, seed=seed, strategy="tail",
                                     max_new_tokens=600)
        assert outcome.ended and draft_audit.IMPROBABLE in outcome.message, outcome
        assert 1 <= outcome.low_weight <= bound <= 32, outcome
    control = run_shaped_forgery(VerifierEndpoint(unaudited.address, *tiny_vocab), prompt, seed=0, strategy="tail",
                                 max_new_tokens=400)
    assert not control.ended and control.positions == 400 and control.low_weight > 2 * bound, control


def test_a_forgery_shaped_at_every_position_is_ended(server, tiny_vocab, prompt):
    """Every draft is the forger's token, at the smallest weight the wire allows there."""
    for seed in range(2):
        outcome = run_shaped_forgery(VerifierEndpoint(server.address, *tiny_vocab), prompt, seed=seed, strategy="shaped",
                                     max_new_tokens=300)
        assert outcome.ended and draft_audit.IMPROBABLE in outcome.message and outcome.positions <= 100, outcome


def test_honest_rejection_decoding_is_never_ended(server, tiny_models, tiny_vocab, prompt):
    drafter = tiny_drafter(tiny_models, "drafter_noisy")
    endpoint = VerifierEndpoint(server.address, *tiny_vocab)
    before = _forged(server, "improbable"), _forged(server, "unsampled")
    try:
        for seed in range(4):
            for top_k in (4, 16):
                params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, top_k=top_k, draft_top_k=top_k,
                                        seed=seed)
                result = run_decode(drafter, GrpcVerifier(endpoint), prompt, params, max_new_tokens=60,
                                    spec=SpecConfig(4))
                assert len(result.tokens) == 60
    finally:
        drafter.close()
    assert (_forged(server, "improbable"), _forged(server, "unsampled")) == before


def test_the_service_keys_every_sessions_coins_on_a_secret_of_its_own(server, frames):
    """Rejection mode's ACCEPT and RESIDUAL coins are keyed on a secret the service draws per session and
    never sends (``SessionPolicy.coin_key``; what it stops: tests/shared/test_rejection_steering.py)."""
    table = server.server.servicer.table
    stop = threading.Event()
    opened = threading.Barrier(3)

    def hold_open():
        with grpc.insecure_channel(server.address) as channel:
            stub = channel.stream_stream("/splitspec.v1.Verifier/Decode",
                                         request_serializer=pb.EdgeFrame.SerializeToString,
                                         response_deserializer=pb.CloudFrame.FromString)
            requests = iter([frames.valid_open(sampling=sampling_to_proto(REJECTION))])
            replies = stub(itertools.chain(requests, _after(stop)), timeout=20)
            assert next(replies).WhichOneof("kind") == "opened"
            opened.wait(10)
            stop.wait(10)

    holders = [threading.Thread(target=hold_open) for _ in range(2)]
    for holder in holders:
        holder.start()
    try:
        opened.wait(10)
        keys = [entry.session.policy.coin_key for entry in table.entries() if entry.attached]
    finally:
        stop.set()
        for holder in holders:
            holder.join(20)
    assert len(keys) == 2 and all(keys) and keys[0] != keys[1], keys
    assert "coin_key" not in pb.Opened.DESCRIPTOR.fields_by_name


def _after(event: threading.Event):
    event.wait(10)
    yield pb.EdgeFrame(close=pb.Close())


# ---------------------------------------------------------------- which modes, to whom


def _open(address: str, frames: HostileFrames, params: SamplingParams, token: str | None = None):
    frame = frames.valid_open(sampling=sampling_to_proto(params))
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(address) as channel:
        stub = channel.stream_stream("/splitspec.v1.Verifier/Decode", request_serializer=pb.EdgeFrame.SerializeToString,
                                     response_deserializer=pb.CloudFrame.FromString)
        done = threading.Event()

        def requests():
            yield frame
            done.wait(10)
            yield pb.EdgeFrame(close=pb.Close())

        try:
            for answer in stub(requests(), timeout=20, metadata=metadata):
                done.set()
                return answer.WhichOneof("kind"), ""
        except grpc.RpcError as error:
            return error.code(), error.details()
        finally:
            done.set()


REJECTION = SamplingParams(mode=Mode.REJECTION, temperature=1.0, seed=1)


def test_an_open_for_a_mode_not_served_is_refused(serve, tiny_engine, frames):
    limits = ServiceLimits(modes=("greedy", "coupled"))
    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=limits)) as running:
        code, details = _open(running.address, frames, REJECTION)
        assert code == PRECONDITION and details == "this verifier does not serve rejection mode (it serves greedy, coupled)"
        assert _open(running.address, frames, SamplingParams(mode=Mode.COUPLED, seed=1))[0] == "opened"
        # temperature 0 is greedy in every mode, and greedy is served
        assert _open(running.address, frames, SamplingParams(mode=Mode.REJECTION, temperature=0.0))[0] == "opened"
    running = serve(ServiceLimits(rejection_to=GRANTED))  # the control: every mode
    assert _open(running.address, frames, REJECTION)[0] == "opened"


def test_generate_serves_only_the_modes_an_open_may_ask_for(serve, tiny_engine, tiny_vocab):
    """Cloud-only decoding is held to ``--modes`` too (it ignored them)."""
    from edge.cloud_only import cloud_only_generate
    from edge.verifier_protocol import VerifierError

    prompt = tiny_prompt(tiny_engine, "Hello")
    limited = serve(ServiceLimits(modes=("greedy", "coupled")))
    with pytest.raises(VerifierError, match="does not serve rejection mode"):
        cloud_only_generate(VerifierEndpoint(limited.address, *tiny_vocab), prompt, REJECTION, max_new_tokens=4)
    greedy = SamplingParams(mode=Mode.REJECTION, temperature=0.0)  # temperature 0 is greedy in every mode
    assert cloud_only_generate(VerifierEndpoint(limited.address, *tiny_vocab), prompt, greedy, max_new_tokens=4).tokens
    everything = serve(ServiceLimits(rejection_to=GRANTED))  # the control: every mode
    assert cloud_only_generate(VerifierEndpoint(everything.address, *tiny_vocab), prompt, REJECTION,
                               max_new_tokens=4).tokens


def test_a_rejection_open_over_the_q_support_cap_is_refused(serve, frames):
    """A uniform q̃ over K tokens lets a client that knows its noise push a token to min(1, K p): the
    verifier caps K (``--max-draft-top-k``, default 16)."""
    wide = SamplingParams(mode=Mode.REJECTION, temperature=1.0, seed=1, draft_top_k=256)
    capped = serve(ServiceLimits(rejection_to=GRANTED))
    code, details = _open(capped.address, frames, wide)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "exceeds this verifier's limit of 16" in details, details
    assert _open(capped.address, frames, REJECTION)[0] == "opened"  # the default support, 16
    assert _open(capped.address, frames, SamplingParams(mode=Mode.COUPLED, seed=1, draft_top_k=256))[0] == "opened"
    assert _open(serve(ServiceLimits(max_draft_top_k=256, rejection_to=GRANTED)).address, frames,
                 wide)[0] == "opened"  # the control


def test_rejection_mode_is_served_only_to_identities_granted_it(tiny_engine, serve, frames):
    """By default nobody gets rejection mode (greedy and coupled are served to all); a grant names whom."""
    default = serve()
    code, details = _open(default.address, frames, REJECTION)
    assert code == PRECONDITION and "only to clients it grants it (--rejection-to)" in details
    assert _open(default.address, frames, SamplingParams(mode=Mode.COUPLED, seed=1))[0] == "opened"
    assert _open(serve(ServiceLimits(rejection_to=GRANTED)).address, frames, REJECTION)[0] == "opened"  # the control
    credentials = Credentials({"alice": "a-token-0123456789", "bob": "b-token-0123456789"})
    alice_only = serve(ServiceLimits(rejection_to=("alice",)), credentials=credentials)
    assert _open(alice_only.address, frames, REJECTION, token="a-token-0123456789")[0] == "opened"
    assert _open(alice_only.address, frames, REJECTION, token="b-token-0123456789")[0] == PRECONDITION
    clients = serve(ServiceLimits(rejection_to=("clients",)), credentials=credentials)
    assert _open(clients.address, frames, REJECTION, token="b-token-0123456789")[0] == "opened"
    # Without tokens a client is its peer address: a grant by client id could never match, so it is refused.
    with pytest.raises(ValueError, match="grants by client need bearer tokens"):
        ServerConfig(port=0, limits=ServiceLimits(rejection_to=("alice",)))
    with pytest.raises(ValueError, match="cannot be empty"):
        ServiceLimits(rejection_to=("",))


def test_the_modes_flags(tmp_path):
    parser = build_parser()
    args = parser.parse_args(["serve", "--modes", "greedy", "coupled"])
    assert args.modes == ["greedy", "coupled"] and args.rejection_to == []
    assert parser.parse_args(["serve"]).modes == ["greedy", "coupled", "rejection"]
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--modes", "beam"])
    assert parser.parse_args(["serve", "--rejection-to", "alice", "peer:ipv4:10.0.0.7"]).rejection_to == [
        "alice", "peer:ipv4:10.0.0.7"]
    with pytest.raises(ValueError, match="modes must be"):
        ServiceLimits(modes=())


def test_bench_service_prices_the_audit_in_rejection_mode():
    from sim.bench.service import format_service_report, run_service_bench

    report = run_service_bench(sessions=2, max_new_tokens=16, mode="rejection")
    assert report["mode"] == "rejection" and report["unaudited_ms_per_round"] > 0
    # (What the audit costs is the benchmark's number, not this test's: a loaded machine moves it.)
    # The cost is the ratio of the audited run's time a round to the unaudited run's (both measured here).
    audited = report["loopback_grpc_ms_per_round"] / report["unaudited_ms_per_round"] - 1
    assert math.isfinite(report["audit_cost"]) and report["audit_cost"] == pytest.approx(audited)
    assert "draft audit" in format_service_report(report)
    with pytest.raises(ValueError, match="coupled or rejection"):
        run_service_bench(mode="greedy")
