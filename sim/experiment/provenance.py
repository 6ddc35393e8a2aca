"""What made a result: the command line, the commit, the date and the machine (its CPU model named)."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["provenance"]


def provenance() -> dict:
    """What is making a result: the command line, the commit (``$SPLITSPEC_COMMIT``, else git's), the date and
    the machine. Call it as the run starts: a commit made while it runs did not make it."""
    import datetime
    import os
    import platform
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    # A copy of the tree whose git is absent or stale (a GPU machine's) names its commit itself.
    commit = os.environ.get("SPLITSPEC_COMMIT") or commit
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else None
    return {
        "command": " ".join(["splitspec", *sys.argv[1:]]),
        "commit": commit,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {cpu}",
    }
