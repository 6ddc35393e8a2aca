"""Forced-outcome tests of the numpy reference verification (±large logits)."""

import numpy as np
import pytest

from shared.logits import process_logits
from shared.noise import Purpose, uniform
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist, quantize
from shared.verify import race, verify_coupled, verify_greedy, verify_rejection

V = 50
BIG = 1e4


def forced_p(winners, temperature=1.0):
    """Target distributions [len(winners), V] putting ~all mass on each winner."""
    logits = np.full((len(winners), V), -BIG)
    logits[np.arange(len(winners)), winners] = BIG
    return process_logits(logits, SamplingParams(temperature=temperature))


def point(token, bits=8):
    return SparseDist(np.array([token]), np.array([1 << bits]), bits)


@pytest.mark.parametrize("verify", ["greedy", "coupled", "rejection"])
def test_full_acceptance_gives_bonus(verify):
    drafts = [3, 7, 11, 5]
    p = forced_p(drafts + [42])
    result = _run(verify, drafts, p)
    assert (result.accepted, result.token, result.bonus) == (4, 42, True)


@pytest.mark.parametrize("verify", ["greedy", "coupled", "rejection"])
def test_rejection_at_first_mismatch_gives_correction(verify):
    drafts = [3, 7, 11, 5]
    p = forced_p([3, 7, 9, 5, 42])
    result = _run(verify, drafts, p)
    assert (result.accepted, result.token, result.bonus) == (2, 9, False)


@pytest.mark.parametrize("verify", ["greedy", "coupled", "rejection"])
def test_empty_acceptance(verify):
    drafts = [3, 7]
    p = forced_p([4, 7, 1])
    result = _run(verify, drafts, p)
    assert (result.accepted, result.token, result.bonus) == (0, 4, False)


@pytest.mark.parametrize("verify", ["greedy", "coupled", "rejection"])
def test_empty_block_samples_bonus(verify):
    result = _run(verify, [], forced_p([13]))
    assert (result.accepted, result.token, result.bonus) == (0, 13, True)


def _run(verify, drafts, p, seed=5, start=100):
    if verify == "greedy":
        return verify_greedy(drafts, p)
    if verify == "coupled":
        return verify_coupled(drafts, p, seed, start)
    return verify_rejection(drafts, [point(x) for x in drafts], p, seed, start)


def test_rejection_residual_excludes_q_mass():
    # p uniform over {0, 1}; q̃ point mass on 0. The noise fixes every outcome:
    # accept 0 iff the coin U(seed, 10, 0, ACCEPT) is below p(0) / q̃(0) = 1/2, then
    # the bonus at position 11 is the race on (1/2, 1/2), won by the token with the
    # larger SAMPLE uniform; on rejection the residual max(0, p - q̃) is all on token 1.
    p = np.zeros((2, V))
    p[:, :2] = 0.5
    want = []
    for seed in range(200):
        if uniform(seed, 10, 0, Purpose.ACCEPT) < 0.5:
            want.append((1, int(np.argmax(uniform(seed, 11, np.arange(2), Purpose.SAMPLE))), True))
        else:
            want.append((0, 1, False))
    got = [verify_rejection([0], [point(0)], p, seed, 10) for seed in range(200)]
    assert [(r.accepted, r.token, r.bonus) for r in got] == want
    assert sum(r.accepted for r in got) == sum(accepted for accepted, _, _ in want)
    assert set(want) == {(0, 1, False), (1, 0, True), (1, 1, True)}  # every branch is exercised


def test_rejection_refuses_draft_outside_support():
    with pytest.raises(ValueError, match="outside"):
        verify_rejection([4], [point(3)], forced_p([4, 4]), 0, 0)


def test_block_shape_checked():
    with pytest.raises(ValueError, match=r"\[D\+1, V\]"):
        verify_greedy([1, 2], forced_p([1, 2]))


def test_race_is_exact_sample():
    weights = np.array([0.5, 0.3, 0.2, 0.0])
    counts = np.bincount([race(weights, 1, pos, 1) for pos in range(20000)], minlength=4) / 20000
    assert np.abs(counts - weights).max() < 0.015
    assert counts[3] == 0


def test_coupled_equals_target_sample_whatever_the_drafts():
    rng = np.random.default_rng(0)
    p = process_logits(rng.normal(size=(6, V)) * 2, SamplingParams(temperature=1.0))
    truth = [race(p[i], 9, 30 + i, 1) for i in range(6)]
    for drafts in ([0] * 5, truth[:5], [truth[0], truth[1], 49, 0, 0]):
        result = verify_coupled(drafts, p, 9, 30)
        committed = list(drafts[: result.accepted]) + [result.token]
        assert committed == truth[: len(committed)]


def test_sparse_quantize_invariants():
    rng = np.random.default_rng(1)
    q = rng.dirichlet(np.full(1000, 0.1))
    for k, bits in [(1, 8), (16, 8), (64, 4), (16, 16)]:
        dist = quantize(q, k, bits)
        assert dist.weights.sum() == 1 << bits and (dist.weights >= 1).all()
        assert dist.support.size <= k
        assert set(dist.support) <= set(np.argsort(-q)[:k])
    with pytest.raises(ValueError):
        SparseDist(np.array([1, 1]), np.array([128, 128]), 8)


def test_mode_parsing():
    assert SamplingParams(mode="greedy", temperature=0.9).temperature == 0.0
    with pytest.raises(ValueError):
        SamplingParams(mode="nope")
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    assert SamplingParams(mode=Mode.REJECTION).mode is Mode.REJECTION
