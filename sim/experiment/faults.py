"""``splitspec sim faults``: cut the link and crash the verifier under real edge processes, and
check every generation against an unbroken run of itself.

For each (mode, prompt) the edge first runs unbroken through the emulated
link; that run's byte count B on the link is the space the cuts are drawn
from. The faulted run then has cuts armed at uniformly random byte offsets
in [1, B) of its own traffic (``LinkEmulator.arm_cuts``): they land wherever
the bytes are, in the Open, mid-block, mid-verdict, and as often on a message
boundary as bytes allow. Successive cuts of a run are at least
``min_gap_bytes`` apart (more than a recovery's own traffic), so that each
recovery is measured alone; 0 lets cuts land inside recoveries (a flapping
link). A cloud restart kills the service with SIGKILL once
the run has moved a random share of B and starts a new one on the same port,
so every session is lost and the edge must reopen. A generation counts as
identical when its tokens equal the unbroken run's (greedy and coupled
promise that; rejection mode is exact in distribution and is reported as
completed), and ``tokens_lost`` counts the unbroken run's tokens missing
from the faulted one.
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
from dataclasses import dataclass, field

from edge.drafter import common_prefix_length
from edge.report import EdgeReport
from shared.params import DEFAULT_WINDOW, TOKEN_IDENTICAL_MODES
from sim.experiment.processes import BackgroundLink, CloudProcess, core_split, run_edge_process
from sim.link.scenario import Scenario

__all__ = ["FaultConfig", "run_faults"]


@dataclass
class FaultConfig:
    scenario: Scenario
    target: str  # a loadable target folder (already resolved)
    drafter: str  # drafter GGUF path
    prompts: list[str]
    modes: list[str] = field(default_factory=lambda: ["greedy", "coupled"])
    cuts: int = 20  # link cuts over all generations
    restarts: int = 1  # cloud crashes (SIGKILL) and restarts over all generations
    max_new_tokens: int = 64
    draft_len: int = 8
    schedule: str = "pipelined"
    window: int = DEFAULT_WINDOW
    temperature: float = 0.7
    outage_budget_s: float = 60.0
    min_gap_bytes: int = 1024  # link bytes between two cuts of one generation, at least
    seed: int = 0


def _share(total: int, parts: int, index: int) -> int:
    """``total`` split as evenly as possible over ``parts``; the share of part ``index``."""
    return total // parts + (index < total % parts)


class _Restarter:
    """Kills the cloud once the link has carried ``after_bytes`` more bytes, then starts a new one on
    the same port (a thread, so the edge process runs meanwhile)."""

    def __init__(self, cloud: list[CloudProcess], link: BackgroundLink, after_bytes: int, progress) -> None:
        self.cloud, self.link, self.progress = cloud, link, progress
        self.threshold = sum(link.counters()) + after_bytes
        self.done = threading.Event()
        self.restarted = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="cloud-restarter", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.done.wait(0.02):
                if sum(self.link.counters()) >= self.threshold:
                    old = self.cloud[-1]
                    old.kill()
                    self.progress(f"    killed the cloud (SIGKILL) at link byte {sum(self.link.counters())}; restarting")
                    self.cloud.append(CloudProcess(old.target, old.cores, port=old.port,
                                                   extra_args=old.extra_args).__enter__())
                    self.restarted = True
                    self.progress(f"    cloud back on port {old.port}")
                    return
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> bool:
        """Stop waiting; True when the restart happened."""
        self.done.set()
        self.thread.join(timeout=900)
        if self.error is not None:
            raise RuntimeError(f"restarting the cloud failed: {self.error}") from self.error
        return self.restarted


def _tokens_lost(reference: list[int], got: list[int]) -> int:
    """Tokens of the unbroken run missing from the faulted run (its common prefix is kept)."""
    return len(reference) - common_prefix_length(reference, got)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_faults(cfg: FaultConfig, progress=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    rng = random.Random(cfg.seed)
    edge_cores, cloud_cores = core_split()
    generations = [(mode, prompt) for mode in cfg.modes for prompt in cfg.prompts]
    restart_at = set(rng.sample(range(len(generations)), min(cfg.restarts, len(generations))))
    progress(f"scenario {cfg.scenario.name}: {cfg.scenario.description}")
    progress(f"{len(generations)} generations, {cfg.cuts} cuts at least {cfg.min_gap_bytes} link bytes apart, "
             f"{len(restart_at)} cloud restarts")
    rows: list[dict] = []
    references: dict[tuple[str, str], tuple[EdgeReport, int]] = {}  # unbroken run and its link bytes
    granted = ["--rejection-to", "all"] if "rejection" in cfg.modes else []
    cloud = [CloudProcess(cfg.target, cloud_cores, extra_args=granted).__enter__()]
    try:
        with BackgroundLink(cfg.scenario.link, cloud[0].port) as link:
            common = ["--cloud", link.address, "--drafter", cfg.drafter, "--verdict-timeout", "600",
                      "--drafter-threads", str(len(edge_cores) if edge_cores else 1),
                      "--max-new-tokens", str(cfg.max_new_tokens), "--draft-len", str(cfg.draft_len),
                      "--schedule", cfg.schedule, "--window", str(cfg.window),
                      "--outage-budget", str(cfg.outage_budget_s), "--seed", str(cfg.seed)]
            pending = cfg.cuts
            i = 0
            # Every generation runs once; cuts a generation was too short to take go to the next one,
            # and generations repeat (up to 3 rounds) until every cut has landed.
            while i < len(generations) or (pending > 0 and i < _MAX_ROUNDS * len(generations)):
                mode, prompt = generations[i % len(generations)]
                temperature = 0.0 if mode == "greedy" else cfg.temperature
                args = ["run", *common, "--prompt", prompt, "--mode", mode, "--temperature", str(temperature)]
                if (mode, prompt) not in references:
                    before = sum(link.counters())
                    references[(mode, prompt)] = run_edge_process(args, edge_cores), sum(link.counters()) - before
                reference, span = references[(mode, prompt)]
                cuts = -(-pending // max(len(generations) - i, 1))  # ceil: spread what is left
                offsets, at = [], sum(link.counters()) + rng.randrange(1, span)
                for _ in range(cuts):
                    offsets.append(at)
                    at += cfg.min_gap_bytes + rng.randrange(0, max(span // cuts, 1))
                fired_before = dict(link.emulator.armed_cuts_fired)
                link.arm_cuts(offsets)
                restarter = (_Restarter(cloud, link, rng.randrange(span // 5, span * 4 // 5), progress)
                             if i in restart_at else None)
                progress(f"[{i + 1}] {mode}: {cuts} cuts{' and a cloud restart' if restarter else ''}: {prompt[:48]!r}")
                try:
                    faulted = run_edge_process(args, edge_cores, check=False)
                finally:
                    link.arm_cuts([])
                    restarted = restarter.finish() if restarter else False
                fired = {d: link.emulator.armed_cuts_fired[d] - fired_before[d] for d in fired_before}
                pending -= sum(fired.values())
                rows.append(_row(mode, reference, faulted, sum(fired.values()), fired, restarted))
                row = rows[-1]
                progress(f"    {row['cuts']} cuts ({fired['up']} up, {fired['down']} down), restarted={restarted}: "
                         f"completed={row['completed']}, identical={row['identical']}, lost {row['tokens_lost']} tokens, "
                         f"{len(faulted.recoveries)} recoveries")
                i += 1
    finally:
        for process in cloud:
            process.__exit__(None, None, None)
    return _summary(cfg, rows)


_MAX_ROUNDS = 3


def _row(mode: str, reference: EdgeReport, faulted: EdgeReport, cuts: int, fired: dict, restarted: bool) -> dict:
    return {
        "mode": mode,
        "cuts": cuts,
        "cuts_by_direction": fired,
        "restarted": restarted,
        "completed": not faulted.error and faulted.stop_reason == reference.stop_reason,
        "identical": faulted.tokens == reference.tokens if mode in TOKEN_IDENTICAL_MODES else None,
        "tokens_lost": _tokens_lost(reference.tokens, faulted.tokens) if mode in TOKEN_IDENTICAL_MODES else
        max(len(reference.tokens) - len(faulted.tokens), 0),
        "error": faulted.error,
        "wall_s": faulted.wall_s,
        "reference_wall_s": reference.wall_s,
        "recoveries": [vars(r) for r in faulted.recoveries],
    }


def _summary(cfg: FaultConfig, rows: list[dict]) -> dict:
    recoveries = [r for row in rows for r in row["recoveries"]]
    reattached = [r for r in recoveries if not r["reopened"]]
    reopened = [r for r in recoveries if r["reopened"]]
    recover = [r["recover_s"] for r in recoveries if r["recover_s"]]
    return {
        "scenario": cfg.scenario.name,
        "cuts": sum(row["cuts"] for row in rows),
        "cuts_requested": cfg.cuts,
        "restarts": sum(row["restarted"] for row in rows),
        "generations": len(rows),
        "completed": sum(row["completed"] for row in rows),
        "identical": sum(bool(row["identical"]) for row in rows),
        "identity_checked": sum(row["identical"] is not None for row in rows),
        "tokens_lost": sum(row["tokens_lost"] for row in rows),
        "recover_s_p50": _median(recover),
        "recover_s_max": max(recover) if recover else None,
        "recoveries": len(recoveries),
        "reattached": len(reattached),
        "reopened": len(reopened),
        "reattach_recover_s_p50": _median([r["recover_s"] for r in reattached if r["recover_s"]]),
        "reattach_up_bytes_p50": _median([r["up_bytes"] for r in reattached]),
        "reopen_up_bytes_p50": _median([r["up_bytes"] for r in reopened]),
        "cuts_by_direction": {d: sum(row["cuts_by_direction"][d] for row in rows) for d in ("up", "down")},
        "config": {
            "modes": cfg.modes, "prompts": len(cfg.prompts), "max_new_tokens": cfg.max_new_tokens,
            "draft_len": cfg.draft_len, "schedule": cfg.schedule, "window": cfg.window, "seed": cfg.seed,
            "outage_budget_s": cfg.outage_budget_s, "min_gap_bytes": cfg.min_gap_bytes,
        },
        "runs": rows,
    }
