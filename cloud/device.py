"""Where the target runs: the torch device a name asks for, and torch's threads for a block of work."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["pick_device", "torch_threads"]


def pick_device(device: str | None) -> torch.device:
    """``device`` as a torch device (None: cuda when present, else cpu); ``ValueError`` for a name
    torch does not know or an accelerator this machine lacks."""
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, mps, ...)") from exc
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device on this machine (use --device cpu)")
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: no MPS device on this machine (use --device cpu)")
    return chosen


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op threads set to ``threads`` inside the block (None: left as they are)."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
