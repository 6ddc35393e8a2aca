"""``splitspec sim run``: real edge and cloud processes through the emulated link.

For each prompt, the cloud-only baseline (the service's ``Generate``: the
cloud decodes every token and streams it down) and split decoding in every
requested mode and draft length run against the same cloud process, through
the same link. Everything in the result is measured in that one run: edge
wall time and TTFT, bytes on the emulated link, the cloud's forward count
(its Prometheus counter) and its CPU time (``/proc``). The performance model
is fitted on the same measurements and its prediction stands beside each.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field

from edge.report import EdgeReport
from shared.params import DEFAULT_TEMPERATURE, DEFAULT_WINDOW, SCHEDULES, TOKEN_IDENTICAL_MODES, window_for
from sim.experiment.labels import config_label
from sim.experiment.processes import (
    BackgroundLink,
    BrokerProcess,
    CloudProcess,
    core_split,
    run_edge_process,
    unlabelled,
)
from sim.link.scenario import Scenario
from sim.perf import fit as model_fit
from sim.perf import model as perf_model

__all__ = ["SimConfig", "run_simulation", "DEFAULT_PROMPTS"]

DEFAULT_PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for writing clear technical documentation.",
]

@dataclass
class SimConfig:
    scenario: Scenario
    target: str  # a loadable target folder (already resolved)
    drafter: str  # drafter GGUF path
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    modes: list[str] = field(default_factory=lambda: ["greedy", "coupled", "rejection"])
    draft_lens: list[int] = field(default_factory=lambda: [2, 4, 8])
    schedules: list[str] = field(default_factory=lambda: list(SCHEDULES))
    window: int = DEFAULT_WINDOW  # blocks in flight for the pipelined schedule
    hedges: list[int] = field(default_factory=lambda: [0])  # hedge branches per block (0: none), each a configuration
    max_new_tokens: int = 128
    temperature: float = DEFAULT_TEMPERATURE
    seed: int = 0
    stream_first: bool = False  # echo the first split run's text as it streams
    mqtt: bool = True  # a broker for fleet telemetry; edges reach it through the emulated link


def _sampling_args(cfg: SimConfig, prompt: str, mode: str) -> list[str]:
    temperature = 0.0 if mode == "greedy" else cfg.temperature
    return ["--prompt", prompt, "--max-new-tokens", str(cfg.max_new_tokens), "--temperature", str(temperature),
            "--seed", str(cfg.seed), "--mode", mode]


class _Meter:
    """Deltas of the cloud's and the link's counters around one edge process, and the cloud's verify
    steps in between (``verify_samples``: (rows in the forward, seconds) per step)."""

    def __init__(self, cloud: CloudProcess, link: BackgroundLink) -> None:
        self.cloud, self.link = cloud, link

    def _read(self) -> tuple[float, dict[str, dict[str, float]], int, int]:
        return (self.cloud.cpu_s(), self.cloud.scrape(), *self.link.counters())

    def __enter__(self):
        self._start = self._read()
        return self

    def __exit__(self, *exc) -> None:
        (cpu_before, before, up_before, down_before), (cpu, after, up, down) = self._start, self._read()
        forwards = "splitspec_target_forwards_total"
        self.cpu_s = cpu - cpu_before
        self.forwards = unlabelled(after, forwards) - unlabelled(before, forwards)
        self.up, self.down = up - up_before, down - down_before
        self.verify_samples = model_fit.service_samples(before, after)


@dataclass
class _Measured:
    """One split configuration's row of the result, with what the model fit needs beside it."""

    row: dict  # the JSON row of result["runs"]
    timings: model_fit.RunTimings
    baseline_kind: str  # which cloud-only baseline it is compared with ("greedy" or "sampled")
    prompts: list[model_fit.RunTimings]  # each prompt's part of ``timings``


