"""The target weights' fingerprint: told in every Opened and Generate, recorded by reports, pinned by edges.

A swapped checkpoint with the same tokenizer passes the vocabulary check; its weights fingerprint
differs, so an edge that pins the fingerprint its baseline recorded (``--pin-target``) refuses it instead
of reporting "reproducible" outputs the baseline's target never made.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

from cloud.engine import TargetEngine
from cloud.limits import ServiceLimits


def edge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True, timeout=120)


def swapped_copy(folder: str, to) -> str:
    """The target's folder with one weight nudged: the same tokenizer, other weights."""
    shutil.copytree(folder, to)
    (weights,) = to.glob("*.safetensors")
    tensors = load_file(weights)
    name = next(n for n in sorted(tensors) if n.endswith("weight") and tensors[n].dim() == 2)
    tensors[name] = tensors[name] + torch.full_like(tensors[name], 1e-3)
    save_file(tensors, weights, metadata={"format": "pt"})
    return str(to)


def test_a_swapped_checkpoint_has_the_same_vocabulary_and_another_fingerprint(tiny_engine, tiny_models, tmp_path):
    other = TargetEngine(swapped_copy(tiny_models["target"], tmp_path / "swapped"))
    assert other.fingerprint == tiny_engine.fingerprint  # the vocabulary check passes
    assert len(other.weights_fingerprint) == 16 and other.weights_fingerprint != tiny_engine.weights_fingerprint
    assert TargetEngine(tiny_models["target"]).weights_fingerprint == tiny_engine.weights_fingerprint


def test_baseline_records_the_target_and_a_pinned_run_is_served_by_it_or_refused(tiny_engine, tiny_models, serve):
    server = serve(ServiceLimits())
    common = ["--cloud", server.address, "--drafter", tiny_models["drafter_f32"], "--prompt", "The cat",
              "--max-new-tokens", "6", "--temperature", "0", "--reproducible"]
    baseline = edge("baseline", *common, "--json")
    assert baseline.returncode == 0, baseline.stderr
    target = json.loads(baseline.stdout)["target"]
    assert target == tiny_engine.weights_fingerprint.hex()
    pinned = edge("run", *common, "--json", "--pin-target", target)
    assert pinned.returncode == 0, pinned.stderr
    assert json.loads(pinned.stdout)["tokens"] == json.loads(baseline.stdout)["tokens"]
    wrong = "00" * 16
    for command in ("run", "baseline"):
        refused = edge(command, *common, "--pin-target", wrong)
        assert refused.returncode == 1 and f"not the pinned {wrong}" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert edge("run", *common, "--pin-target", "abc").returncode == 2  # not a fingerprint: a usage error
