"""``splitspec sim run``: real edge and cloud processes through the emulated link.

The verifier runs as the product ships it (``--shapes auto``): a session that
asks for reproducible numerics gets canonical (batch-invariant) forwards, one
that does not runs free shapes. For each prompt, cloud-only decoding (the
service's ``Generate``) runs both ways: not reproducible, the fastest a user
could run instead, and reproducible, what token identity is checked against.
Split decoding runs for every drafter, numerics, mode, draft length and
schedule, through the same link. Each drafter
also runs co-located: beside the target in one process on the cloud's core, no
link (``splitspec generate``), the ceiling the link costs against. Everything
in the result is measured in that one run: edge wall time and TTFT, bytes on
the emulated link, the cloud's forward count (its Prometheus counter) and its
CPU time (``/proc``). Ratios are against the fastest cloud-only
(``sim.experiment.yardstick``); the performance model stands beside each row,
in sample and out of sample (``sim.experiment.prediction``), where there is a
verify line to fit (not where every session decoded alone).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field

from edge.report import EdgeReport
from shared.params import (
    DEFAULT_TEMPERATURE,
    NUMERICS,
    SCHEDULES,
    TOKEN_IDENTICAL_MODES,
    window_for,
)
from sim.experiment import yardstick
from sim.experiment.labels import config_label
from sim.experiment.prediction import BaselineRow, MeasuredRow, attach_predictions
from sim.experiment.processes import (
    BackgroundLink,
    BrokerProcess,
    CloudProcess,
    core_split,
    run_edge_process,
    unlabelled,
)
from sim.fixtures.drafter_ladder import DrafterRung
from sim.link.scenario import Scenario
from sim.perf import fit as model_fit
from sim.perf import model as perf_model

__all__ = ["SimConfig", "Measurement", "measure", "run_simulation", "DEFAULT_PROMPTS"]

log = logging.getLogger(__name__)

DEFAULT_PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for writing clear technical documentation.",
]


@dataclass
class SimConfig:
    scenario: Scenario
    target: str  # a loadable target folder (already resolved)
    drafters: list[DrafterRung]  # each runs every configuration (and co-located)
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    modes: list[str] = field(default_factory=lambda: ["greedy", "coupled", "rejection"])
    draft_lens: list[int] = field(default_factory=lambda: [2, 4, 8])
    schedules: list[str] = field(default_factory=lambda: list(SCHEDULES))
    window: int | None = None  # blocks in flight: pipelined (None: DEFAULT_WINDOW), the adaptive cap (None: the link's)
    hedges: list[int] = field(default_factory=lambda: [0])  # hedge branches per block (0: none), each a configuration
    max_new_tokens: int = 128
    temperature: float = DEFAULT_TEMPERATURE
    seed: int = 0
    stream_first: bool = False  # echo the first split run's text as it streams
    mqtt: bool = True  # a broker for fleet telemetry; edges reach it through the emulated link
    colocated: bool = True  # each drafter beside the target in one process, no link (the ceiling)
    numerics: list[str] = field(default_factory=lambda: list(NUMERICS))  # split runs' sessions: auto, reproducible
    lookup: bool = True  # every drafter behind prompt lookup (``edge.lookup_drafter``), split and co-located


def _sampling_args(cfg: SimConfig, prompt: str, mode: str, reproducible: bool = False) -> list[str]:
    temperature = 0.0 if mode == "greedy" else cfg.temperature
    return ["--prompt", prompt, "--max-new-tokens", str(cfg.max_new_tokens), "--temperature", str(temperature),
            "--seed", str(cfg.seed), "--mode", mode, *(["--reproducible"] if reproducible else [])]


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


def _aggregate(mode: str, draft_len: int, reports: list[EdgeReport], meters: list[_Meter], schedule: str | None = None,
               window: int | None = None, hedge: int = 0) -> dict:
    """One configuration's row; ``schedule``/``window`` are None for cloud-only (``window`` too for an adaptive
    row capped by its link)."""
    tokens = sum(len(r.tokens) for r in reports) or 1
    wall = sum(r.wall_s for r in reports)
    per_prompt = [len(r.tokens) / r.wall_s if r.wall_s else 0.0 for r in reports]
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
        # drafts the cloud proposed itself while decoding alone (in rows its forward held anyway), and accepted
        "proposed": sum(r.decode.proposed for r in reports),
        "proposed_accepted": sum(r.decode.proposed_accepted for r in reports),
        "tokens": tokens,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "per_prompt_tokens_per_s": per_prompt,
        "ttft_s": sum(r.ttft_s for r in reports) / len(reports),
        "ttft_cloud_s": sum(r.ttft_cloud_s for r in reports) / len(reports),  # of it, the cloud's own time
        "acceptance_length": tokens / rounds if rounds else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "up_bytes_per_token": sum(m.up for m in meters) / tokens,
        "down_bytes_per_token": sum(m.down for m in meters) / tokens,
        "cloud_forwards_per_token": sum(m.forwards for m in meters) / tokens,
        "cloud_cpu_s_per_token": sum(m.cpu_s for m in meters) / tokens,
        # the cloud's mean one-row step (``model_fit.one_row_step_s``): against cloud-only's, how much slower
        # the machine ran this configuration's forwards
        "cloud_one_row_step_s": model_fit.one_row_step_s([step for m in meters for step in m.verify_samples]),
        "wall_s": wall,
        "outputs": [r.tokens for r in reports],
        "predicted_tokens_per_s": None,  # (the performance model's, set beside the measurement)
        "prediction_error": None,
        "prediction_error_out_of_sample": None,
    }


def run_simulation(cfg: SimConfig, progress=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """Every configuration of ``cfg`` measured (``measure``), then held to the fastest cloud-only, the
    identity checks and the performance model: the result ``sim run`` writes."""
    measured = measure(cfg, progress)
    result = _finish(cfg, measured.primary_kind, measured.baselines, measured.runs, measured.colocated)
    result["fleet"] = measured.fleet
    return result


@dataclass
class Measurement:
    """What ``measure`` ran: the cloud-only rows by yardstick and kind, the split rows (each with its
    per-prompt edge reports), the co-located references and the fleet's summary."""

    primary_kind: str  # "sampled" when any sampled mode ran, else "greedy"
    baselines: dict[str, BaselineRow]
    runs: list[MeasuredRow]
    colocated: dict[str, dict]
    fleet: dict | None