def _aggregate(mode: str, draft_len: int, reports: list[EdgeReport], meters: list[_Meter], schedule: str | None = None,
               window: int | None = None, hedge: int = 0) -> dict:
    """One configuration's row; ``schedule``/``window`` are None for cloud-only."""
    tokens = sum(len(r.tokens) for r in reports) or 1
    wall = sum(r.wall_s for r in reports)
    rounds = sum(r.decode.rounds for r in reports)
    drafted = sum(r.decode.drafted for r in reports)
    accepted = sum(r.decode.accepted for r in reports)
    guessed = sum(r.decode.corrections_guessed for r in reports)
    return {
        "mode": mode,
        "draft_len": draft_len,
        "schedule": schedule,
        "window": window,
        "hedge": hedge or None,
        "hedges_sent": sum(r.decode.hedges_sent for r in reports),
        "hedges_taken": sum(r.decode.hedges_taken for r in reports),
        "hedge_tokens": sum(r.decode.hedge_tokens for r in reports),
        "mean_draft_len": drafted / rounds if rounds and schedule else None,
        # h: how often a correction was the drafter's second choice (what a hedge branch would bet on)
        "hedge_hit_rate": (sum(r.decode.corrections_hit for r in reports) / guessed) if guessed else None,
        "controller_switches": sum(r.switches for r in reports) if schedule == "adaptive" else None,
        # blocks answered stale, the cloud's forwards for them, and the rebased drafts those verified and accepted
        "stale_blocks": sum(r.decode.stale for r in reports),
        "stale_decoded": sum(r.decode.stale_decoded for r in reports),
        "rebased_verified": sum(r.decode.rebased_verified for r in reports),
        "rebased_accepted": sum(r.decode.rebased for r in reports),
        "tokens": tokens,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "ttft_s": sum(r.ttft_s for r in reports) / len(reports),
        "ttft_cloud_s": sum(r.ttft_cloud_s for r in reports) / len(reports),  # of it, the cloud's own time
        "acceptance_length": tokens / rounds if rounds else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "up_bytes_per_token": sum(m.up for m in meters) / tokens,
        "down_bytes_per_token": sum(m.down for m in meters) / tokens,
        "cloud_forwards_per_token": sum(m.forwards for m in meters) / tokens,
        "cloud_cpu_s_per_token": sum(m.cpu_s for m in meters) / tokens,
        "wall_s": wall,
        "outputs": [r.tokens for r in reports],
    }


