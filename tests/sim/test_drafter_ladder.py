"""``splitspec models quantize``: weaker drafters from a GGUF with llama.cpp's own quantizer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import tiny_prompt

from edge.llama_drafter import LlamaDrafter
from edge.schedule import SpecConfig
from shared.params import Mode, SamplingParams
from sim.fixtures.drafter_ladder import quantize
from sim.inprocess import generate


def test_a_requantized_drafter_keeps_the_vocabulary_and_stays_lossless(tiny_models, tiny_engine, tmp_path):
    made = quantize(tiny_models["drafter_f32"], tmp_path / "q4_0.gguf", "q4_0")
    assert made["type"] == "q4_0" and made["bytes"] == (tmp_path / "q4_0.gguf").stat().st_size > 0
    drafter = LlamaDrafter(made["out"], n_ctx=256, n_threads=1)
    reference = LlamaDrafter(tiny_models["drafter_f32"], n_ctx=256, n_threads=1)
    try:
        assert drafter.vocab.fingerprint == reference.vocab.fingerprint == tiny_engine.fingerprint
        prompt = tiny_prompt(tiny_engine, "The cat sat on the mat.")
        params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=1)
        want = generate(tiny_engine, reference, prompt, params, max_new_tokens=24, spec=SpecConfig(0)).tokens
        got = generate(tiny_engine, drafter, prompt, params, max_new_tokens=24, spec=SpecConfig(4))
        assert got.tokens == want
    finally:
        drafter.close()
        reference.close()


def test_bad_requests_are_refused_with_a_clear_error(tiny_models, tmp_path):
    with pytest.raises(ValueError, match="unknown quantization type 'q9_9'"):
        quantize(tiny_models["drafter_f32"], tmp_path / "x.gguf", "q9_9")
    with pytest.raises(ValueError, match="source model not found"):
        quantize(tmp_path / "missing.gguf", tmp_path / "x.gguf", "q8_0")


def test_models_quantize_cli(tiny_models, tmp_path):
    out = tmp_path / "q8.gguf"
    ok = subprocess.run(
        [sys.executable, "-m", "sim.cli", "models", "quantize", "--type", "q8_0", "--source", tiny_models["drafter_f32"],
         "--out", str(out)], capture_output=True, text=True, timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["out"] == str(out) and out.is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "sim.cli", "models", "quantize", "--type", "q9_9", "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
