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
    from sim.fixtures.tiny_models import write_tiny_models

    return write_tiny_models(tmp_path_factory.mktemp("tiny_models"), seed=0)


@pytest.fixture(scope="session")
def tiny_engine(tiny_models):
    """The tiny target loaded once for every test that needs a cloud engine."""
    from cloud.engine import TargetEngine

    return TargetEngine(tiny_models["target"])


@pytest.fixture(scope="session")
def tiny_vocab(tiny_engine):
    """(vocab_size, fingerprint) the tiny target and drafters share."""
    return tiny_engine.vocab_size, tiny_engine.fingerprint


@pytest.fixture()
def verifier(tiny_engine):
    """A real verifier gRPC server on a free loopback port, stopped after the test."""
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig

    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(max_draft_len=16, session_ttl_s=30))) as server:
        yield server


@pytest.fixture(scope="session")
def gemma_engine():
    """The default Gemma 3 270M target (converted once into the cache; ~1 min the first time)."""
    from cloud.engine import TargetEngine
    from cloud.models import resolve_target

    return TargetEngine(resolve_target(None))
