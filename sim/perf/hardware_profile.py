"""Hardware profiles: a target on its servers and a drafter on its device, read from TOML.

Contract. ``load_hardware`` reads a shipped profile (``sim/perf/hardware/<name>.toml``)
by bare name, or a user file by path (anything with a separator or ``.toml``),
and returns a ``HardwareProfile``; ``list_hardware`` names the shipped ones.
The file's schema is the pydantic models below: unknown keys are errors,
times and byte counts are finite and >= 0, ``alpha`` lies in [0, 1]. Any
problem is one ``ValueError`` that names the file and every bad field as
``[section] key``. Only the reading is here; the arithmetic is ``sim.perf.model``'s.

File layout: ``name``, ``description``; ``[target]`` model, verify_fixed_ms,
verify_per_token_ms, prefill_ms, vocab_size, ridge_rows (default 1: compute-bound
at once), verify_per_sequence_ms (default 0); ``[drafter]`` model, draft_ms_per_token, draft_prefill_ms;
``[acceptance]`` alpha (a number or a list per position), rebased_per_stale_decode and
rebased_verified_per_stale_decode (a stale block's forward: rebased drafts accepted and
verified; default 0); optional ``[bytes]`` up_fixed, up_per_draft, down_per_round,
down_per_token_cloud_only, open, defaulting to ``protocol_bytes(vocab_size)``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from sim.package_data import list_shipped, load_toml
from sim.perf.model import Timings, protocol_bytes

__all__ = ["HardwareProfile", "list_hardware", "load_hardware"]

HARDWARE_FOLDER = "perf/hardware"  # package data under sim/


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """A target on its servers and a drafter on its device, in the units people quote."""

    name: str
    description: str
    target: str  # the target model and its servers, in words
    drafter: str  # the drafter model and its device, in words
    verify_fixed_ms: float  # target forward: fixed + per_token * tokens
    verify_per_token_ms: float
    draft_ms_per_token: float  # drafter, Python included
    alpha: list[float]  # [positions] conditional acceptance; the last value extends
    vocab_size: int
    up_bytes_fixed: float
    up_bytes_per_draft: float
    down_bytes_per_round: float
    down_bytes_per_token_cloud_only: float
    prefill_ms: float = 0.0
    draft_prefill_ms: float = 0.0
    open_bytes: float = 0.0
    # Rows at which a packed forward stops being memory-bound (the roofline's ridge point):
    # below it the weights' streaming time (verify_fixed) is paid once whatever the rows.
    ridge_rows: float = 1.0
    rebased_per_stale_decode: float = 0.0  # Timings.rebased_per_stale_decode
    rebased_verified_per_stale_decode: float = 0.0
    # What each sequence past the first adds to a packed forward whatever its rows (its attention's launches:
    # measured 4-5 ms on an H200 through transformers, where the forward is host-bound; 0: not modelled).
    verify_per_sequence_ms: float = 0.0

    def batch_forward_s(self, rows: int, sequences: int = 1) -> float:
        """One packed forward over ``rows`` rows of ``sequences`` sessions: memory-bound until ``ridge_rows``,
        then the fixed part grows with the rows (compute-bound); plus the per-row and per-sequence parts."""
        fixed = self.verify_fixed_ms * max(1.0, rows / self.ridge_rows)
        return (fixed + self.verify_per_token_ms * rows + self.verify_per_sequence_ms * (max(sequences, 1) - 1)) / 1e3

    def to_timings(self) -> Timings:
        return Timings(
            draft_s_per_token=self.draft_ms_per_token / 1e3,
            verify_fixed_s=self.verify_fixed_ms / 1e3,
            verify_per_token_s=self.verify_per_token_ms / 1e3,
            alpha_per_position=list(self.alpha),
            up_bytes_fixed=self.up_bytes_fixed,
            up_bytes_per_draft=self.up_bytes_per_draft,
            down_bytes_per_round=self.down_bytes_per_round,
            down_bytes_per_token_cloud_only=self.down_bytes_per_token_cloud_only,
            prefill_s=self.prefill_ms / 1e3,
            draft_prefill_s=self.draft_prefill_ms / 1e3,
            open_up_bytes=self.open_bytes,
            rebased_per_stale_decode=self.rebased_per_stale_decode,
            rebased_verified_per_stale_decode=self.rebased_verified_per_stale_decode,
        )


# ---------------------------------------------------------------- the file's schema

Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # milliseconds, bytes, counts: finite, >= 0
Probability = Annotated[float, Field(ge=0, le=1)]


def _as_list(value: object) -> object:
    return value if isinstance(value, list) else [value]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class _Target(_Table):
    model: str = ""
    verify_fixed_ms: Amount
    verify_per_token_ms: Amount
    prefill_ms: Amount = 0.0
    vocab_size: int = 262144
    ridge_rows: Amount = 1.0
    verify_per_sequence_ms: Amount = 0.0


class _Drafter(_Table):
    model: str = ""
    draft_ms_per_token: Amount
    draft_prefill_ms: Amount = 0.0


class _Acceptance(_Table):
    alpha: Annotated[list[Probability], Field(min_length=1), BeforeValidator(_as_list)] = Field(
        description="a number or a list per position")
    rebased_per_stale_decode: Amount = 0.0
    rebased_verified_per_stale_decode: Amount = 0.0


class _Bytes(_Table):
    up_fixed: Amount | None = None  # None: protocol_bytes(vocab_size)'s
    up_per_draft: Amount | None = None
    down_per_round: Amount | None = None
    down_per_token_cloud_only: Amount | None = None
    open: Amount = 0.0


class _ProfileFile(_Table):
    # A missing section is checked as an empty one: the error names its required keys.
    name: str | None = None
    description: str = ""
    target: _Target = Field(default_factory=dict, validate_default=True)
    drafter: _Drafter = Field(default_factory=dict, validate_default=True)
    acceptance: _Acceptance = Field(default_factory=dict, validate_default=True)
    bytes: _Bytes = Field(default_factory=dict, validate_default=True)

    def profile(self, default_name: str) -> HardwareProfile:
        target, drafter, acceptance, given = self.target, self.drafter, self.acceptance, self.bytes
        defaults = protocol_bytes(target.vocab_size)

        def byte(value: float | None, key: str) -> float:
            return float(defaults[key] if value is None else value)

        return HardwareProfile(
            name=self.name if self.name is not None else default_name,
            description=self.description,
            target=target.model,
            drafter=drafter.model,
            verify_fixed_ms=target.verify_fixed_ms,
            verify_per_token_ms=target.verify_per_token_ms,
            draft_ms_per_token=drafter.draft_ms_per_token,
            alpha=list(acceptance.alpha),
            vocab_size=target.vocab_size,
            up_bytes_fixed=byte(given.up_fixed, "up_fixed"),
            up_bytes_per_draft=byte(given.up_per_draft, "up_per_draft"),
            down_bytes_per_round=byte(given.down_per_round, "down_per_round"),
            down_bytes_per_token_cloud_only=byte(given.down_per_token_cloud_only, "down_per_token_cloud_only"),
            prefill_ms=target.prefill_ms,
            draft_prefill_ms=drafter.draft_prefill_ms,
            open_bytes=given.open,
            ridge_rows=max(target.ridge_rows, 1.0),
            verify_per_sequence_ms=target.verify_per_sequence_ms,
            rebased_per_stale_decode=acceptance.rebased_per_stale_decode,
            rebased_verified_per_stale_decode=acceptance.rebased_verified_per_stale_decode,
        )


_SECTIONS: dict[str, type[_Table]] = {"target": _Target, "drafter": _Drafter, "acceptance": _Acceptance,
                                      "bytes": _Bytes}


def _problem(error: dict) -> str:
    """One pydantic error as ``[section] key: what is wrong``."""
    loc = [str(part) for part in error["loc"]]
    section = loc[0] if len(loc) > 1 and loc[0] in _SECTIONS else ""
    table = _SECTIONS.get(section, _ProfileFile)
    keys = loc[1:] if section else loc
    key = keys[0] + "".join(f"[{index}]" for index in keys[1:]) if keys else ""
    where = f"[{section}] {key}".strip() if section else key or "top level"
    if error["type"] == "extra_forbidden":
        return (f"unknown key {key} in {f'[{section}]' if section else 'the top level'}; "
                f"allowed: {', '.join(sorted(table.model_fields))}")
    if error["type"] == "model_type":  # a section that is not a table
        return f"[{key}] must be a table (got {error['input']!r})"
    if error["type"] == "missing":
        field = table.model_fields.get(keys[0]) if keys else None
        return f"{where} is required" + (f" ({field.description})" if field and field.description else "")
    return f"{where}: {error['msg'][0].lower()}{error['msg'][1:]} (got {error['input']!r})"


def list_hardware() -> list[str]:
    """Names of the shipped hardware profiles, sorted."""
    return list_shipped(HARDWARE_FOLDER)


def load_hardware(name_or_path: str | Path) -> HardwareProfile:
    """Load a shipped profile by bare name, or a user file by path (anything with a separator or ``.toml``).
    ValueError, naming the file and each bad field, on any problem."""
    data, source, default_name = load_toml(name_or_path, HARDWARE_FOLDER, "hardware profile")
    try:
        return _ProfileFile.model_validate(data).profile(default_name)
    except ValidationError as e:
        errors = sorted(e.errors(), key=lambda error: error["type"] != "extra_forbidden")  # a typo first
        raise ValueError(f"{source}: " + "; ".join(_problem(error) for error in errors)) from e