def measure(cfg: SimConfig, progress=lambda line: print(line, file=sys.stderr, flush=True), *,
            yardsticks: tuple[str, ...] = (yardstick.FASTEST, yardstick.REPRODUCIBLE)) -> Measurement:
    """Run cloud-only (for each of ``yardsticks``) and every split configuration of ``cfg`` over every
    prompt, with real processes through the scenario's link."""
    edge_cores, cloud_cores = core_split()
    progress(
        f"scenario {cfg.scenario.name}: {cfg.scenario.description}\n"
        f"cores: edge {sorted(edge_cores) if edge_cores else 'shared'}, cloud {sorted(cloud_cores) if cloud_cores else 'shared'}"
    )
    configs = [(rung, n, mode, d, s, h) for rung in cfg.drafters for n in cfg.numerics for mode in cfg.modes
               for d in cfg.draft_lens for s in cfg.schedules for h in cfg.hedges
               if not h or mode in TOKEN_IDENTICAL_MODES]  # (rejection mode takes no hedges)
    # Greedy runs are checked against a greedy baseline, sampled modes against a sampled one.
    kinds = sorted({_baseline_kind(mode) for mode in cfg.modes}, key=lambda k: k != "sampled")
    colocated_runs = len(cfg.drafters) * len(cfg.prompts) if cfg.colocated else 0
    progress_of = _Progress(progress, (len(yardsticks) * len(kinds) + len(configs)) * len(cfg.prompts) + colocated_runs)
    with contextlib.ExitStack() as stack:
        # Fleet telemetry: the cloud reports to a broker directly; the edges reach it through the
        # scenario's link too (an emulator of its own: its bytes are counted apart from gRPC's).
        broker = stack.enter_context(BrokerProcess()) if cfg.mqtt else None
        cloud_args = ["--mqtt", broker.url, "--replica", "sim-cloud"] if broker else []
        if "rejection" in cfg.modes:  # the simulation's edges are the operator's own: granted it
            cloud_args += ["--rejection-to", "all"]
        cloud = stack.enter_context(CloudProcess(cfg.target, cloud_cores, extra_args=[*cloud_args, "--shapes", "auto"]))
        link = stack.enter_context(BackgroundLink(cfg.scenario.link, cloud.port))
        fleet_link = stack.enter_context(BackgroundLink(cfg.scenario.link, broker.port)) if broker else None
        fleet_args = ["--mqtt", f"mqtt://{fleet_link.address}", "--edge-id", "sim-edge"] if fleet_link else []
        progress(f"cloud ready on port {cloud.port} (--shapes auto); link emulator on {link.address}"
                 + (f"; MQTT broker {broker.url}, through the link at {fleet_link.address}" if broker else ""))
        for reproducible in (False, True):  # first forwards allocate and load lazily: no configuration pays for it
            run_edge_process(["baseline", "--cloud", f"127.0.0.1:{cloud.port}", "--drafter", cfg.drafters[0].path,
                              "--prompt", "Hello", "--max-new-tokens", "4", "--temperature", "0",
                              *(["--reproducible"] if reproducible else [])], edge_cores)
        rig = _Rig(cloud, link, edge_cores, fleet_args, progress_of)
        baselines: dict[str, BaselineRow] = {}
        for yard in yardsticks:
            for kind in kinds:
                key = yardstick.baseline_key(yard, kind, kinds[0])
                baselines[key] = _cloud_only(cfg, rig, kind, yard == yardstick.REPRODUCIBLE)
                baselines[key].row.update(kind=kind, yardstick=yard)
        runs = []
        split_started = time.monotonic()
        for config in configs:
            runs.append(_split(cfg, rig, _SplitConfig(*config), stream=cfg.stream_first and not runs))
        fleet = _fleet_summary(broker, fleet_link, time.monotonic() - split_started, cfg) if broker else None
    colocated = {rung.name: _colocated(cfg, rung, cloud_cores, progress_of) for rung in cfg.drafters} \
        if cfg.colocated else {}
    return Measurement(kinds[0], baselines, runs, colocated, fleet)


