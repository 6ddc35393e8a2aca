"""The speculation cache: where it bets, when a branch is taken, and identity with target-only decoding."""

from __future__ import annotations

import math

import pytest
from helpers import ScriptedDrafter, greedy_continuation, tiny_drafter, tiny_prompt

from edge.drafter import DraftBlock, Speculation
from edge.in_flight import InFlight
from edge.schedule import SpecConfig
from edge.speculation_cache import SpeculationCache
from shared.params import Mode, SamplingParams
from shared.stats import DecodeStats
from sim.inprocess import generate

GREEDY = SamplingParams(mode=Mode.GREEDY)


class _Recording:
    """A drafter whose speculation is the prompt, then drafts: its branches say where they stood."""

    def __init__(self, committed: list[int], speculated: list[int]) -> None:
        self._spec = Speculation.start(committed)
        self._spec.tokens.extend(speculated)

    @property
    def sequence(self) -> list[int]:
        return self._spec.tokens

    def draft_branch(self, back, first, n, stop=None):
        with self._spec.branched(back, first):
            return DraftBlock([len(self._spec.tokens) + i for i in range(n)])


def _flight(start: int, tokens: list[int], runner_up, margins, epoch: int = 0) -> InFlight:
    return InFlight(epoch, start, DraftBlock(tokens, None, runner_up, margins), True)


def test_the_bet_is_where_the_oldest_block_most_likely_first_fails():
    cache = SpeculationCache(enabled=True)
    # Drafts 1 and 3 are as uncertain as each other, but the block seldom gets past draft 1 to fail at 3.
    oldest = _flight(5, [10, 11, 12, 13], [20, 21, None, 23], [3.0, 0.1, 0.1, 0.1])
    bet = cache.bet([oldest, _flight(9, [14], [24], [0.0])], committed_end=5)
    assert (bet.block, bet.index, bet.token) == (oldest, 1, 21)
    failure, reach = [], 1.0  # P(the block's first failure is at draft i), each accepted with 1 - exp(-margin)
    for margin in (3.0, 0.1, 0.1, 0.1):
        failure.append(reach * math.exp(-margin))
        reach *= 1 - math.exp(-margin)
    assert bet.share == pytest.approx(failure[1] / sum(failure), rel=1e-6)
    # Drafts committed already (guesses of tokens decoded for stale blocks) are not bet on.
    assert cache.bet([oldest], committed_end=7).index == 3
    # Off, no runner-ups, rejection mode's q̃: no bet.
    assert SpeculationCache(enabled=False).bet([oldest], 5) is None
    assert cache.bet([_flight(5, [10], None, None)], 5) is None
    rejection = InFlight(0, 5, DraftBlock([10], [object()], [20], [0.1]), True)
    assert cache.bet([rejection], 5) is None


def test_a_branch_is_drafted_once_per_block_and_taken_only_on_its_exact_sequence():
    cache = SpeculationCache(enabled=True)
    oldest = _flight(3, [10, 11, 12], [20, 21, 22], [5.0, 0.01, 5.0])
    drafter = _Recording([1, 2, 3], [10, 11, 12, 13, 14])
    bet = cache.bet([oldest], committed_end=3)
    assert bet.index == 1
    assert cache.fill(drafter, bet, drafts=4, stop=lambda: False)
    assert drafter.sequence == [1, 2, 3, 10, 11, 12, 13, 14]  # the speculation is left as it was
    assert cache.branch.base == (1, 2, 3, 10, 21) and cache.branch.block.tokens == [5, 6, 7, 8]
    assert cache.bet([oldest], committed_end=3) is None  # one bet a block
    assert cache.take([1, 2, 3, 10, 11], drafts=4) is None  # the draft was accepted: not this branch
    assert cache.take([1, 2, 3, 10, 22], drafts=4) is None  # another correction
    taken = cache.take([1, 2, 3, 10, 21], drafts=3)
    assert taken.block.tokens == [5, 6, 7] and cache.branch is None  # within the block's drafts, and gone
    # A speculation that no longer holds the block bet on drafts nothing.
    stale = _flight(3, [30, 31], [40, 41], [0.1, 0.1], epoch=1)
    assert not cache.fill(drafter, cache.bet([stale], 3), drafts=4, stop=lambda: False)
    assert cache.branch is None


def _session(blocks: int, whole: int, corrections: int, hits: int) -> DecodeStats:
    """A session's counts: ``blocks`` blocks of four drafts, ``whole`` of them accepted whole, the rest
    rejected at their first draft; ``hits`` of ``corrections`` guessed by the runner-up."""
    stats = DecodeStats()
    for i in range(blocks):
        stats.record_round(4, 4 if i < whole else 0, 5 if i < whole else 1)
    stats.corrections_guessed, stats.corrections_hit = corrections, hits
    return stats


def test_a_branch_goes_before_the_next_block_only_where_it_is_likelier_to_be_used():
    cache = SpeculationCache(enabled=True)
    oldest = _flight(3, [10, 11, 12, 13], [20, 21, 22, 23], [0.1, 3.0, 3.0, 3.0])  # it fails first at draft 0 if at all
    bet = cache.bet([oldest], 3)
    assert bet.index == 0 and bet.share > 0.9
    weak, strong = _session(20, 2, 18, 9), _session(20, 18, 2, 2)
    assert cache.pays(bet, [oldest], weak)  # blocks seldom pass whole: the correction's block is the likelier
    assert not cache.pays(bet, [oldest], strong)  # they mostly do: the next block is
    assert not cache.pays(bet, [oldest], _session(20, 2, 18, 0))  # the runner-up never is the correction
    assert cache.pays(bet, [oldest, _flight(7, [14, 15, 16, 17], [24, 25, 26, 27], None)], _session(20, 10, 10, 9))


