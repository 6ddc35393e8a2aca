"""The cloud's tests' own fixtures: the real Gemma 3 270M target."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gemma_engine():
    """The default Gemma 3 270M target (converted once into the cache; ~1 min the first time)."""
    from cloud.engine import TargetEngine
    from cloud.models import resolve_target

    return TargetEngine(resolve_target(None))
