"""Blocks in flight: token identity with target-only decoding under every window (in process and
over gRPC), drafting stopped by a verdict that voids the block, forwards shared between blocks, and the
edge refusing a verdict that does not answer the block it sent."""

from __future__ import annotations

import itertools
from collections import Counter, deque
from dataclasses import replace

import pytest
from helpers import (
    GREEDY,
    TEXTS,
    ScriptedDrafter,
    accepted_unchecked,
    exact_distribution,
    greedy_continuation,
    rejection_sampling,
    target_fit,
    tiny_prompt,
)

from edge.decode_loop import ProtocolError, run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from edge.verifier_protocol import VerifierError
from shared.params import Mode, SamplingParams
from sim.inprocess import LocalVerifier, generate

# ---------------------------------------------------------------- identity under every window


@pytest.mark.parametrize("drafter_name", ["drafter_f32", "drafter_noisy", "ngram"])
@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.COUPLED])
def test_pipelined_decoding_is_token_identical_to_target_only(tiny_engine, drafters, drafter_name, mode):
    drafter = drafters[drafter_name]
    for text, seed in itertools.product(TEXTS, (0, 5)):
        prompt = tiny_prompt(tiny_engine, text)
        params = SamplingParams(mode=mode, temperature=0.9, seed=seed)
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, spec=SpecConfig(0))
        for draft_len, window in ((0, 4), (1, 4), (3, 2), (4, 3), (8, 8)):
            got = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40,
                           spec=SpecConfig(draft_len, window=window))
            assert got.tokens == want.tokens, f"D={draft_len} W={window} seed={seed}"
            assert got.stop_reason == want.stop_reason


class PacedVerifier(LocalVerifier):
    """A cloud whose verdict for a block is ready once the loop has asked ``lag`` times since the block
    went (the loop asks before each drafted token: time measured in drafter steps); ``lag`` None: never
    before ``receive`` (drafting is never stopped). Records each block sent as (start, drafts)."""

    def __init__(self, engine, lag: int | None) -> None:
        super().__init__(engine)
        self.lag, self.asked = lag, 0
        self.sent_at: deque[int] = deque()
        self.blocks: list[tuple[int, int]] = []

    def open(self, *args, **kwargs):
        terms = super().open(*args, **kwargs)
        self.sent_at.appendleft(self.asked - (self.lag or 0))  # the first position's, answered with the Opened
        return terms

    def send(self, epoch, start_position, block, more_follows, *, empty_blocks=1):
        for i in range(empty_blocks):  # (a frame of several empty blocks: each is timed as its own)
            super().send(epoch, start_position + i, block, more_follows)
            self.sent_at.append(self.asked)
            self.blocks.append((start_position + i, len(block.tokens)))

    def ready(self) -> bool:
        self.asked += 1
        return self.lag is not None and bool(self.sent_at) and self.asked - self.sent_at[0] >= self.lag

    def receive(self):
        self.sent_at.popleft()
        return super().receive()


@pytest.mark.parametrize("wrong_every", [3, 7])
def test_drafting_stops_only_for_a_verdict_that_voids_the_block(tiny_engine, tiny_vocab, wrong_every):
    """Drafting stops for a verdict that voids the block and goes on after one that does not.

    A verdict that arrives while a block is drafted is read before the next draft: a correction ends
    the block there (it is not sent), an acceptance or a stale block's token that the block guessed lets
    it go on to its full length. The output stays target-only's; less is drafted, fewer blocks go stale."""
    prompt = tiny_prompt(tiny_engine, TEXTS[1])
    want = greedy_continuation(tiny_engine, prompt, 48)
    runs = {}
    for lag in (None, 2, 6):  # never (drafting is not stopped), within the next block, one and a half blocks
        drafter = ScriptedDrafter(tiny_vocab[0], want, len(prompt), right=False, wrong_every=wrong_every)
        link = PacedVerifier(tiny_engine, lag)
        got = run_decode(drafter, link, prompt, GREEDY, max_new_tokens=48, spec=SpecConfig(4, window=3))
        assert got.tokens == want[:48], f"lag {lag}"
        runs[lag] = (drafter.stats.drafted, got.stats.stale, link.blocks)
    for lag in (2, 6):
        drafted, stale, blocks = runs[lag]
        assert drafted < runs[None][0] and stale < runs[None][1], (lag, runs)
        # Blocks that went were drafted to their full length, the limit aside (a chain's first block
        # holds guesses besides): drafting went on after the verdicts that did not void them.
        assert all(drafts >= 4 for start, drafts in blocks if start - len(prompt) + 4 < 47), (lag, blocks)


