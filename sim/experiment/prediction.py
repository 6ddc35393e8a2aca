"""The performance model beside each measured row of a ``sim run``: in sample and out of sample.

In sample, the shared timings (the verify line on the cloud's own step times,
the prefill) are fitted on every prompt and each row is predicted with its own
drafter speed, bytes and acceptance by position: a reconstruction of the run,
not a check. Out of sample, everything is fitted on half the prompts (the even
ones: timings *and* each row's acceptance, speed and bytes) and predicts the
rows' speed on the other half, which the fit never saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.link_windows import drafting_window_for
from edge.report import EdgeReport
from sim.perf import fit as model_fit
from sim.perf import model as perf_model
from sim.perf.ceiling import ceiling, per_prompt_efficiency, steady_rate

__all__ = ["MeasuredRow", "BaselineRow", "attach_predictions"]


@dataclass
class MeasuredRow:
    """One split configuration: its result row and, per prompt, the edge's report and the cloud's verify
    steps meanwhile."""

    row: dict  # the JSON row of result["runs"]
    reports: list[EdgeReport]  # [prompts]
    samples: list[list[tuple[int, float]]]  # [prompts] (rows in the forward, seconds) per verify step

    def timings(self, prompts: list[int]) -> model_fit.RunTimings:
        return model_fit.timings_from_reports([self.reports[i] for i in prompts],
                                              [s for i in prompts for s in self.samples[i]], self.row["mode"])


@dataclass
class BaselineRow:
    """One cloud-only baseline: its result row, per prompt its report and the cloud's steps."""

    row: dict
    reports: list[EdgeReport]
    samples: list[list[tuple[int, float]]]


def _fit(measured: list[MeasuredRow], fitted_on: list[BaselineRow], prompts: list[int],
         rtt_s: float) -> model_fit.FittedTimings:
    return model_fit.fit_timings([m.timings(prompts) for m in measured],
                                 [b.reports[i] for b in fitted_on for i in prompts],
                                 [s for b in fitted_on for i in prompts for s in b.samples[i]], rtt_s=rtt_s)


def _predict(row: dict, timings: perf_model.Timings, link: perf_model.NetworkModel, tokens: int,
             best: bool = False) -> perf_model.Prediction:
    if row["schedule"] == "adaptive":
        how = perf_model.best_adaptive if best else perf_model.predict_adaptive
        # (No cap given: the link's, as the edge settles on it: the round trip over a block's forward.)
        window = row["window"] or drafting_window_for(link.rtt_s, timings.verify_s(row["draft_len"] + 1))
        return how(timings, link, row["draft_len"], window, tokens)
    return perf_model.predict_pipelined(timings, link, row["draft_len"], row["window"], generation_tokens=tokens)


