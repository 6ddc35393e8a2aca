"""What a GPU check runs: its sections, their shares of the time budget, the device and dtype, the shapes.
(No torch at import: the command line reads ``SECTIONS`` from here.)

Contract. ``GpuCheck`` is the check's frozen plan (``sim.bench.gpu_check.run_gpu_check`` runs it); each
section gets ``SHARE[name]`` of ``budget_s`` as a ``Deadline`` it may cut itself short at.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from sim.bench.gpu_models import Shape

__all__ = ["GpuCheck", "Deadline", "SECTIONS", "SHARE"]

SECTIONS = ("machine", "products", "rows_8b", "identity_8b", "rows_70b", "service", "service_8b")
SHARE = {"machine": 0.04, "products": 0.06, "rows_8b": 0.25, "identity_8b": 0.15, "rows_70b": 0.15, "service": 0.15,
         "service_8b": 0.20}


@dataclass(frozen=True)
class GpuCheck:
    """What to run: ``device``/``dtype`` as torch names them; ``dry_run``: tiny shapes (CPU, seconds)."""

    out: Path
    device: str = "cuda"
    dtype: str = "bfloat16"
    dry_run: bool = False
    budget_s: float = 420.0
    repeats: int = 10
    tiny_target: str | None = None  # the tiny target's folder (default: generated, which needs ``gguf``)
    sections: tuple[str, ...] = SECTIONS
    progress: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))

    @property
    def shapes(self) -> tuple[Shape, Shape]:
        """The 8B's and the 70B's shapes (the dry run's stand-ins)."""
        from sim.bench.gpu_models import DRY_8B, DRY_70B, LLAMA_8B, LLAMA_70B

        return (DRY_8B, DRY_70B) if self.dry_run else (LLAMA_8B, LLAMA_70B)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)


class Deadline:
    """When a section's share of the budget runs out (``passed``)."""

    def __init__(self, seconds: float) -> None:
        self.until = time.perf_counter() + seconds

    @property
    def passed(self) -> bool:
        return time.perf_counter() > self.until
