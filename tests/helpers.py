"""Test helpers shared by several test files (exact distributions, distances)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from shared.logits import process_logits


def exact_distribution(engine, prompt, params, length=3) -> dict[tuple[int, ...], float]:
    """P(first ``length`` generated tokens) by enumerating the target's top-k tree."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix, prob):
        if len(prefix) == length:
            out[tuple(prefix)] = prob
            return
        seq = engine.new_sequence()
        logits = engine.forward(seq, list(prompt) + prefix)[-1:]
        p = process_logits(logits.numpy(), params)[0]
        for token in np.flatnonzero(p > 0):
            walk(prefix + [int(token)], prob * p[token])

    walk([], 1.0)
    return out


def total_variation(counts: Counter, n: int, dist: dict) -> float:
    keys = set(counts) | set(dist)
    return 0.5 * sum(abs(counts.get(k, 0) / n - dist.get(k, 0.0)) for k in keys)


def tiny_prompt(engine, text: str) -> list[int]:
    """BOS + the tiny tokenizer's ids (the tiny GGUF does not add BOS itself)."""
    return [1, *engine.tokenizer(text, add_special_tokens=False).input_ids]
