"""What a rejection-mode client can make the target say: at most min(1, K·p) of a token it wants.

The client chooses q̃ and its drafts, so it can always draft the token ``t`` it wants under a uniform q̃
over K tokens (ordered so that its own DRAFT noise picks ``t``: the audit sees an honest draw). ``t`` is
then accepted with probability min(1, p(t)/q̃(t)) = min(1, K·p(t)): the support cap K bounds that.
A client that also knows the ACCEPT and RESIDUAL coins does better: when the coin would reject ``t`` it
drafts another token that it knows will be rejected, with a q̃ that takes the mass of the tokens that
would beat ``t`` in the residual race it can see. The service keys those coins on a secret of its own
(``SessionPolicy.coin_key``), so that knowledge is gone. Each test has a control that shows it can fail:
the same attack with the coins unkeyed, or with the support uncapped, passes the bound.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from shared.noise import Purpose, exponential, uniform
from shared.sparse import SparseDist
from shared.verify import verify_rejection

V, K, POSITION, TRIALS = 64, 16, 100, 3000
BITS = 8


def target() -> tuple[np.ndarray, int]:
    """A flat Zipf-like target over V tokens (a sampling step with a long tail), and the token the attacker
    wants: p(t) ≈ 0.0127, K·p(t) ≈ 0.20."""
    p = 1.0 / np.arange(1, V + 1) ** 0.5
    p /= p.sum()
    t = 29
    return p, t


def uniform_q(tokens: list[int]) -> SparseDist:
    """q̃ uniform over ``tokens`` (len divides 2**BITS)."""
    return SparseDist(np.array(tokens), np.full(len(tokens), (1 << BITS) // len(tokens)), BITS)


def knowing_attack(p: np.ndarray, t: int, seed: int, k: int) -> tuple[int, SparseDist]:
    """The draft and q̃ of a client that computes the ACCEPT and RESIDUAL coins from its seed."""
    fillers = [y for y in np.argsort(p) if y != t]  # the least likely first
    u = float(uniform(seed, POSITION, 0, Purpose.ACCEPT))
    if u / k < p[t]:  # the coin accepts t under a uniform q̃ over k tokens
        return t, uniform_q([t, *fillers[: k - 1]])
    # Else: a token the coin rejects, and a q̃ over the k - 1 tokens that beat t in the residual race it sees.
    keys = exponential(seed, POSITION, np.arange(V), Purpose.RESIDUAL) / p
    rivals = [int(y) for y in np.argsort(keys) if y != t][: k - 1]
    rejected = next(int(y) for y in fillers if y not in rivals and u / k >= p[y])
    return rejected, uniform_q([rejected, *rivals])


def blind_attack(p: np.ndarray, t: int, k: int) -> tuple[int, SparseDist]:
    """The draft and q̃ of a client that cannot see the coins: t under a uniform q̃ (its best)."""
    fillers = [y for y in np.argsort(p) if y != t]
    return t, uniform_q([t, *fillers[: k - 1]])


def frequency(p: np.ndarray, t: int, attack, coin_key) -> float:
    hits = 0
    for seed in range(TRIALS):
        draft, q = attack(seed)
        result = verify_rejection([draft], [q], np.stack([p, p]), seed, POSITION, coin_key=coin_key())
        committed = draft if result.accepted else result.token
        hits += committed == t
    return hits / TRIALS


def upper(share: float) -> float:
    """A bound the measured frequency stays under when the true one is ``share`` (5 sigma)."""
    return share + 5 * np.sqrt(share * (1 - share) / TRIALS)


def test_a_client_that_knows_its_coins_cannot_steer_when_the_service_keys_them():
    p, t = target()
    bound = min(1.0, K * p[t])
    secret = frequency(p, t, lambda seed: knowing_attack(p, t, seed, K), coin_key=lambda: secrets.randbits(63) or 1)
    assert secret < upper(bound), f"t came out {secret:.3f} of the time, the bound is {bound:.3f}"
    # Control: the same client against unkeyed coins (the seed alone) passes the bound by far.
    known = frequency(p, t, lambda seed: knowing_attack(p, t, seed, K), coin_key=lambda: 0)
    assert known > upper(bound) + 0.1, f"unkeyed coins: t came out {known:.3f} of the time, bound {bound:.3f}"


@pytest.mark.parametrize("k", [K, 4])
def test_a_blind_client_reaches_k_p_and_no_more(k):
    p, t = target()
    bound = min(1.0, k * p[t])
    measured = frequency(p, t, lambda seed: blind_attack(p, t, k), coin_key=lambda: secrets.randbits(63) or 1)
    assert abs(measured - bound) < 5 * np.sqrt(bound * (1 - bound) / TRIALS) + 1e-9, (measured, bound)


def test_the_support_cap_is_what_bounds_it():
    """Control: the same blind attack with a q̃ over 64 tokens (no cap at 16) takes t far past K·p."""
    p, t = target()
    measured = frequency(p, t, lambda seed: blind_attack(p, t, 64), coin_key=lambda: secrets.randbits(63) or 1)
    assert measured > upper(min(1.0, K * p[t])) + 0.2, measured
