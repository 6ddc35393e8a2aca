"""``splitspec sim ...``: the link emulator and the network-constrained simulation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from shared.cli import positive_int
from shared.params import DEFAULT_TEMPERATURE, DEFAULT_WINDOW, SCHEDULES

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
                     help="split modes to run (default: all three; --quick: coupled and rejection)")
    run.add_argument("--draft-lens", nargs="+", type=int, default=None, help="draft lengths D (default: 2 4 8; --quick: 4 8)")
    run.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES),
                     help="edge schedules to run each configuration with (default: all)")
    run.add_argument("--window", type=positive_int, default=DEFAULT_WINDOW,
                     help=f"blocks in flight for the pipelined schedule (default {DEFAULT_WINDOW})")
    run.add_argument("--max-new-tokens", type=int, default=None, help="tokens per prompt (default 128; --quick: 64)")
    run.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                     help="for coupled and rejection (default %(default)s)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--quick", action="store_true", help="one prompt, fewer configurations: a few minutes on 2 cores")
    run.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    run.add_argument("--drafter", default=None, help="drafter GGUF (default: Gemma 3 270M Q4_K_M)")
    run.add_argument("--out", type=Path, default=None, help="output folder (default: out/sim-SCENARIO)")
    run.add_argument("--json", action="store_true", help="print result.json to stdout instead of the table")
    run.set_defaults(func=run_sim)

    from sim.commands.perf import add_model_command

    add_model_command(commands)


def run_sim(args: argparse.Namespace) -> int:
    from cloud.models import resolve_target
    from shared.models import default_gguf_path
    from sim.experiment.report import markdown_report, terminal_table, write_plots
    from sim.experiment.runner import DEFAULT_PROMPTS, SimConfig, run_simulation
    from sim.link.scenario import load_scenario

    scenario = load_scenario(args.scenario)
    if args.prompts is not None:
        if not args.prompts.is_file():
            raise FileNotFoundError(f"prompts file not found: {args.prompts}")
        prompts = [line.strip() for line in args.prompts.read_text().splitlines() if line.strip()]
        if not prompts:
            raise ValueError(f"{args.prompts} holds no prompts")
    else:
        prompts = DEFAULT_PROMPTS[:1] if args.quick else list(DEFAULT_PROMPTS)
    draft_lens = args.draft_lens or ([4, 8] if args.quick else [2, 4, 8])
    if any(d < 1 for d in draft_lens):
        raise ValueError("draft lengths must be >= 1 (the cloud-only baseline always runs)")
    drafter = args.drafter or str(default_gguf_path())
    if not Path(drafter).is_file():
        raise FileNotFoundError(f"drafter model not found: {drafter}")
    config = SimConfig(
        scenario=scenario,
        target=str(resolve_target(args.target)),
        drafter=drafter,
        prompts=prompts,
        modes=args.modes or (["coupled", "rejection"] if args.quick else ["greedy", "coupled", "rejection"]),
        draft_lens=draft_lens,
        schedules=args.schedules,
        window=args.window,
        max_new_tokens=args.max_new_tokens or (64 if args.quick else 128),
        temperature=args.temperature,
        seed=args.seed,
        stream_first=not args.json,
    )
    result = run_simulation(config)
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
