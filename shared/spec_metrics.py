"""Acceptance as the field measures it: SPEED-Bench's metrics, vLLM's and llama-server's fields.

The input is a histogram of *acceptance lengths*, {tokens a speculative step emitted: steps}
(``DecodeStats.accept_lengths``; the target's own token counted, so a step that accepted no draft has
length 1). From it, in NVIDIA Model-Optimizer's ``specdec_bench`` definitions:

- the mean acceptance length per step (the histogram's mean) and per request (each request's mean,
  averaged over requests: ``average_request_al``);
- the *conditional* acceptance rate at length k, P(L >= k | L >= k - 1), and the *joint* one,
  P(L >= k), the product of the conditionals up to k. ``specdec_bench`` keys both by the lengths it
  observed, skipping the others; here they are dense over 1 .. the longest length (an unobserved length
  between observed ones has conditional rate P(L >= k) / P(L >= k - 1) like any other), which is the
  same where every length was observed;
- ``speculation_profile``: its ``speculation_profile.json`` (schema 1.0): per draft position i the
  conditional and marginal rates at length i + 2, the mean, the accept-length model, and the
  mean-consistency (mean = 1 + sum of the marginals) and monotonicity checks.

``vllm_request_metrics`` and ``llama_timings`` are the per-request objects those servers return, so the
tools that read them read ours. Pure: stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["SCHEMA_VERSION", "acceptance_rates", "average_request_al", "mean_accept_length", "merge",
           "speculation_profile", "vllm_request_metrics", "llama_timings"]

SCHEMA_VERSION = "1.0"  # specdec_bench's speculation_profile.json
_CONSISTENCY_TOLERANCE = 0.02  # specdec_bench's default


def merge(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """One histogram of several (requests, categories)."""
    out: dict[int, int] = {}
    for histogram in histograms:
        for length, steps in histogram.items():
            out[int(length)] = out.get(int(length), 0) + int(steps)
    return dict(sorted(out.items()))


def mean_accept_length(histogram: Mapping[int, int]) -> float | None:
    """Tokens per speculative step, weighted by steps (None: no step)."""
    steps = sum(histogram.values())
    return sum(int(k) * v for k, v in histogram.items()) / steps if steps else None


def average_request_al(histograms: Iterable[Mapping[int, int]]) -> float | None:
    """specdec_bench's ``Average_AL``: each request's mean acceptance length, averaged over requests
    (a short request weighs as much as a long one; None: no request took a step)."""
    means = [m for m in (mean_accept_length(h) for h in histograms) if m is not None]
    return sum(means) / len(means) if means else None


def acceptance_rates(histogram: Mapping[int, int]) -> tuple[dict[int, float], dict[int, float]]:
    """({length k: conditional rate P(L >= k | L >= k - 1)}, {k: joint rate P(L >= k)}), for k from 1
    to the longest length (both 1.0 at k = 1); empty for an empty histogram."""
    steps = sum(histogram.values())
    if not steps:
        return {}, {}
    longest = max(int(k) for k in histogram)
    conditional, joint = {}, {}
    at_least_before = steps
    for k in range(1, longest + 1):
        at_least = sum(v for length, v in histogram.items() if int(length) >= k)
        conditional[k] = at_least / at_least_before if at_least_before else 0.0
        joint[k] = at_least / steps
        at_least_before = at_least
    return conditional, joint


def speculation_profile(histogram: Mapping[int, int], num_speculative_tokens: int, *,
                        request_histograms: Iterable[Mapping[int, int]] = (), method: str = "draft_model",
                        draft_checkpoint: str | None = None, target_model: str | None = None,
                        per_category: Mapping[str, dict] | None = None,
                        measurement_conditions: Mapping | None = None) -> dict:
    """specdec_bench's ``speculation_profile.json`` (schema 1.0) for ``histogram``, measured with at most
    ``num_speculative_tokens`` drafts a step (for splitspec: a chain's drafts). Position i is length
    i + 2; positions never reached are 0.0. ``validation`` holds its two checks (a failed one is recorded,
    not raised: the profile stays inspectable)."""
    conditional, joint = acceptance_rates(histogram)
    cond = [round(conditional.get(i + 2, 0.0), 6) for i in range(num_speculative_tokens)]
    marginal = [round(joint.get(i + 2, 0.0), 6) for i in range(num_speculative_tokens)]
    mean = mean_accept_length(histogram)
    per_request = average_request_al(request_histograms)
    implied = 1.0 + sum(marginal)
    violations = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
                  for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-9]
    measured = mean is not None
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": measured,
        "method": method,
        "draft_checkpoint": draft_checkpoint,
        "target_model": target_model,
        "num_speculative_tokens": num_speculative_tokens,
        "block_size": None,
        "max_supported_k": num_speculative_tokens,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": cond,
        "marginal_accept_rates": marginal,
        "mean_accept_length": None if mean is None else round(mean, 6),
        "mean_accept_length_per_request": None if per_request is None else round(per_request, 6),
        # A draft model drafts each block as a chain (the block of K is a prefix of the block of K + 1).
        "accept_length_model": "chain_analytic",
        "accept_length_by_k": {} if mean is None else {str(num_speculative_tokens): round(mean, 6)},
        "acceptance_length_histogram": {str(k): v for k, v in sorted(histogram.items())},
        "per_category": dict(per_category) if per_category else None,
        "measurement_conditions": dict(measurement_conditions) if measurement_conditions else None,
        "validation": None if not measured else {
            "mean_consistency": {
                "implied_mean_accept_length": round(implied, 6),
                "reported_mean_accept_length": round(mean, 6),
                "abs_delta": round(abs(implied - mean), 6),
                "tolerance": _CONSISTENCY_TOLERANCE,
                "passed": abs(implied - mean) <= _CONSISTENCY_TOLERANCE,
            },
            "marginal_monotonicity": {"passed": not violations, "violations": violations},
        },
    }


def vllm_request_metrics(histogram: Mapping[int, int], drafted: int) -> dict | None:
    """vLLM's per-request ``speculative_decoding`` object (vLLM PR 48915, as aiperf reads it):
    ``num_spec_steps`` steps that drafted ``num_draft_tokens`` and had ``num_accepted_draft_tokens``
    accepted; ``acceptance_histogram`` a dense list, index j the steps that accepted j drafts. Every count
    comes from ``histogram`` ({length: steps}, length = 1 + accepted), so they add up as aiperf checks.
    None when nothing was drafted (no speculative step: vLLM sends no object then either)."""
    steps = sum(histogram.values())
    if not steps:
        return None
    accepted = sum((int(length) - 1) * count for length, count in histogram.items())
    dense = [0] * max(int(length) for length in histogram)
    for length, count in histogram.items():
        dense[int(length) - 1] += count
    return {
        "num_spec_steps": steps,
        "num_draft_tokens": max(drafted, accepted),
        "num_accepted_draft_tokens": accepted,
        "mean_acceptance_length": round(1 + accepted / steps, 4),
        "draft_acceptance_rate": round(accepted / max(drafted, accepted), 4) if max(drafted, accepted) else 0.0,
        "acceptance_histogram": dense,
    }


def llama_timings(*, prompt_tokens: int, prompt_s: float, predicted_tokens: int, predicted_s: float,
                  drafted: int, accepted: int) -> dict:
    """llama-server's ``timings`` object: the prompt's processing (until the first token) and the
    tokens predicted after it, with the speculative drafts and how many were accepted."""
    return {
        "prompt_n": prompt_tokens,
        "prompt_ms": round(prompt_s * 1e3, 3),
        "prompt_per_second": round(prompt_tokens / prompt_s, 3) if prompt_s > 0 else None,
        "predicted_n": predicted_tokens,
        "predicted_ms": round(predicted_s * 1e3, 3),
        "predicted_per_second": round(predicted_tokens / predicted_s, 3) if predicted_s > 0 else None,
        "draft_n": drafted,
        "draft_n_accepted": accepted,
    }