@dataclass(frozen=True)
class _SplitConfig:
    """One split configuration of a run."""

    rung: DrafterRung
    numerics: str  # "as-opened" or "reproducible"
    mode: str
    draft_len: int
    schedule: str
    hedge: int


@dataclass(frozen=True)
class _Rig:
    """What a run's configurations share: the cloud process, the link in front of it, the edges' cores,
    the fleet's flags and the progress lines."""

    cloud: CloudProcess
    link: BackgroundLink
    edge_cores: set[int] | None
    fleet_args: list[str]
    progress: _Progress


class _Progress:
    """``[step/total] what`` lines."""

    def __init__(self, progress, total: int) -> None:
        self.progress, self.total, self.step = progress, total, 0

    def __call__(self, line: str, counts: bool = True) -> None:
        self.step += counts
        self.progress(f"[{self.step}/{self.total}] {line}" if counts else line)


def _cloud_only(cfg: SimConfig, rig: _Rig, kind: str, reproducible: bool) -> BaselineRow:
    """Cloud-only decoding of every prompt (reproducible: canonical shapes; else free, the fastest)."""
    cloud, link, edge_cores, progress = rig.cloud, rig.link, rig.edge_cores, rig.progress
    shapes = "canonical" if reproducible else "free"
    reports, meters = [], []
    for prompt in cfg.prompts:
        progress(f"cloud-only ({kind}, {shapes} shapes): {prompt[:48]!r}")
        with _Meter(cloud, link) as meter:
            args = ["baseline", "--cloud", link.address, "--drafter", cfg.drafters[0].path, "--verdict-timeout", "600",
                    "--timings", *_sampling_args(cfg, prompt, "greedy" if kind == "greedy" else "coupled", reproducible)]
            reports.append(run_edge_process(args, edge_cores))
        meters.append(meter)
    row = _aggregate("cloud-only", 0, reports, meters)
    row.update(label="cloud-only reproducible" if reproducible else "cloud-only", shapes=shapes,
               reproducible=reproducible)
    progress(f"    {row['label']} ({kind}): {row['tokens_per_s']:.2f} tok/s", counts=False)
    return BaselineRow(row, reports, [m.verify_samples for m in meters])


