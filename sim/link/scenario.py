"""Network scenarios: TOML files that describe a `LinkConfig` in human units.

Contract. A scenario file holds `name`, `description`, optional `seed`, an
`[up]` and a `[down]` table and an optional `[faults]` table:

    [up]                      # client (edge) -> server (cloud)
    rate = "50kbit"           # parse_rate(); "0" = unlimited
    delay = "50ms"            # one-way, parse_duration()
    jitter = "2ms"            # optional
    jitter_dist = "uniform"   # optional: uniform | normal
    loss = 0.0                # optional, probability per segment
    rto = "200ms"             # optional, stall per lost segment
    stall_every = "30s"       # optional: burst stalls begin at exponential intervals of this mean
    stall = "300ms"           # optional: each burst's length (nothing arrives during one)
    segment_bytes = 1448      # optional
    overhead_bytes = 52       # optional
    queue_bytes = 262144      # optional

    [faults]
    cut_after = "30s"         # optional
    cut_after_bytes = 100000  # optional

Unknown keys are errors, so a typo cannot silently fall back to a default.
Shipped scenarios live in `sim/link/scenarios/*.toml` (package data, not a Python
package); `load_scenario("lte")` finds them by bare name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from sim.link.config import DirectionConfig, LinkConfig, parse_duration, parse_rate
from sim.package_data import list_shipped, load_toml

__all__ = ["Scenario", "list_scenarios", "load_scenario", "scenario_from_dict"]

SCENARIO_FOLDER = "link/scenarios"  # package data under sim/

_DIRECTION_KEYS = {  # TOML key -> (DirectionConfig field, converter)
    "rate": ("rate_bps", parse_rate),
    "delay": ("delay_s", parse_duration),
    "jitter": ("jitter_s", parse_duration),
    "jitter_dist": ("jitter_dist", str),
    "loss": ("loss", float),
    "rto": ("rto_s", parse_duration),
    "stall_every": ("stall_every_s", parse_duration),
    "stall": ("stall_s", parse_duration),
    "segment_bytes": ("segment_bytes", int),
    "overhead_bytes": ("overhead_bytes", int),
    "queue_bytes": ("queue_bytes", int),
}
_TOP_KEYS = {"name", "description", "seed", "up", "down", "faults"}
_FAULT_KEYS = {"cut_after", "cut_after_bytes"}


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    link: LinkConfig


def list_scenarios() -> list[str]:
    """Names of the shipped scenarios, sorted."""
    return list_shipped(SCENARIO_FOLDER)


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a shipped scenario by bare name, or a user file by path.

    Anything containing a path separator or ending in `.toml` is a path.
    Raises ValueError for an unknown name (listing the shipped ones), a
    missing file, bad TOML, or bad values.
    """
    data, source, default_name = load_toml(name_or_path, SCENARIO_FOLDER, "scenario")
    try:
        return scenario_from_dict(data, default_name=default_name)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e


def scenario_from_dict(data: dict[str, Any], default_name: str = "custom") -> Scenario:
    """Build a Scenario from parsed TOML; ValueError on unknown keys or bad values."""
    _reject_unknown(data, _TOP_KEYS, "top level")
    faults = data.get("faults", {})
    _reject_unknown(faults, _FAULT_KEYS, "[faults]")
    cut_after = faults.get("cut_after")
    cut_bytes = faults.get("cut_after_bytes")
    link = LinkConfig(
        up=_direction(data.get("up", {}), "[up]"),
        down=_direction(data.get("down", {}), "[down]"),
        cut_after_s=None if cut_after is None else parse_duration(cut_after),
        cut_after_bytes=None if cut_bytes is None else int(cut_bytes),
        seed=int(data.get("seed", 0)),
    )
    return Scenario(
        name=str(data.get("name", default_name)),
        description=str(data.get("description", "")),
        link=link,
    )


def _direction(table: dict[str, Any], where: str) -> DirectionConfig:
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table")
    _reject_unknown(table, set(_DIRECTION_KEYS), where)
    kwargs = {}
    for key, value in table.items():
        field, convert = _DIRECTION_KEYS[key]
        try:
            kwargs[field] = convert(value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where} {key}: {e}") from e
    try:
        return DirectionConfig(**kwargs)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def _reject_unknown(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"unknown key(s) in {where}: {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(allowed))}")
