"""How a configuration is named in progress lines, tables and plots."""

from __future__ import annotations

__all__ = ["config_label"]


def config_label(mode: str, draft_len: int, schedule: str, window: int | None, hedge: int | None = None) -> str:
    """``coupled D=8`` (lock-step), ``coupled D=8 W=2`` (pipelined), ``coupled adaptive D<=8 W=2`` (``W=link``:
    the cap is what the link can use); `` H=2`` after any of them with two hedge branches per block."""
    hedged = f" H={hedge}" if hedge else ""
    if schedule == "lockstep":
        return f"{mode} D={draft_len}{hedged}"
    if schedule == "adaptive":
        return f"{mode} adaptive D<={draft_len} W={window or 'link'}{hedged}"
    return f"{mode} D={draft_len} W={window}{hedged}"