@pytest.fixture(scope="module")
def greedy_path(tiny_engine):
    prompt = tiny_prompt(tiny_engine, "The cat sat on the mat and looked at the")
    return prompt, greedy_continuation(tiny_engine, prompt)


@pytest.mark.parametrize("right", [True, False])
def test_a_right_bet_becomes_the_next_block_and_a_wrong_one_is_dropped(tiny_engine, greedy_path, right):
    """Every draft is wrong, with the target's token (``right``) or another as its runner-up; a
    branch continues with the target's own tokens. A right bet's branch is the next chain's first block
    (its drafts all accepted); a wrong one is never sent."""
    prompt, want = greedy_path
    drafter = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), right)
    cached = SpecConfig(3, window=3, speculation_cache=True)
    got = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=30, spec=cached)
    assert got.tokens == want[:30]
    stats = got.stats
    assert stats.cache_branches > 0 and stats.restarts > 0
    if right:
        assert 0 < stats.cache_hits <= stats.restarts and stats.cache_drafts >= stats.cache_hits
    else:
        assert stats.cache_hits == 0 and stats.cache_drafts == 0
    plain = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=30, spec=SpecConfig(3, window=3))
    assert plain.tokens == want[:30] and plain.stats.cache_branches == 0
    if right:  # (the control: without the cache, every block's first draft was wrong)
        assert stats.accepted > plain.stats.accepted


@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.COUPLED])
def test_cached_decoding_is_token_identical(tiny_models, tiny_engine, mode):
    drafter = tiny_drafter(tiny_models, "drafter_noisy")
    try:
        hits = 0
        for text, seed in (("The cat sat on the mat.", 0), ("We have 3 dogs and 12 cats!", 4)):
            prompt = tiny_prompt(tiny_engine, text)
            params = SamplingParams(mode=mode, temperature=0.9, seed=seed)
            want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, spec=SpecConfig(0))
            got = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40,
                           spec=SpecConfig(5, window=3, speculation_cache=True))
            assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
            assert got.stats.cache_branches > 0
            hits += got.stats.cache_hits
        assert hits > 0  # the noisy drafter's runner-up is often the target's token
    finally:
        drafter.close()


def test_llama_branches_draft_on_their_own_sequence_and_a_taken_one_is_not_read_again(tiny_models, tiny_engine):
    """A branch drafts what the drafter would from the branch's sequence, leaves the speculation's KV
    as it was (the next drafts are a drafter's that never branched), and once taken, its evaluated
    tokens join the speculation's sequence without being read again."""
    prompt = tiny_prompt(tiny_engine, "The cat sat on the mat and looked at the")
    branching, plain = tiny_drafter(tiny_models), tiny_drafter(tiny_models)
    try:
        for drafter in (branching, plain):
            drafter.begin(prompt, GREEDY)
        main = branching.draft(8).tokens
        assert plain.draft(8).tokens == main
        bet = (main[3] + 1) % tiny_engine.vocab_size
        evaluated = branching.llm.n_tokens
        branch = branching.draft_branch(5, bet, 4)  # departs at draft 3
        assert branching.sequence == prompt + main and len(branch.tokens) == 4 and branch.runner_up
        assert branching.llm.n_tokens == evaluated  # (nothing of the speculation's is to be read again)
        assert branching.draft(3).tokens == plain.draft(3).tokens  # the speculation's KV was untouched
        plain.commit(main[:3] + [bet])
        plain.rewind()
        assert plain.draft(4).tokens == branch.tokens  # what the drafter drafts on the branch's sequence
        branching.commit(main[:3] + [bet])  # the verifier corrected draft 3 to the bet: the branch is taken
        branching.rewind()
        read = branching.llm.n_tokens
        branching.speculate(branch.tokens)
        assert branching.llm.n_tokens == read + 4  # the bet and three drafts: evaluated on the branch's sequence
        assert branching.draft(3).tokens == plain.draft(3).tokens
    finally:
        branching.close()
        plain.close()


def test_a_branch_near_the_end_of_the_drafter_s_context_keeps_within_it(tiny_models, tiny_engine):
    """The speculation's cells and a branch's share the drafter's one cache: near its end a branch drafts
    fewer (none where nothing fits), and llama.cpp is never asked for a cell it lacks."""
    drafter = tiny_drafter(tiny_models, n_ctx=64)
    try:
        prompt = (tiny_prompt(tiny_engine, "The cat sat on the mat and looked at the") * 8)[:50]
        drafter.begin(prompt, GREEDY)
        main = drafter.draft(10).tokens  # 60 of 64 positions
        assert len(main) == 10
        branch = drafter.draft_branch(6, (main[4] + 1) % tiny_engine.vocab_size, 8)
        assert len(branch.tokens) <= 64 - 60 - 1
        assert drafter.sequence == prompt + main
        assert len(drafter.draft(8).tokens) == 64 - 60 - 1  # the speculation drafts on to the context's end
    finally:
        drafter.close()
