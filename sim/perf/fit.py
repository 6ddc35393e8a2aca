"""Fitting ``sim.perf.model.Timings`` on what a simulation run measured.

Inputs are the edge processes' reports (``edge.report.EdgeReport`` from
``splitspec-edge run|baseline --json --timings``) and the cloud's verify steps
(``service_samples``: its ``cloud.metrics.VERIFY_SERVICE_METRIC`` summary
read around each run, by rows in the forward; the wait behind earlier blocks
excluded, so pipelined blocks fit the same line as lock-step ones). Shared
across runs: the verify-time line t_verify(n) per mode, fitted on the steps'
rows and times, and the prefill. Per run: its drafter speed, its acceptance
per position, its bytes per block (q̃ makes rejection blocks much larger than
coupled ones) and its stale-block figures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cloud.metrics import VERIFY_SERVICE_METRIC
from edge.report import EdgeReport
from edge.tunables import TUNABLES
from shared.wire import HTTP2_FRAME_HEADER_BYTES
from sim.perf.model import Timings, fit_linear

__all__ = ["RunTimings", "FittedTimings", "service_samples", "one_row_step_s", "timings_from_reports", "fit_timings"]


@dataclass
class RunTimings:
    """What one configuration's edge processes measured."""

    mode: str  # greedy, coupled or rejection: each has its own verify line (rejection's reads q̃ and samples more)
    drafted: int  # tokens the drafter drafted (blocks that came back stale, guesses and branches included)
    draft_s: float  # drafter time, prompt reading excluded
    accepted_at: list[int]
    drafted_at: list[int]
    verify_samples: list[tuple[int, float]]  # (rows in the forward, the cloud's seconds on the step) per step
    up_samples: list[tuple[int, float]]  # (drafts in the block, Draft bytes with HTTP/2 header)
    down_samples: list[float]  # Verdict bytes with HTTP/2 header
    open_s: list[float]
    prompt_s: list[float]  # drafter reading the prompt
    stale_decoded: int = 0  # stale blocks the cloud ran a forward for
    rebased: int = 0  # ... the rebased drafts those forwards accepted
    rebased_verified: int = 0  # ... and verified
    stale_decode_guesses: int = 0  # stale blocks' tokens that a chain's first block had guessed
    stale_decode_guesses_hit: int = 0  # ... right
    tokens: int = 0  # tokens generated