def run_simulation(cfg: SimConfig, progress=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    edge_cores, cloud_cores = core_split()
    progress(
        f"scenario {cfg.scenario.name}: {cfg.scenario.description}\n"
        f"cores: edge {sorted(edge_cores) if edge_cores else 'shared'}, cloud {sorted(cloud_cores) if cloud_cores else 'shared'}"
    )
    configs = [(mode, d, s, h) for mode in cfg.modes for d in cfg.draft_lens for s in cfg.schedules for h in cfg.hedges
               if not h or mode in TOKEN_IDENTICAL_MODES]  # (rejection mode takes no hedges)
    # Greedy runs are checked against a greedy baseline, sampled modes against a sampled one.
    kinds = sorted({_baseline_kind(mode) for mode in cfg.modes}, key=lambda k: k != "sampled")
    total = (len(kinds) + len(configs)) * len(cfg.prompts)
    step = 0
    with contextlib.ExitStack() as stack:
        # Fleet telemetry: the cloud reports to a broker directly; the edges reach it through the
        # scenario's link too (an emulator of its own: its bytes are counted apart from gRPC's).
        broker = stack.enter_context(BrokerProcess()) if cfg.mqtt else None
        cloud_args = ["--mqtt", broker.url, "--replica", "sim-cloud"] if broker else []
        cloud = stack.enter_context(CloudProcess(cfg.target, cloud_cores, extra_args=cloud_args))
        link = stack.enter_context(BackgroundLink(cfg.scenario.link, cloud.port))
        fleet_link = stack.enter_context(BackgroundLink(cfg.scenario.link, broker.port)) if broker else None
        fleet_args = ["--mqtt", f"mqtt://{fleet_link.address}", "--edge-id", "sim-edge"] if fleet_link else []
        progress(f"cloud ready on port {cloud.port}; link emulator on {link.address}"
                 + (f"; MQTT broker {broker.url}, through the link at {fleet_link.address}" if broker else ""))
        common = ["--cloud", link.address, "--drafter", cfg.drafter, "--verdict-timeout", "600", "--timings"]
        # Warm the cloud up (first forwards allocate and load lazily) so no configuration pays for it.
        run_edge_process(["baseline", "--cloud", f"127.0.0.1:{cloud.port}", "--drafter", cfg.drafter,
                          "--prompt", "Hello", "--max-new-tokens", "4", "--temperature", "0"], edge_cores)
        baselines, baseline_reports, baseline_samples = {}, [], []
        for kind in kinds:
            reports, meters = [], []
            for prompt in cfg.prompts:
                step += 1
                progress(f"[{step}/{total}] cloud-only ({kind}): {prompt[:48]!r}")
                with _Meter(cloud, link) as meter:
                    args = ["baseline", *common, *_sampling_args(cfg, prompt, "greedy" if kind == "greedy" else "coupled")]
                    reports.append(run_edge_process(args, edge_cores))
                meters.append(meter)
            baselines[kind] = _aggregate("cloud-only", 0, reports, meters)
            baseline_reports.extend(reports)
            baseline_samples.extend(s for m in meters for s in m.verify_samples)
            progress(f"    cloud-only ({kind}): {baselines[kind]['tokens_per_s']:.2f} tok/s")
        runs = []
        split_started = time.monotonic()
        for mode, draft_len, schedule, hedge in configs:
            window = window_for(schedule, cfg.window)
            name = config_label(mode, draft_len, schedule, window, hedge)
            reports, meters = [], []
            for i, prompt in enumerate(cfg.prompts):
                step += 1
                progress(f"[{step}/{total}] {name}: {prompt[:48]!r}")
                stream = sys.stdout if cfg.stream_first and not runs and i == 0 else None
                with _Meter(cloud, link) as meter:
                    args = ["run", *common, *fleet_args, "--drafter-threads", str(len(edge_cores) if edge_cores else 1),
                            *_sampling_args(cfg, prompt, mode), "--draft-len", str(draft_len),
                            "--schedule", schedule, "--window", str(window), "--hedge", str(hedge)]
                    reports.append(run_edge_process(args, edge_cores, stream_to=stream))
                meters.append(meter)
                if stream is not None:
                    print(flush=True)
            run = _aggregate(mode, draft_len, reports, meters, schedule, window, hedge)
            reference = baselines[_baseline_kind(mode)]
            # Rejection mode is lossless in distribution, not token for token: no identity to check.
            run["identical_to_baseline"] = run["outputs"] == reference["outputs"] if mode in TOKEN_IDENTICAL_MODES else None
            timings = model_fit.timings_from_reports(reports, [s for m in meters for s in m.verify_samples], mode)
            prompts = [model_fit.timings_from_reports([r], m.verify_samples, mode) for r, m in zip(reports, meters)]
            runs.append(_Measured(run, timings, _baseline_kind(mode), prompts))
            progress(
                f"    {name}: {run['tokens_per_s']:.2f} tok/s, AL {run['acceptance_length']:.2f}, "
                f"identical={run['identical_to_baseline']}"
            )
        fleet = _fleet_summary(broker, fleet_link, time.monotonic() - split_started, cfg) if broker else None
    result = _finish(cfg, baselines, baseline_reports, baseline_samples, runs)
    result["fleet"] = fleet
    return result


def _fleet_summary(broker, fleet_link, elapsed_s: float, cfg) -> dict:
    """What the broker saw, and what MQTT cost the edge's uplink over the split runs."""
    from sim.fleet.watch import watch_once

    up, down = fleet_link.counters()
    return {
        "view": watch_once(broker.url),
        "mqtt_up_bytes": up,
        "mqtt_down_bytes": down,
        "mqtt_uplink_share": (up * 8 / elapsed_s / cfg.scenario.link.up.rate_bps
                              if elapsed_s and cfg.scenario.link.up.rate_bps else None),
        "split_runs_s": elapsed_s,
    }


def _baseline_kind(mode: str) -> str:
    return "greedy" if mode == "greedy" else "sampled"


def _finish(cfg, baselines: dict, baseline_reports: list[EdgeReport], baseline_samples: list[tuple[int, float]],
            measured: list[_Measured]) -> dict:
    link = perf_model.NetworkModel.from_link_config(cfg.scenario.link)
    # The shared timings (the verify line on the cloud's own step times, the prefill) are fitted on every
    # run; every run is predicted with its own drafter speed and bytes, every prompt with its own acceptance.
    fitted = model_fit.fit_timings([m.timings for m in measured], baseline_reports, baseline_samples, rtt_s=link.rtt_s)
    runs = [m.row for m in measured]
    for m in measured:
        # Each prompt with its own acceptance, over its own length (a short generation ends chains the
        # steady state would not).
        parts, best = [], []
        for prompt in m.prompts:
            timings = fitted.for_prompt(m.timings, prompt)
            if m.row["schedule"] == "adaptive":
                predicted = perf_model.predict_adaptive(timings, link, m.row["draft_len"], m.row["window"], prompt.tokens)
                best.append((perf_model.best_adaptive(timings, link, m.row["draft_len"], m.row["window"], prompt.tokens),
                             prompt.tokens, timings.draft_prefill_s))
            else:
                predicted = perf_model.predict_pipelined(timings, link, m.row["draft_len"], m.row["window"],
                                                         generation_tokens=prompt.tokens)
            parts.append((predicted, prompt.tokens, timings.draft_prefill_s))
        _attach_prediction(m.row, parts)
        # The adaptive schedule's ceiling beside its controller's choice: the gap is the controller's.
        m.row["predicted_best_tokens_per_s"] = _predicted_rate(best)[0] if best else None
        m.row["ratios"] = _ratios(m.row, baselines[m.baseline_kind])
    for baseline in baselines.values():
        alone = perf_model.predict_cloud_only(fitted.base, link)
        _attach_prediction(baseline, [(alone, baseline["tokens"] / len(cfg.prompts), 0.0)])  # (every prompt alike)
        baseline["identical_to_baseline"] = True
        baseline["ratios"] = _ratios(baseline, baseline)
    return {
        "scenario": cfg.scenario.name,
        "description": cfg.scenario.description,
        "link": {"up_bps": link.up_bps, "down_bps": link.down_bps, "rtt_ms": round(link.rtt_s * 1e3, 3)},
        "models": {"target": cfg.target, "drafter": cfg.drafter},
        "prompts": cfg.prompts,
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "baseline": baselines.get("sampled") or baselines["greedy"],
        "baselines": baselines,
        "runs": runs,
        "model_fit": fitted.describe(),
    }


def _attach_prediction(run: dict, parts: list[tuple[perf_model.Prediction, float, float]]) -> None:
    """Predicted tokens/s over the same span the edge measured, from (prediction, tokens, startup
    seconds) per prompt: each prompt's first token, its startup (the drafter reading the prompt
    before its first block), then its other tokens at its rate; all prompts' tokens over all that."""
    run["predicted_tokens_per_s"], run["limited_by"] = _predicted_rate(parts)
    run["prediction_error"] = run["predicted_tokens_per_s"] / run["tokens_per_s"] - 1 if run["tokens_per_s"] else None


def _predicted_rate(parts: list[tuple[perf_model.Prediction, float, float]]) -> tuple[float, str]:
    """(tokens/s, what the prompt that takes longest waits on most) over ``_attach_prediction``'s parts."""
    walls = [p.ttft_s + startup_s + max(n - 1, 0) / p.tokens_per_s for p, n, startup_s in parts]
    wall, tokens = sum(walls), sum(n for _, n, _ in parts)
    slowest = max(zip(walls, (p for p, _, _ in parts)), key=lambda pair: pair[0])[1]
    return (tokens / wall if wall > 0 else 0.0), slowest.limit


_RATIO_KEYS = ["tokens_per_s", "ttft_s", "up_bytes_per_token", "down_bytes_per_token", "cloud_forwards_per_token", "cloud_cpu_s_per_token"]


def _ratios(run: dict, baseline: dict) -> dict:
    return {k: (run[k] / baseline[k] if baseline[k] else None) for k in _RATIO_KEYS}
