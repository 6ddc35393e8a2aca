"""The cloud's time per forward in the split against cloud-only's, per prompt, from its own counters.

Usage (from the repository root, the venv's python):
    SCEN=acespec-50k [PATHS=P,P...] python docs/results/2026-12-07-colocation-zen5-epyc/cloud_cost.py RUNG [QID,QID...]

One cloud behind the scenario's link (``cloud_behind_link``); per category-bench prompt (seed 0; only the
QIDs given, if any): cloud-only (``baseline``), then the coupled adaptive split. Around each run it reads
the cloud's CPU seconds, its Prometheus ``splitspec_engine_busy_seconds`` (wall time inside target
forwards) and ``splitspec_engine_forwards``, the cloud core's steal time and this driver's own CPU (the
link emulator runs here), and prints the differences: ms a forward, and the cloud's CPU outside forwards.
"""
import os
import sys
from contextlib import ExitStack

from sim.experiment.categories import probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process, unlabelled
from sim.link.scenario import load_scenario

ADAPTIVE = ["--schedule", "adaptive", "--draft-len", "8", "--window", "4", "--hedge", "0", "--lookup",
            "--drafter-threads", "1"]


def main() -> None:
    rung = sys.argv[1]
    qids = {int(q) for q in sys.argv[2].split(",")} if len(sys.argv) > 2 else None
    scen = load_scenario(os.environ.get("SCEN", "acespec-50k"))
    paths = os.environ.get("PATHS", "").split(",")
    edge_cores, cloud_cores = core_split()
    cloud_core = min(cloud_cores)
    with ExitStack() as stack:
        cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)

        def snapshot() -> tuple[float, ...]:
            samples, me = cloud.scrape(), os.times()
            steal = next(int(line.split()[8]) for line in open("/proc/stat") if line.startswith(f"cpu{cloud_core} "))
            return (steal, me.user + me.system, cloud.cpu_s(), unlabelled(samples, "splitspec_engine_busy_seconds_total"),
                    unlabelled(samples, "splitspec_engine_forwards_total"))

        warmed = False
        for _, drafter, _, _, question, sampling in probe_lines([rung], (0,)):
            if qids and question.question_id not in qids:
                continue
            if not warmed:
                run_edge_process(["baseline", "--cloud", link.address, "--drafter", drafter, *sampling], edge_cores)
                warmed = True
            splits = [(f"split {i}" if len(paths) > 1 else "split", ["run", *ADAPTIVE], {"PYTHONPATH": p} if p else None)
                      for i, p in enumerate(paths)]
            for label, args, env in (("cloud-only", ["baseline"], None), *splits):
                before = snapshot()
                report = run_edge_process([*args, "--cloud", link.address, "--drafter", drafter, *sampling],
                                          edge_cores, env=env).to_json()
                steal, driver, cpu, busy, forwards = (b - a for a, b in zip(before, snapshot()))
                print(f"#{question.question_id:<4d} {label:10s} {len(report['tokens']) / report['wall_s']:6.2f} tok/s  "
                      f"{forwards:3.0f} forwards  {1e3 * busy / max(forwards, 1):5.1f} ms a forward  cloud CPU outside "
                      f"forwards {1e3 * (cpu - busy) / max(forwards, 1):4.1f} ms a forward  steal {steal:.0f} ticks  "
                      f"driver CPU {driver:.2f} s  drafted {(report.get('drafter') or {}).get('drafted', 0) / len(report['tokens']):.1f} a token",
                      flush=True)


if __name__ == "__main__":
    main()