def test_pipelining_shares_forwards_between_blocks(tiny_engine, drafters):
    prompt = tiny_prompt(tiny_engine, TEXTS[1])
    lockstep = generate(tiny_engine, drafters["drafter_f32"], prompt, GREEDY, max_new_tokens=40, spec=SpecConfig(4))
    piped = generate(tiny_engine, drafters["drafter_f32"], prompt, GREEDY, max_new_tokens=40,
                     spec=SpecConfig(4, window=4))
    assert piped.tokens == lockstep.tokens
    assert piped.stats.target_forwards < lockstep.stats.target_forwards  # queued blocks share a forward


@pytest.mark.slow
def test_rejection_mode_with_blocks_in_flight_samples_the_target(tiny_engine, drafters):
    prompt = tiny_prompt(tiny_engine, "It was the best of times")
    exact = exact_distribution(tiny_engine, prompt, rejection_sampling())
    drafter = drafters["drafter_noisy"]
    samples, n = [], 1500
    for seed in range(n):
        got = generate(tiny_engine, drafter, prompt, rejection_sampling(seed), max_new_tokens=3,
                       spec=SpecConfig(1, window=3))
        samples.append(tuple(got.tokens))
        assert got.stats.rebased == 0  # a draft's q̃ holds only on the path it was drafted on
    fit = target_fit(Counter(samples), exact)
    assert fit.fits(), fit
    # The control: the same samples, one session in ten with its drafts accepted unchecked.
    unchecked = target_fit(accepted_unchecked(samples, drafter, prompt, rejection_sampling), exact)
    assert not unchecked.fits(), unchecked


@pytest.mark.parametrize("lie", ["skips-an-uncommitted-draft", "stale-with-accepted-drafts"])
def test_the_edge_refuses_a_verdict_that_does_not_fit_what_it_sent(tiny_engine, drafters, lie):
    class Lying(LocalVerifier):
        def receive(self):
            received = super().receive()
            verdict = received.verdict
            if verdict.accepted >= 2 and not verdict.stale:
                if lie == "skips-an-uncommitted-draft":  # as if the block's first draft had been committed
                    verdict = replace(verdict, start_position=verdict.start_position + 1, accepted=verdict.accepted - 1)
                else:
                    verdict = replace(verdict, stale=True)
                return replace(received, verdict=verdict)
            return received

    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    with pytest.raises(ProtocolError, match="does not answer the block"):
        run_decode(drafters["drafter_f32"], Lying(tiny_engine), prompt, GREEDY, max_new_tokens=24,
                   spec=SpecConfig(4, window=2))


# ---------------------------------------------------------------- over gRPC


@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.COUPLED])
def test_pipelined_edge_over_grpc_is_token_identical(tiny_engine, tiny_vocab, drafters, verifier, mode):
    drafter = drafters["drafter_noisy"]
    for text in TEXTS:
        prompt = tiny_prompt(tiny_engine, text)
        params = SamplingParams(mode=mode, temperature=0.9, seed=2)
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=32, spec=SpecConfig(0))
        for draft_len, window in ((3, 2), (6, 4)):
            link = GrpcVerifier(VerifierEndpoint(verifier.address, *tiny_vocab))
            got = run_decode(drafter, link, prompt, params, max_new_tokens=32,
                             spec=SpecConfig(draft_len, window=window))
            assert got.tokens == want.tokens, f"D={draft_len} W={window}"
            assert len(link.rtt_samples_s) + link.unasked == got.stats.rounds + got.stats.stale  # (an unasked end: no trip)
            assert len(link.block_log) == got.stats.rounds + got.stats.stale_decoded  # a dropped block had no forward
            # Every forward is the prefill, a verified block's, a stale decode's or one decoded ahead (a token
            # or more each, all told by the end: the cloud decodes ahead no further than the session goes).
            assert got.stats.target_forwards <= 1 + got.stats.rounds + got.stats.stale_decoded + got.stats.ahead


def test_the_edge_respects_the_window_the_cloud_allows(tiny_engine, tiny_vocab, drafters, verifier):
    link = GrpcVerifier(VerifierEndpoint(verifier.address, *tiny_vocab))
    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    got = run_decode(drafters["drafter_f32"], link, prompt, GREEDY, max_new_tokens=24, spec=SpecConfig(2, window=1000))
    want = generate(tiny_engine, drafters["drafter_f32"], prompt, GREEDY, max_new_tokens=24, spec=SpecConfig(0))
    assert got.tokens == want.tokens
    with pytest.raises(ValueError, match="window"):
        run_decode(drafters["drafter_f32"], link, prompt, GREEDY, max_new_tokens=24, spec=SpecConfig(2, window=0))
    assert VerifierError  # the client's error type stays importable for callers