def service_samples(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> list[tuple[int, float]]:
    """The cloud's verify steps between two scrapes of its metrics (name -> {rows -> value}), as
    (rows, seconds) samples: each rows count's mean time, once per step (a least-squares line through
    them is the line through the steps themselves)."""
    out = []
    counts, sums = f"{VERIFY_SERVICE_METRIC}_count", f"{VERIFY_SERVICE_METRIC}_sum"
    for rows, count in after.get(counts, {}).items():
        steps = round(count - before.get(counts, {}).get(rows, 0.0))
        if steps > 0:
            seconds = after[sums][rows] - before.get(sums, {}).get(rows, 0.0)
            out += [(int(rows), seconds / steps)] * steps
    return out


def one_row_step_s(steps: list[tuple[int, float]]) -> float | None:
    """The cloud's mean seconds on a step of one row among ``steps`` (``service_samples``): the next token
    alone, as cloud-only decodes every token and a split its stale decodes, tokens decoded ahead and the
    cloud alone's unproposed ones; None where none ran. The same shape in a split and in cloud-only, so
    their ratio on one machine is how much slower the machine ran the split's forwards (where the edge
    shares the machine: its memory traffic on the next core), apart from how many the split ran."""
    ones = [seconds for rows, seconds in steps if rows == 1]
    return sum(ones) / len(ones) if ones else None


def timings_from_reports(reports: list[EdgeReport], verify_samples: list[tuple[int, float]], mode: str) -> RunTimings:
    """One configuration's timings: its edges' reports in ``mode``, and the cloud's verify steps meanwhile
    (``service_samples``)."""
    width = max(len(r.decode.drafted_at) for r in reports)
    accepted_at, drafted_at = [0] * width, [0] * width
    for r in reports:
        for i, (a, d) in enumerate(zip(r.decode.accepted_at, r.decode.drafted_at)):
            accepted_at[i] += a
            drafted_at[i] += d
    blocks = [b for r in reports for b in r.blocks]
    return RunTimings(
        mode=mode,
        drafted=sum(r.drafter.drafted for r in reports),  # (decode.drafted: verified drafts only)
        draft_s=sum(r.drafter.draft_s - r.drafter.prompt_eval_s for r in reports),
        accepted_at=accepted_at,
        drafted_at=drafted_at,
        verify_samples=verify_samples,
        up_samples=[(b.drafts, b.up_bytes + HTTP2_FRAME_HEADER_BYTES) for b in blocks],
        down_samples=[b.down_bytes + HTTP2_FRAME_HEADER_BYTES for b in blocks],
        open_s=[r.open_s for r in reports],
        prompt_s=[r.drafter.prompt_eval_s for r in reports],
        stale_decoded=sum(r.decode.stale_decoded for r in reports),
        rebased=sum(r.decode.rebased for r in reports),
        rebased_verified=sum(r.decode.rebased_verified for r in reports),
        stale_decode_guesses=sum(r.decode.stale_decode_guesses for r in reports),
        stale_decode_guesses_hit=sum(r.decode.stale_decode_guesses_hit for r in reports),
        tokens=sum(len(r.tokens) for r in reports),
    )


@dataclass
class FittedTimings:
    base: Timings  # pooled over every run
    runs: list[RunTimings]
    rtt_s: float
    verify_lines: dict[str, tuple[float, float]]  # mode -> (fixed s, s per row), where its runs span two sizes

    def verify_line(self, mode: str) -> tuple[float, float]:
        """t_verify(n) = fixed + per-row x n for ``mode`` (the pooled line where its own could not be fitted)."""
        return self.verify_lines.get(mode, (self.base.verify_fixed_s, self.base.verify_per_token_s))

    def for_timings(self, measured: RunTimings) -> Timings:
        """The pooled timings with ``measured``'s drafter speed, acceptance, bytes (any run) and its mode's verify line."""
        up_fixed, up_per_draft = fit_linear(measured.up_samples)
        verify_fixed, verify_per_token = self.verify_line(measured.mode)
        return dataclasses.replace(
            self.base,
            verify_fixed_s=verify_fixed,
            verify_per_token_s=verify_per_token,
            draft_s_per_token=measured.draft_s / max(measured.drafted, 1),
            up_bytes_fixed=up_fixed,
            up_bytes_per_draft=up_per_draft,
            down_bytes_per_round=sum(measured.down_samples) / max(len(measured.down_samples), 1),
            stale_decode_overruns=measured.mode != "rejection",
            **_outcomes(measured),
        )

    def for_prompt(self, run: RunTimings, prompt: RunTimings) -> Timings:
        """``for_timings(run)`` with one prompt's own acceptance and stale-block figures (``prompt``:
        that prompt's part of ``run``): prompts differ in how well the drafter guesses them, and a
        run's rate is its tokens over the sum of its prompts' times, not the rate of its mean."""
        return dataclasses.replace(self.for_timings(run), **_outcomes(prompt))

    def describe(self) -> dict:
        b = self.base
        lines = {"pooled": (b.verify_fixed_s, b.verify_per_token_s), **self.verify_lines}
        return {
            "t_verify(n)": ", ".join(f"{mode} {fixed * 1e3:.1f} ms + {per_row * 1e3:.2f} ms x n"
                                     for mode, (fixed, per_row) in lines.items())
            + " for n >= 2 rows; "
            + (f"t_verify(1) = {b.verify_one_s * 1e3:.1f} ms" if b.verify_one_s is not None else "t_verify(1) on the line")
            + " (the cloud's time per verify step, queueing excluded)",
            "drafter": f"{b.draft_s_per_token * 1e3:.1f} ms per drafted token (pooled; per run in predictions)",
            "uplink per block": f"{b.up_bytes_fixed:.1f} B + {b.up_bytes_per_draft:.2f} B x D, pooled over modes; "
            "each prediction uses its own run's bytes (gRPC + HTTP/2 DATA framing)",
            "downlink": f"{b.down_bytes_per_round:.1f} B per verdict, {b.down_bytes_per_token_cloud_only:.1f} B per cloud-only token",
            "prefill": f"{b.prefill_s * 1e3:.0f} ms (Open round trip minus the RTT)",
            "stale blocks": "per run: the rebased drafts a stale block's forward verified and accepted, per forward, "
                            "and how often a chain's first block guessed the tokens decoded for them",
            "not modelled": "HTTP/2 control frames (WINDOW_UPDATE, PING) and headers, jitter, burst stalls, "
                            "Python start-up, hedge branches (a hedged run is predicted as if unhedged)",
        }


def _outcomes(measured: RunTimings) -> dict:
    """What verification made of the drafts: acceptance per position and the stale blocks' figures."""
    return dict(
        alpha_per_position=_alpha(measured.accepted_at, measured.drafted_at),
        rebased_per_stale_decode=measured.rebased / max(measured.stale_decoded, 1),
        rebased_verified_per_stale_decode=measured.rebased_verified / max(measured.stale_decoded, 1),
        stale_decode_guess_hit=measured.stale_decode_guesses_hit / measured.stale_decode_guesses if measured.stale_decode_guesses else None,
    )


def _alpha(accepted_at: list[int], drafted_at: list[int]) -> list[float]:
    """Conditional acceptance per position, P(draft i accepted | drafts < i accepted), each shrunk
    toward the pooled rate by ``Tunables.shrink_strength`` pseudo-trials, as the controller estimates it
    (``edge.controller.AcceptanceEstimate``): a position a prompt reached once or twice says little.

    ``accepted_at[i]`` blocks accepted their first i+1 drafts, of ``drafted_at[i]`` that held i+1
    drafts: draft i was reached ``accepted_at[i-1] * drafted_at[i] / drafted_at[i-1]`` times.
    """
    hits, trials = [], []
    for i, (accepted, drafted) in enumerate(zip(accepted_at, drafted_at)):
        if not drafted:
            break
        hits.append(accepted)
        trials.append(accepted_at[i - 1] * drafted / drafted_at[i - 1] if i else drafted)
    if not trials:
        return [0.0]
    pooled = sum(hits) / sum(trials)
    strength = TUNABLES.shrink_strength
    return [min((h + strength * pooled) / (t + strength), 1.0) for h, t in zip(hits, trials)]


def fit_timings(runs: list[RunTimings], baseline_reports: list[EdgeReport], baseline_samples: list[tuple[int, float]],
                rtt_s: float = 0.0) -> FittedTimings:
    """``baseline_samples``: the cloud's verify steps during the cloud-only runs (``service_samples``)."""
    one_token = [s for n, s in baseline_samples if n == 1] + [s for r in runs for n, s in r.verify_samples if n == 1]
    steps = [(n, s) for r in runs for n, s in r.verify_samples if n > 1]
    if not steps:
        raise ValueError(f"no verify steps of two rows or more were measured ({VERIFY_SERVICE_METRIC} on the cloud's "
                         "metrics endpoint): nothing to fit the verify line on")
    verify_fixed, verify_per_token = fit_linear(steps)
    up_fixed, up_per_draft = fit_linear([s for r in runs for s in r.up_samples])
    downs = [d for r in runs for d in r.down_samples]
    base_tokens = sum(len(r.tokens) for r in baseline_reports) or 1
    chunk = sum(r.bytes_down for r in baseline_reports) / base_tokens + HTTP2_FRAME_HEADER_BYTES
    opens = [s for r in runs for s in r.open_s]
    prompts = [s for r in runs for s in r.prompt_s]
    drafted = sum(r.drafted for r in runs)
    accepted_at = [sum(r.accepted_at[i] for r in runs if i < len(r.accepted_at)) for i in range(max(len(r.accepted_at) for r in runs))]
    drafted_at = [sum(r.drafted_at[i] for r in runs if i < len(r.drafted_at)) for i in range(max(len(r.drafted_at) for r in runs))]
    base = Timings(
        draft_s_per_token=sum(r.draft_s for r in runs) / max(drafted, 1),
        verify_fixed_s=verify_fixed,
        verify_per_token_s=verify_per_token,
        verify_one_s=sum(one_token) / len(one_token) if one_token else None,
        alpha_per_position=_alpha(accepted_at, drafted_at),
        up_bytes_fixed=up_fixed,
        up_bytes_per_draft=up_per_draft,
        down_bytes_per_round=sum(downs) / max(len(downs), 1),
        down_bytes_per_token_cloud_only=chunk,
        prefill_s=max(sum(opens) / max(len(opens), 1) - rtt_s, 0.0),
        draft_prefill_s=sum(prompts) / max(len(prompts), 1),
        open_up_bytes=sum(r.bytes_up for r in baseline_reports) / max(len(baseline_reports), 1),
    )
    return FittedTimings(base=base, runs=runs, rtt_s=rtt_s, verify_lines=_verify_lines(runs))


def _verify_lines(runs: list[RunTimings]) -> dict[str, tuple[float, float]]:
    """Per mode, the line through its runs' verify steps of two rows or more, where they hold two sizes."""
    lines = {}
    for mode in sorted({r.mode for r in runs}):
        samples = [(n, s) for r in runs if r.mode == mode for n, s in r.verify_samples if n > 1]
        if len({n for n, _ in samples}) > 1:
            lines[mode] = fit_linear(samples)
    return lines
