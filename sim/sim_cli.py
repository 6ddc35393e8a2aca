"""``splitspec sim ...``: the link emulator and the network-constrained simulation."""

from __future__ import annotations

__all__ = ["add_sim_commands"]


def add_sim_commands(commands) -> None:
    from sim.link_cli import add_link_commands

    add_link_commands(commands)
