"""The torch fast path agrees with the numpy reference on random inputs."""

import numpy as np
import pytest
import torch

from cloud import verify_torch
from shared import noise
from shared.logits import process_logits
from shared.params import Mode, SamplingParams
from shared.sparse import quantize, sample_sparse
from shared.verify import verify_coupled, verify_greedy, verify_rejection


def test_noise_integers_bit_identical():
    rng = np.random.default_rng(0)
    for _ in range(20):
        seed = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))  # full 64-bit seeds
        positions = rng.integers(0, 2**40, size=500)
        tokens = rng.integers(0, 2**31, size=500)
        purpose = int(rng.integers(1, 5))
        a = noise.hash_counters(seed, positions, tokens, purpose)
        b = verify_torch.hash_counters(seed, torch.from_numpy(positions), torch.from_numpy(tokens), purpose)
        np.testing.assert_array_equal(a, b.numpy())
        np.testing.assert_array_equal(
            noise.uniform(seed, positions, tokens, purpose),
            verify_torch.uniform(seed, torch.from_numpy(positions), torch.from_numpy(tokens), purpose).numpy(),
        )


def test_noise_is_uniform_and_independent_across_purposes():
    u1 = noise.uniform(3, np.arange(50000), 7, noise.Purpose.SAMPLE)
    u2 = noise.uniform(3, np.arange(50000), 7, noise.Purpose.ACCEPT)
    assert abs(u1.mean() - 0.5) < 0.01 and abs(u1.var() - 1 / 12) < 0.005
    assert abs(np.corrcoef(u1, u2)[0, 1]) < 0.02


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=20),
    SamplingParams(temperature=1.3, top_k=50, top_p=0.8),
    SamplingParams(temperature=0.0),
]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_logit_processing_matches(params):
    logits = np.random.default_rng(1).normal(size=(5, 300)).astype(np.float32) * 3
    ours = verify_torch.process_logits(torch.from_numpy(logits), params).numpy()
    np.testing.assert_allclose(ours, process_logits(logits, params), atol=1e-12)


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_candidate_probs_equal_the_dense_distribution(params):
    logits = torch.from_numpy(np.random.default_rng(4).normal(size=(4, 300)).astype(np.float32) * 3)
    ids, probs = verify_torch.candidate_probs(logits, params)
    dense = torch.zeros(4, 300, dtype=torch.float64).scatter_(-1, ids, probs)
    np.testing.assert_allclose(dense.numpy(), process_logits(logits.numpy(), params), atol=1e-12)
    if 0 < params.top_k and not params.is_greedy:
        assert ids.shape[-1] == params.top_k  # sampling work scales with k, not V


def test_candidate_probs_fall_back_on_ties():
    logits = torch.zeros(1, 50)
    logits[0, :3] = 5.0  # three-way tie at k = 2
    ids, probs = verify_torch.candidate_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    dense = torch.zeros(1, 50, dtype=torch.float64).scatter_(-1, ids, probs)
    np.testing.assert_allclose(dense.numpy(), process_logits(logits.numpy(), SamplingParams(temperature=1.0, top_k=2)))
    assert (dense[0, :3] > 0).all()


@pytest.mark.parametrize("params", PARAMS, ids=str)
@pytest.mark.parametrize("mode", [Mode.COUPLED, Mode.REJECTION])
def test_verification_picks_identical_tokens(params, mode):
    params = SamplingParams(mode=mode, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=11)
    rng = np.random.default_rng(2)
    V, D = 300, 6
    for trial in range(25):
        p_logits = rng.normal(size=(D + 1, V)).astype(np.float32) * 2.5
        q_logits = p_logits + rng.normal(size=(D + 1, V)).astype(np.float32) * 1.5
        start = int(rng.integers(0, 1000))
        p = process_logits(p_logits, params)
        q_dense = process_logits(q_logits[:D], params)
        if mode is Mode.REJECTION and not params.is_greedy:
            q = [quantize(q_dense[i], 16, 8) for i in range(D)]
            drafts = [sample_sparse(q[i], params.seed, start + i) for i in range(D)]
            want = verify_rejection(drafts, q, p, params.seed, start)
        else:
            q = None
            drafts = [int(np.argmax(q_dense[i])) if trial % 2 else int(np.argmax(p[i])) for i in range(D)]
            want = verify_greedy(drafts, p) if params.is_greedy else verify_coupled(drafts, p, params.seed, start)
        got = verify_torch.verify_block(params, drafts, torch.from_numpy(p_logits), start, q)
        assert got == want