def _split(cfg: SimConfig, rig: _Rig, config: _SplitConfig, stream: bool) -> MeasuredRow:
    """One split configuration over every prompt."""
    cloud, link, edge_cores, progress, fleet_args = rig.cloud, rig.link, rig.edge_cores, rig.progress, rig.fleet_args
    rung, numerics, mode, draft_len = config.rung, config.numerics, config.mode, config.draft_len
    schedule, hedge = config.schedule, config.hedge
    # (The adaptive schedule's cap, where none is given, is what the link can use: the edge sizes it.)
    window = None if schedule == "adaptive" and cfg.window is None else window_for(schedule, cfg.window)
    reproducible = numerics == "reproducible"
    name = config_label(mode, draft_len, schedule, window, hedge) + (" reproducible" if reproducible else "")
    label = f"{rung.name}: {name}" if len(cfg.drafters) > 1 else name
    reports, meters = [], []
    for i, prompt in enumerate(cfg.prompts):
        progress(f"{label}: {prompt[:48]!r}")
        out = sys.stdout if stream and i == 0 else None
        with _Meter(cloud, link) as meter:
            args = ["run", "--cloud", link.address, "--drafter", rung.path, "--verdict-timeout", "600", "--timings",
                    *fleet_args, "--drafter-threads", str(len(edge_cores) if edge_cores else 1),
                    *_sampling_args(cfg, prompt, mode, reproducible), "--draft-len", str(draft_len),
                    "--schedule", schedule, *(["--window", str(window)] if window else []), "--hedge", str(hedge),
                    *(["--lookup"] if cfg.lookup else [])]
            reports.append(run_edge_process(args, edge_cores, stream_to=out))
        meters.append(meter)
        if out is not None:
            print(flush=True)
    row = _aggregate(mode, draft_len, reports, meters, schedule, window, hedge)
    row.update(drafter=rung.name, label=label, reproducible=reproducible)
    return MeasuredRow(row, reports, [m.verify_samples for m in meters])