def attach_predictions(measured: list[MeasuredRow], baselines: list[BaselineRow], link: perf_model.NetworkModel,
                       n_prompts: int) -> dict:
    """Set each row's ``ceiling_tokens_per_s`` and ``efficiency`` (``sim.perf.ceiling``, on the fitted timings;
    per prompt: ``per_prompt_ceiling_tokens_per_s``, ``per_prompt_steady_tokens_per_s`` and their
    ``per_prompt_efficiency`` summary, ``sim.perf.ceiling.per_prompt_efficiency``),
    ``predicted_tokens_per_s`` / ``prediction_error`` (in sample), ``predicted_best_tokens_per_s``
    (adaptive rows: the best schedule's, beside its controller's) and ``prediction_error_out_of_sample`` (None
    with one prompt), and the ``baselines``' in-sample predictions. ``measured`` and ``baselines`` share their
    numerics (the forwards' shapes): the verify line and the one-token time are fitted on them alone.
    Returns the fit's description."""
    everything = list(range(n_prompts))
    fitted = _fit(measured, baselines, everything, link.rtt_s)
    for m in measured:
        run = m.timings(everything)
        _attach_ceiling(m.row, fitted.for_timings(run))
        parts, best, ceilings = [], [], []
        for i in everything:  # each prompt with its own acceptance, over its own length
            prompt = m.timings([i])
            timings = fitted.for_prompt(run, prompt)
            parts.append((_predict(m.row, timings, link, prompt.tokens), prompt.tokens, timings.draft_prefill_s))
            if m.row["schedule"] == "adaptive":
                best.append((_predict(m.row, timings, link, prompt.tokens, best=True), prompt.tokens,
                             timings.draft_prefill_s))
            own = ceiling(timings)
            ceilings.append(own.tokens_per_s if own else None)
        m.row["per_prompt_ceiling_tokens_per_s"] = ceilings
        m.row["per_prompt_steady_tokens_per_s"] = [steady_rate(len(r.tokens), r.wall_s, r.ttft_s) for r in m.reports]
        m.row["per_prompt_efficiency"] = per_prompt_efficiency(
            m.row["per_prompt_steady_tokens_per_s"], ceilings, [p.tokens_per_s for p, _, _ in best] if best else None)
        m.row["predicted_tokens_per_s"], m.row["limited_by"] = _predicted_rate(parts)
        m.row["prediction_error"] = _error(m.row["predicted_tokens_per_s"], m.row["tokens_per_s"])
        m.row["predicted_best_tokens_per_s"] = _predicted_rate(best)[0] if best else None
        m.row["prediction_error_out_of_sample"] = None
    held_in, held_out = everything[0::2], everything[1::2]
    if held_out:
        half = _fit(measured, baselines, held_in, link.rtt_s)
        for m in measured:
            run = m.timings(held_in)
            timings = half.for_prompt(run, run)  # acceptance, speed and bytes from the other prompts too
            parts = [(_predict(m.row, timings, link, len(m.reports[i].tokens)), len(m.reports[i].tokens),
                      timings.draft_prefill_s) for i in held_out]
            measured_rate = (sum(len(m.reports[i].tokens) for i in held_out)
                             / max(sum(m.reports[i].wall_s for i in held_out), 1e-9))
            m.row["prediction_error_out_of_sample"] = _error(_predicted_rate(parts)[0], measured_rate)
    for baseline in baselines:
        alone = perf_model.predict_cloud_only(fitted.base, link)
        row = baseline.row
        row["predicted_tokens_per_s"], row["limited_by"] = _predicted_rate([(alone, row["tokens"] / n_prompts, 0.0)])
        row["prediction_error"] = _error(row["predicted_tokens_per_s"], row["tokens_per_s"])
        row["prediction_error_out_of_sample"] = None
    described = fitted.describe()
    described["out of sample"] = (f"fitted on prompts {held_in}, predicting prompts {held_out}" if held_out
                                  else "one prompt: none")
    return described


def _attach_ceiling(row: dict, timings: perf_model.Timings) -> None:
    """The machine's ceiling for the row's drafter and acceptance (``sim.perf.ceiling``), and the row's
    efficiency: its tokens/s over that ceiling."""
    best = ceiling(timings)
    row["ceiling_tokens_per_s"] = best.tokens_per_s if best else None
    row["ceiling_draft_len"] = best.draft_len if best else None
    row["ceiling_limited_by"] = best.limited_by if best else None
    row["efficiency"] = row["tokens_per_s"] / best.tokens_per_s if best and best.tokens_per_s else None


def _error(predicted: float, measured: float) -> float | None:
    return predicted / measured - 1 if measured else None


def _predicted_rate(parts: list[tuple[perf_model.Prediction, float, float]]) -> tuple[float, str]:
    """(tokens/s, what the prompt that takes longest waits on most) from (prediction, tokens, startup
    seconds) per prompt: each prompt's first token, its startup (the drafter reading the prompt before
    its first block), then its other tokens at its rate; all prompts' tokens over all that."""
    walls = [p.ttft_s + startup_s + max(n - 1, 0) / p.tokens_per_s for p, n, startup_s in parts]
    wall, tokens = sum(walls), sum(n for _, n, _ in parts)
    slowest = max(zip(walls, (p for p, _, _ in parts)), key=lambda pair: pair[0])[1]
    return (tokens / wall if wall > 0 else 0.0), slowest.limit
