"""Fixtures every folder uses: tiny generated models (written once per test session), their drafters, a
greedy path, real verifiers on loopback (``serve``); a folder's own are in its ``conftest.py``. Tests
that load the real Gemma pair carry the ``gemma`` marker."""

from __future__ import annotations

import os

# torch's OpenMP workers spin after each op by default and starve llama.cpp
# running in the same process; the CLI sets the same before importing torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from helpers import TEXTS, greedy_continuation, tiny_drafter, tiny_prompt  # noqa: E402

GEMMA_FIXTURES = {"gemma_engine"}  # a test that uses one loads the real Gemma 3 270M pair (tests/cloud/conftest.py)


def pytest_collection_modifyitems(items):
    """Marks every test that loads the Gemma pair ``gemma``: ``-m "not gemma"`` is the quick loop."""
    for item in items:
        if GEMMA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.gemma)


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


@pytest.fixture(scope="module")
def drafters(tiny_models, tiny_vocab):
    """The F32 and noisy tiny drafters and an n-gram drafter, by name, opened once per module (a module
    that needs others defines its own ``drafters``)."""
    from edge.ngram_drafter import NgramDrafter

    made = {name: tiny_drafter(tiny_models, name) for name in ("drafter_f32", "drafter_noisy")}
    made["ngram"] = NgramDrafter(tiny_vocab[0])
    yield made
    for drafter in made.values():
        drafter.close()


@pytest.fixture(scope="session")
def greedy_path(tiny_engine):
    """A prompt (``TEXTS[0]``) and the target's own greedy continuation of it (40 tokens); test_hedging.py
    has its own."""
    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    return prompt, greedy_continuation(tiny_engine, prompt)


def _servers(tiny_engine):
    """Yields ``start(limits, engine=None, **config)``, which returns a started ``BackgroundServer`` on a
    free loopback port (the tiny target unless ``engine``; ``config``: the rest of ``ServerConfig``);
    stops every one it started when resumed."""
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig

    started = []

    def start(limits: ServiceLimits | None = None, *, engine=None, port: int = 0, **config):
        server = BackgroundServer(engine or tiny_engine,
                                  ServerConfig(port=port, limits=limits or ServiceLimits(), **config)).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture()
def serve(tiny_engine):
    """Real verifier gRPC servers on loopback, stopped after the test: ``serve(limits, engine=None,
    **config)`` returns a started ``BackgroundServer``."""
    yield from _servers(tiny_engine)


@pytest.fixture(scope="module")
def serve_module(tiny_engine):
    """``serve`` for module-scoped fixtures: its servers are stopped after the module."""
    yield from _servers(tiny_engine)


@pytest.fixture()
def verifier(serve):
    """A real verifier gRPC server on a free loopback port, stopped after the test; every mode is served to
    its clients (rejection mode granted to all: ``--rejection-to all``)."""
    from cloud.limits import ServiceLimits

    return serve(ServiceLimits(max_draft_len=16, session_ttl_s=30, rejection_to=("all",)))
