"""The fast path of ``shared.noise``, ``shared.logits`` and ``shared.verify`` in torch.

Same contracts as the numpy reference, on the engine's device: noise
integers are bit-identical (int64 wraparound, logical shifts by masking) and
verification picks identical tokens (tests hold the two against each other).
Work is lazy along the block: coupled mode stops hashing at the first
mismatch, so a rejected block costs only the positions it reached.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shared import noise as ref
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist
from shared.verify import VerifyResult, coin_seed

__all__ = ["hash_counters", "uniform", "exponential", "process_logits", "race", "verify_block"]

_I64 = torch.int64
_C = {name: int(getattr(ref, name)) for name in ("GOLDEN", "MIX1", "MIX2", "K_POSITION", "K_TOKEN", "K_PURPOSE")}
_MASK = {s: int(m) for s, m in ref._MASK.items()}


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    return (x >> s) & _MASK[s]


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * _C["MIX1"]
    x = (x ^ _shr(x, 27)) * _C["MIX2"]
    return x ^ _shr(x, 31)


def hash_counters(seed: int, position, token, purpose: int, device=None) -> torch.Tensor:
    """Bit-identical to ``shared.noise.hash_counters``; int64 tensor."""
    key = _mix(torch.tensor(int(ref._as_int64(seed)), dtype=_I64, device=device) + _C["GOLDEN"])
    x = _mix(key + torch.as_tensor(position, dtype=_I64, device=device) * _C["K_POSITION"])
    purpose_term = int(ref._as_int64(int(purpose) * _C["K_PURPOSE"]))  # wrapped like numpy's int64 product
    x = x + torch.as_tensor(token, dtype=_I64, device=device) * _C["K_TOKEN"] + purpose_term
    return _mix(x)


def uniform(seed: int, position, token, purpose: int, device=None) -> torch.Tensor:
    """U in (0, 1), float64, as ``shared.noise.uniform``."""
    top = _shr(hash_counters(seed, position, token, purpose, device), 11)
    return (top.to(torch.float64) + 0.5) * (1.0 / (1 << 53))


def exponential(seed: int, position, token, purpose: int, device=None) -> torch.Tensor:
    return -torch.log(uniform(seed, position, token, purpose, device))


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [..., V] -> float64 probabilities, as ``shared.logits.process_logits``."""
    logits = logits.to(torch.float64)
    if params.is_greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep = torch.empty_like(before, dtype=torch.bool).scatter_(-1, order, before < params.top_p)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def candidate_probs(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """p on its candidate tokens: (ids [R, n] int64, probs [R, n] float64) for logits [R, V].

    With top-k the candidates are the k best tokens (n = k), so sampling work
    scales with k instead of V; otherwise every token (n = V). Same
    distribution as ``process_logits``; where the k-th logit is tied, falls
    back to the dense path, which keeps every tie as the reference does.
    """
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab - 1 and not params.is_greedy:
        # Select on the raw logits (dividing by T > 0 keeps the order); only k values go to float64.
        k = params.top_k
        values, ids = torch.topk(logits, k + 1, dim=-1)  # sorted, best first; one extra to see ties
        if bool((values[..., k] < values[..., k - 1]).all()):
            values, ids = values[..., :k], ids[..., :k]
            probs = torch.softmax(values.to(torch.float64) / params.temperature, dim=-1)
            if params.top_p < 1.0:
                before = torch.cumsum(probs, dim=-1) - probs
                probs = torch.where(before < params.top_p, probs, 0.0)
                probs = probs / probs.sum(dim=-1, keepdim=True)
            return ids, probs
    ids = torch.arange(vocab, device=logits.device).expand(logits.shape[0], vocab)
    return ids, process_logits(logits, params)


def race(weights: torch.Tensor, seed: int, position: int, purpose: int, ids: torch.Tensor | None = None) -> int:
    """argmin_x E(x)/w(x) over w > 0, as ``shared.verify.race``; ``ids`` [n] names the
    token of each weight when ``weights`` [n] covers only candidates (default: all ids)."""
    tokens = torch.arange(weights.shape[-1], device=weights.device) if ids is None else ids
    keys = exponential(seed, position, tokens, purpose, weights.device) / weights
    keys = torch.where(weights > 0, keys, torch.inf)
    return int(tokens[torch.argmin(keys)])


def verify_block(
    params: SamplingParams,
    drafts: Sequence[int],
    logits: torch.Tensor,
    start_position: int,
    q: Sequence[SparseDist] | None = None,
    coin_key: int = 0,
) -> VerifyResult:
    """Verify ``drafts`` [D] against the target's logits [D+1, V] for positions
    ``start_position ..``; dispatches on the mode (temperature 0 is greedy in every mode).
    ``coin_key``: rejection mode's secret (``shared.verify.coin_seed``).
    """
    n = len(drafts)
    if logits.shape[0] != n + 1:
        raise ValueError(f"need {n + 1} logit rows for {n} drafts, got {logits.shape[0]}")
    if params.is_greedy:
        best = logits.argmax(dim=-1).tolist()
        for i, x in enumerate(drafts):
            if x != best[i]:
                return VerifyResult(i, best[i], bonus=False)
        return VerifyResult(n, best[n], bonus=True)
    ids, p = candidate_probs(logits, params)  # [D+1, n] each
    seed = params.seed
    if params.mode is Mode.REJECTION:
        if n and (q is None or len(q) != n):
            raise ValueError("rejection mode needs one q̃ per draft")
        coins = coin_seed(seed, coin_key)
        accept_u = uniform(coins, torch.arange(start_position, start_position + n), 0, ref.Purpose.ACCEPT).tolist()
        for i, x in enumerate(drafts):
            q_x = q[i].prob(int(x))
            if q_x <= 0:
                raise ValueError(f"draft {int(x)} at position {start_position + i} is outside its q̃ support")
            p_x = float(p[i][ids[i] == x].sum())
            if accept_u[i] * q_x < p_x:
                continue
            q_dense = torch.zeros(logits.shape[-1], dtype=torch.float64, device=p.device)
            q_dense[torch.as_tensor(q[i].support, device=p.device)] = torch.as_tensor(
                q[i].weights / float(1 << q[i].prob_bits), dtype=torch.float64, device=p.device
            )
            residual = torch.clamp(p[i] - q_dense[ids[i]], min=0.0)  # zero outside p's candidates anyway
            return VerifyResult(i, race(residual, coins, start_position + i, ref.Purpose.RESIDUAL, ids[i]), bonus=False)
    else:
        for i, x in enumerate(drafts):
            y = race(p[i], seed, start_position + i, ref.Purpose.SAMPLE, ids[i])
            if x != y:
                return VerifyResult(i, y, bonus=False)
    return VerifyResult(n, race(p[n], seed, start_position + n, ref.Purpose.SAMPLE, ids[n]), bonus=True)
