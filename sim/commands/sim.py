"""``splitspec sim ...``: the link emulator and the network-constrained simulation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from shared.cli import non_negative_int, positive_float, positive_int
from shared.params import DEFAULT_TEMPERATURE, DEFAULT_WINDOW, NUMERICS, SCHEDULES

__all__ = ["add_sim_commands"]


def add_sim_commands(commands) -> None:
    from sim.commands.link import add_link_commands

    add_link_commands(commands)
    run = commands.add_parser(
        "run",
        help="measure split vs cloud-only decoding with real processes on an emulated link",
        description="Starts the real cloud service and real edge clients as separate processes (pinned to separate "
        "cores) connected through the link emulator, runs the same prompts cloud-only and split in each mode and "
        "draft length, and writes result.json, report.md and PNG plots to --out.",
    )
    run.add_argument("scenario", help="scenario name (acespec-50k, lte, wan, satellite) or a TOML file")
    run.add_argument("--prompts", type=Path, default=None, help="file with one prompt per line (default: 3 built-in prompts)")
    run.add_argument("--modes", nargs="+", choices=["greedy", "coupled", "rejection"], default=None,
                     help="split modes to run (default: all three; --quick: coupled)")
    run.add_argument("--draft-lens", nargs="+", type=int, default=None, help="draft lengths D (default: 2 4 8; --quick: 8)")
    run.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=None,
                     help="edge schedules to run each configuration with (default: all; --quick: adaptive)")
    run.add_argument("--window", type=positive_int, default=None,
                     help=f"blocks in flight: the pipelined schedule's (default {DEFAULT_WINDOW}), the adaptive one's "
                     "cap (default: as many as the cloud verifies in a round trip, at least that)")
    run.add_argument("--hedges", nargs="+", type=non_negative_int, default=[0],
                     help="hedge branches per block to run each greedy and coupled configuration with (default: 0 = "
                     "none; e.g. 0 2 runs each without and with two)")
    run.add_argument("--max-new-tokens", type=int, default=None, help="tokens per prompt (default 128; --quick: 64)")
    run.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                     help="for coupled and rejection (default %(default)s)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--quick", action="store_true",
                     help="fewer configurations (coupled, adaptive D<=8, 64 tokens, both drafters): about 6 minutes "
                     "on 2 cores once the models are cached")
    run.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    run.add_argument("--drafters", nargs="+", default=None, metavar="RUNG",
                     help="drafters to run every configuration with: 'default' (Gemma 3 270M Q4_K_M, the target's own "
                     "weights: acceptance near its ceiling), a llama.cpp quantization type such as q3_k_s or q2_k (a "
                     "weaker rung made from the default GGUF on first use and cached) or a GGUF path (default: "
                     "default; --quick: default q2_k)")
    run.add_argument("--drafter", default=None, help="one drafter GGUF (the same as --drafters PATH)")
    run.add_argument("--numerics", nargs="+", choices=NUMERICS, default=list(NUMERICS),
                     help="split sessions as the product opens them by default (auto: free shapes unless batched "
                     "with a reproducible session) and/or reproducible (canonical shapes, token-identical to "
                     "reproducible cloud-only) (default: both)")
    run.add_argument("--no-colocated", action="store_true",
                     help="skip the co-located reference (each drafter beside the target in one process, no link)")
    run.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True,
                     help="every drafter behind prompt lookup, split and co-located runs alike (the edge's default; "
                          "--no-lookup: the drafters alone)")
    run.add_argument("--out", type=Path, default=None, help="output folder (default: out/sim-SCENARIO)")
    run.add_argument("--no-mqtt", action="store_true",
                     help="no fleet telemetry (by default a broker runs and the edges report to it through the link)")
    run.add_argument("--json", action="store_true", help="print result.json to stdout instead of the table")
    run.set_defaults(func=run_sim)

    faults = commands.add_parser(
        "faults",
        help="cut the link and crash the cloud under real edge processes; check every output",
        description="Starts the real cloud service and edge processes through the link emulator. Each generation "
        "runs once unbroken, then again with the link cut at random byte offsets of its traffic (in the Open, "
        "mid-block, mid-verdict, between messages) and, for --restart-cloud generations, the cloud killed with "
        "SIGKILL and restarted on the same port. The edge must resume (or reopen) and finish with the unbroken "
        "run's output.",
    )
    faults.add_argument("scenario", help="scenario name (acespec-50k, lte, wan, satellite) or a TOML file")
    faults.add_argument("--cuts", type=non_negative_int, default=20, help="link cuts over all generations (default 20)")
    faults.add_argument("--restart-cloud", type=non_negative_int, default=1, metavar="K",
                        help="generations during which the cloud crashes and restarts (default 1)")
    faults.add_argument("--modes", nargs="+", choices=["greedy", "coupled", "rejection"], default=["greedy", "coupled"],
                        help="modes to run (default: greedy coupled)")
    faults.add_argument("--prompts", type=positive_int, default=2, help="built-in prompts per mode (default 2, at most 3)")
    faults.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens per generation (default 64)")
    faults.add_argument("--draft-len", type=positive_int, default=8, help="drafts per block (default 8)")
    faults.add_argument("--schedule", choices=SCHEDULES, default="pipelined", help="edge schedule (default pipelined)")
    faults.add_argument("--window", type=positive_int, default=DEFAULT_WINDOW,
                        help=f"blocks in flight (default {DEFAULT_WINDOW})")
    faults.add_argument("--outage-budget", type=positive_float, default=60.0,
                        help="the edge's --outage-budget (default 60 s: a restart reloads the target)")
    faults.add_argument("--min-gap", type=non_negative_int, default=1024, metavar="BYTES",
                        help="link bytes between two cuts of one run, at least (default 1024: each recovery is "
                        "measured alone; 0: cuts may land inside recoveries, a flapping link)")
    faults.add_argument("--seed", type=int, default=0, help="seeds sampling, cut offsets and restart times")
    faults.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    faults.add_argument("--drafter", default=None, help="drafter GGUF (default: Gemma 3 270M Q4_K_M)")
    faults.add_argument("--out", type=Path, default=None, help="also write the full result here (JSON)")
    faults.add_argument("--json", action="store_true", help="print the summary as JSON")
    faults.set_defaults(func=run_sim_faults)

    from sim.commands.perf import add_model_command

    add_model_command(commands)


def run_sim(args: argparse.Namespace) -> int:
    from cloud.models import resolve_target
    from sim.experiment.provenance import provenance
    from sim.experiment.report import markdown_report, terminal_table, write_plots
    from sim.experiment.runner import DEFAULT_PROMPTS, SimConfig, run_simulation
    from sim.fixtures.drafter_ladder import DEFAULT_RUNG, drafter_rung
    from sim.link.scenario import load_scenario

    scenario = load_scenario(args.scenario)
    if args.prompts is not None:
        if not args.prompts.is_file():
            raise FileNotFoundError(f"prompts file not found: {args.prompts}")
        prompts = [line.strip() for line in args.prompts.read_text().splitlines() if line.strip()]
        if not prompts:
            raise ValueError(f"{args.prompts} holds no prompts")
    else:
        prompts = list(DEFAULT_PROMPTS)
    draft_lens = args.draft_lens or ([8] if args.quick else [2, 4, 8])
    if any(d < 1 for d in draft_lens):
        raise ValueError("draft lengths must be >= 1 (the cloud-only baseline always runs)")
    if args.drafter and args.drafters:
        raise ValueError("give --drafter or --drafters, not both")
    names = [args.drafter] if args.drafter else args.drafters or ([DEFAULT_RUNG, "q2_k"] if args.quick else [DEFAULT_RUNG])
    if len(set(names)) < len(names):
        raise ValueError(f"--drafters: a drafter is named twice: {' '.join(names)}")
    drafters = [drafter_rung(name, progress=lambda line: print(line, file=sys.stderr, flush=True)) for name in names]
    config = SimConfig(
        scenario=scenario,
        target=str(resolve_target(args.target)),
        drafters=drafters,
        prompts=prompts,
        modes=args.modes or (["coupled"] if args.quick else ["greedy", "coupled", "rejection"]),
        draft_lens=draft_lens,
        schedules=args.schedules or (["adaptive"] if args.quick else list(SCHEDULES)),
        window=args.window,
        hedges=sorted(set(args.hedges)),
        max_new_tokens=args.max_new_tokens or (64 if args.quick else 128),
        temperature=args.temperature,
        seed=args.seed,
        stream_first=not args.json,
        mqtt=not args.no_mqtt,
        colocated=not args.no_colocated,
        numerics=list(dict.fromkeys(args.numerics)),
        lookup=args.lookup,
    )
    made_by = provenance()  # (before the run: a commit made while it runs did not make it)
    result = run_simulation(config)
    result["provenance"] = made_by
    out = args.out or Path("out") / f"sim-{scenario.name}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    (out / "report.md").write_text(markdown_report(result))
    plots = write_plots(result, out)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print()
        print(terminal_table(result))
        print()
        print("\n".join(line for line in markdown_report(result).splitlines() if line.startswith("- ")))
    print(f"wrote {out / 'result.json'}, {out / 'report.md'} and {len(plots)} plots", file=sys.stderr)
    return 0


def run_sim_faults(args: argparse.Namespace) -> int:
    from cloud.models import resolve_target
    from shared.models import default_gguf_path
    from sim.experiment.faults import FaultConfig, run_faults
    from sim.experiment.runner import DEFAULT_PROMPTS
    from sim.link.scenario import load_scenario

    if args.prompts > len(DEFAULT_PROMPTS):
        raise ValueError(f"--prompts: there are {len(DEFAULT_PROMPTS)} built-in prompts")
    drafter = args.drafter or str(default_gguf_path())
    if not Path(drafter).is_file():
        raise FileNotFoundError(f"drafter model not found: {drafter}")
    result = run_faults(
        FaultConfig(
            scenario=load_scenario(args.scenario),
            target=str(resolve_target(args.target)),
            drafter=drafter,
            prompts=DEFAULT_PROMPTS[: args.prompts],
            modes=args.modes,
            cuts=args.cuts,
            restarts=args.restart_cloud,
            max_new_tokens=args.max_new_tokens,
            draft_len=args.draft_len,
            schedule=args.schedule,
            window=args.window,
            outage_budget_s=args.outage_budget,
            min_gap_bytes=args.min_gap,
            seed=args.seed,
        )
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    summary = {k: v for k, v in result.items() if k not in ("runs", "config")}
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:>24}: {value}")
    ok = (result["completed"] == result["generations"] and result["identical"] == result["identity_checked"]
          and result["cuts"] == result["cuts_requested"])
    return 0 if ok else 1