def _colocated(cfg: SimConfig, rung: DrafterRung, cloud_cores, progress: _Progress) -> dict:
    """``rung`` beside the target in one process on the cloud's core, no link, free shapes: what a provider
    running its own draft model serves (coupled, adaptive, the largest draft length)."""
    import json
    import subprocess

    from sim.experiment.processes import pinned_env, side_command

    mode = "coupled" if "coupled" in cfg.modes else cfg.modes[0]
    draft_len, window = max(cfg.draft_lens), window_for("adaptive", cfg.window)
    tokens, wall, outputs = 0, 0.0, []
    for prompt in cfg.prompts:
        progress(f"co-located {rung.name}: {prompt[:48]!r}")
        cmd = [*side_command("splitspec", "sim.cli"), "generate", "--target", cfg.target, "--shapes", "free",
               "--drafter", rung.path, "--drafter-threads", "1", *_sampling_args(cfg, prompt, mode),
               "--draft-len", str(draft_len), "--schedule", "adaptive", "--window", str(window), "--json",
               *(["--lookup"] if cfg.lookup else [])]
        env, preexec = pinned_env(cloud_cores)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=preexec, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"co-located generate failed ({done.returncode}): {done.stderr[-2000:]}")
        out = json.loads(done.stdout)
        tokens, wall = tokens + len(out["tokens"]), wall + out["stats"]["wall_s"]
        outputs.append(out["tokens"])
    return {"drafter": rung.name, "config": config_label(mode, draft_len, "adaptive", window), "shapes": "free",
            "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0, "outputs": outputs}


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


def _finish(cfg: SimConfig, primary_kind: str, baselines: dict[str, BaselineRow], measured: list[MeasuredRow],
            colocated: dict[str, dict]) -> dict:
    link = perf_model.NetworkModel.from_link_config(cfg.scenario.link)
    rows = {key: b.row for key, b in baselines.items()}
    for m in measured:
        run, kind = m.row, _baseline_kind(m.row["mode"])
        fastest = rows[yardstick.baseline_key(yardstick.FASTEST, kind, primary_kind)]
        reproducible = rows[yardstick.baseline_key(yardstick.REPRODUCIBLE, kind, primary_kind)]
        # Rejection mode is lossless in distribution, not token for token: no identity to check. A reproducible
        # session promises reproducible cloud-only's tokens; one that is not is exact in distribution and its
        # identity with the fastest cloud-only (free shapes round differently) is measured, not promised.
        checked = run["mode"] in TOKEN_IDENTICAL_MODES
        run["identical_to_baseline"] = run["outputs"] == reproducible["outputs"] if checked and run["reproducible"] \
            else None
        run["identical_to_fastest"] = run["outputs"] == fastest["outputs"] if checked else None
        run["ratios"] = yardstick.ratios(run, fastest)
        run["ratios_vs_reproducible"] = yardstick.ratios(run, reproducible)
    for row in rows.values():
        fastest = rows[yardstick.baseline_key(yardstick.FASTEST, row["kind"], primary_kind)]
        reproducible = rows[yardstick.baseline_key(yardstick.REPRODUCIBLE, row["kind"], primary_kind)]
        row["identical_to_baseline"] = row["outputs"] == reproducible["outputs"] if row["reproducible"] else None
        row["identical_to_fastest"] = row["outputs"] == fastest["outputs"]
        row["ratios"] = yardstick.ratios(row, fastest)
        row["ratios_vs_reproducible"] = yardstick.ratios(row, reproducible)
    fastest = rows[yardstick.FASTEST]
    for entry in colocated.values():
        entry["ratio_to_fastest"] = entry["tokens_per_s"] / fastest["tokens_per_s"] if fastest["tokens_per_s"] else None
    fit = {}  # each numerics fitted on its own runs and cloud-only (canonical forwards cost more than free ones)
    for numerics, reproducible in (("auto", False), ("reproducible", True)):
        group = [m for m in measured if m.row["reproducible"] == reproducible]
        if not group:
            continue
        try:
            fit[numerics] = attach_predictions(
                group, [b for b in baselines.values() if b.row["reproducible"] == reproducible], link,
                len(cfg.prompts))
        except ValueError as exc:  # (every session decoded alone: no verify line to fit) the measurements stand
            log.warning("no model predictions for %s sessions: %s", numerics, exc)
            fit[numerics] = {"not fitted": str(exc)}
    runs = [m.row for m in measured]
    return {
        "scenario": cfg.scenario.name,
        "description": cfg.scenario.description,
        "link": {"up_bps": link.up_bps, "down_bps": link.down_bps, "rtt_ms": round(link.rtt_s * 1e3, 3)},
        "models": {"target": cfg.target, "drafters": {rung.name: rung.path for rung in cfg.drafters}},
        "prompts": cfg.prompts,
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "lookup": cfg.lookup,
        "baseline": fastest,
        "baselines": rows,
        "runs": runs,
        "colocated": colocated,
        "headlines": yardstick.headlines(runs, rows, primary_kind),
        "model_fit": fit,
    }
