"""The drafter's second choice: the runner-up each draft comes with, and the corrections scored
against it (the hedge hit rate)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import GREEDY, ScriptedDrafter

from edge.schedule import SpecConfig
from shared.params import Mode, SamplingParams
from sim.inprocess import generate


def test_the_runner_up_is_the_second_place_of_the_same_race():
    from edge.drafter import propose
    from shared.logits import top_candidates
    from shared.noise import Purpose, exponential

    rng = np.random.default_rng(0)
    logits = rng.normal(size=300).astype(np.float32)
    greedy = propose(logits, GREEDY, 7)
    order = np.argsort(-logits)
    assert (greedy.token, greedy.runner_up) == (order[0], order[1])
    params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=3)
    coupled = propose(logits, params, 7)
    ids, probs = top_candidates(logits, params, limit=64)
    race = ids[np.argsort(exponential(3, 7, ids, Purpose.SAMPLE) / probs)]
    assert (coupled.token, coupled.runner_up) == (race[0], race[1])
    assert propose(logits, SamplingParams(mode=Mode.REJECTION, temperature=0.9), 7).runner_up is None


@pytest.mark.parametrize("right", [True, False])
def test_corrections_are_scored_against_the_drafters_second_choice(tiny_engine, greedy_path, right):
    prompt, want = greedy_path
    drafter = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), right)
    got = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=20, spec=SpecConfig(3, window=2))
    stats = got.stats
    assert got.tokens == want[:20]  # every draft rejected, every correction the target's token
    assert stats.corrections_guessed >= 10
    assert stats.corrections_hit == (stats.corrections_guessed if right else 0)
    assert stats.correction_hit_rate == (1.0 if right else 0.0)


def test_each_chain_a_correction_ends_is_counted_as_a_restart(tiny_engine, greedy_path):
    """The drafting a speculation cache could hide: every chain a correction ends begins again with a
    block drafted after it (``DecodeStats.restarts``); a drafter that is never wrong restarts nothing."""
    prompt, want = greedy_path
    wrong = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), True)
    stats = generate(tiny_engine, wrong, prompt, GREEDY, max_new_tokens=20, spec=SpecConfig(3, window=2)).stats
    assert stats.corrections_guessed - 1 <= stats.restarts <= stats.corrections_guessed and stats.restarts >= 10
    assert stats.restart_draft_s > 0 and stats.to_json()["restarts"] == stats.restarts
    right = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), True, wrong_every=1000)
    stats = generate(tiny_engine, right, prompt, GREEDY, max_new_tokens=20, spec=SpecConfig(3, window=2)).stats
    assert stats.accepted > 0 and stats.restarts == 0 and stats.restart_draft_s == 0
