"""What the pieces of the verifier service share: one engine, its limits and metrics, the session
table, and the engine thread (``cloud.scheduler``) where every torch call and session change runs.

Contract. A ``ServicePart`` holds references only; the servicer builds the
table and the scheduler once and hands the same ones to every part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cloud.engine import TargetEngine
from cloud.identity import Identities
from cloud.limits import ServiceLimits
from cloud.metrics import ServiceMetrics
from cloud.scheduler import Scheduler
from cloud.session_table import SessionTable

__all__ = ["ServicePart"]


@dataclass(eq=False)
class ServicePart:
    engine: TargetEngine
    limits: ServiceLimits
    metrics: ServiceMetrics
    table: SessionTable
    scheduler: Scheduler
    identities: Identities = field(default_factory=Identities)  # who a stream is (``cloud.identity``)

    def __post_init__(self) -> None:
        """A part's own state (the generated ``__init__`` calls it)."""
