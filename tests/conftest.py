"""Shared fixtures: tiny generated models (written once per test session)."""

from __future__ import annotations

import os

# torch's OpenMP workers spin after each op by default and starve llama.cpp
# running in the same process; the CLI sets the same before importing torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """Paths of the tiny target folder and its F32 / Q8_0 / noisy GGUF drafters."""
    from sim.tiny_models import write_tiny_models

    return write_tiny_models(tmp_path_factory.mktemp("tiny_models"), seed=0)
