"""How a configuration is named in progress lines, tables and plots."""

from __future__ import annotations

__all__ = ["config_label"]


def config_label(mode: str, draft_len: int, schedule: str, window: int) -> str:
    """``coupled D=8`` (lock-step), ``coupled D=8 W=2`` (pipelined), ``coupled adaptive D<=8 W=2``."""
    if schedule == "lockstep":
        return f"{mode} D={draft_len}"
    if schedule == "adaptive":
        return f"{mode} adaptive D<={draft_len} W={window}"
    return f"{mode} D={draft_len} W={window}"
