"""``splitspec bench serve``: what ``edge serve`` costs and what its conversations save, measured
with a real cloud process behind the emulated link.

Three measurements in one run, on the same cloud cores, link and drafter:

- a conversation of ``turns`` user turns (greedy, so both arms see the same
  replies and prompts), once keeping the cloud session between turns and once
  opening a fresh session per turn (re-sending the whole history): per turn,
  prompt tokens, prompt tokens uploaded, the Open's bytes against the packed
  size of the new tokens, time to first token, the kept arm's tokens/s; the
  replies must be identical; the drafter is behind prompt lookup (``lookup``,
  as ``edge serve`` runs it) unless told otherwise, under ``edge serve``'s
  ``schedule`` (default pipelined);
- the HTTP layer: one prompt streamed through the OpenAI server (uvicorn,
  server-sent events) against the same generation called directly:
  tokens/s and time to first token;
- load: ``edge serve`` under 1, 2, 4 and 8 concurrent two-turn conversations
  (``sim.bench.serve_load``; ``concurrency``): tokens/s together, time to
  first token and latency, median and worst;
- the yardstick: that prompt decoded cloud-only (``Generate``) through the
  same link, by a cloud in free shapes (the fastest cloud-only, a second
  process on the same cores and threads) and by the split's own cloud in
  canonical shapes (batch-invariant: the reproducible cloud-only); the
  direct split's tokens/s over each.

Contract: ``run_serve_bench(ServeBench(...))`` returns the report dict and
``format_serve_report`` renders it; flags live in ``sim.commands.bench``.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from shared.params import DEFAULT_SCHEDULE
from sim.bench.serve_load import LEVELS, format_load, load_levels, openai_server

__all__ = ["ServeBench", "run_serve_bench", "format_serve_report", "QUESTIONS"]

FASTEST_SHAPES = "free"  # the fastest cloud-only
SPLIT_SHAPES = "canonical"  # batch-invariant: the split's cloud (set, not left to the default), and the reproducible cloud-only
HTTP_MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]

QUESTIONS = [
    "Why is the sky blue?",
    "And why are sunsets red?",
    "Does the same thing happen on Mars?",
    "What colour is the Martian sunset, then?",
    "How do we know that?",
    "Which rover took those pictures?",
    "When did it land?",
    "What else did it find?",
    "Is it still working?",
    "Summarise our conversation in one sentence.",
]


@dataclass(frozen=True)
class ServeBench:
    """What ``run_serve_bench`` runs (``splitspec bench serve``'s flags)."""

    scenario: str = "acespec-50k"  # the link between the edge and the cloud process
    turns: int = 10  # user turns of the conversation, at most len(QUESTIONS)
    max_tokens: int = 32  # reply tokens per turn
    repeats: int = 3  # HTTP against direct
    target: str | None = None  # None: the default Gemma 3 270M pair
    drafter: str | None = None
    lookup: bool = True  # the drafter behind prompt lookup, as ``edge serve`` runs it by default
    schedule: str = DEFAULT_SCHEDULE  # edge serve's --schedule
    concurrency: tuple[int, ...] = LEVELS  # concurrent conversations, one load level each (empty: no load levels)


def run_serve_bench(bench: ServeBench, progress=lambda line: None) -> dict[str, Any]:
    scenario, turns, max_tokens, repeats = bench.scenario, bench.turns, bench.max_tokens, bench.repeats
    target, drafter, lookup, schedule = bench.target, bench.drafter, bench.lookup, bench.schedule
    import httpx

    from cloud.models import resolve_target
    from edge.drafter_choice import open_llama_drafter
    from edge.serving import EdgeService, Job, ServeConfig
    from shared.params import Mode, SamplingParams
    from sim.experiment.processes import BackgroundLink, CloudProcess, core_split
    from sim.link.scenario import load_scenario

    if not 1 <= turns <= len(QUESTIONS):
        raise ValueError(f"turns must be in [1, {len(QUESTIONS)}], got {turns}")
    link_scenario = load_scenario(scenario)
    edge_cores, cloud_cores = core_split()
    greedy = SamplingParams(mode=Mode.GREEDY)
    report: dict[str, Any] = {"scenario": link_scenario.name, "lookup": lookup, "schedule": schedule, "turns": [],
                              "http": {}}
    draft = open_llama_drafter(drafter, n_threads=len(edge_cores) if edge_cores else 1, lookup=lookup)
    try:
        with CloudProcess(str(resolve_target(target)), cloud_cores, extra_args=["--shapes", SPLIT_SHAPES]) as cloud, \
                BackgroundLink(link_scenario.link, cloud.port) as link:
            config = ServeConfig(cloud=link.address, model_name=draft.model_name, schedule=schedule)
            service = EdgeService.for_drafter(draft, config)
            service.run(Job(service.text_prompt("Hello"), greedy, 4), lambda text: None, threading.Event())  # warm up
            report["turns"] = _conversation_arms(service, turns, max_tokens, greedy, progress)
            with openai_server(service) as url:
                report["http"] = _http_overhead(service, url, httpx, greedy, max_tokens * 2, repeats, progress)
                service.conversations.clear()
                report["load"] = load_levels(url, bench.concurrency, max_tokens, progress) if bench.concurrency else []
            prompt, _ = service.chat_prompt(HTTP_MESSAGES)
            vocab = (service.vocab.size, service.vocab.fingerprint)
            reproducible = _cloud_only(link.address, vocab, prompt, greedy, max_tokens * 2, repeats)
            with CloudProcess(str(resolve_target(target)), cloud_cores, extra_args=["--shapes", FASTEST_SHAPES]) as free, \
                    BackgroundLink(link_scenario.link, free.port) as free_link:
                fastest = _cloud_only(free_link.address, vocab, prompt, greedy, max_tokens * 2, repeats)
            direct = report["http"]["direct_tokens_per_s"]
            report["cloud_only"] = {
                "fastest": {"shapes": FASTEST_SHAPES, **fastest}, "reproducible": {"shapes": SPLIT_SHAPES, **reproducible},
                "split_shapes": SPLIT_SHAPES, "cloud_cores": sorted(cloud_cores) if cloud_cores else None,
                "direct_over_fastest": direct / fastest["tokens_per_s"] if fastest["tokens_per_s"] else None,
                "direct_over_reproducible": direct / reproducible["tokens_per_s"] if reproducible["tokens_per_s"] else None,
            }
            progress(f"cloud-only: {fastest['tokens_per_s']:.2f} tok/s in {FASTEST_SHAPES} shapes, "
                     f"{reproducible['tokens_per_s']:.2f} in {SPLIT_SHAPES}")
    finally:
        draft.close()
    return report


def _conversation_arms(service, turns: int, max_tokens: int, greedy, progress) -> list[dict]:
    """The conversation both ways, kept session and fresh session per turn: one row per turn."""
    from edge.drafter import common_prefix_length
    from edge.serving import Job
    from shared import codec

    rows_out: list[dict] = []
    arms: dict[str, list[dict]] = {}
    for arm in ("kept", "fresh"):
        messages: list[dict] = []
        rows = arms[arm] = []
        held: list[int] = []  # tokens the kept session holds after the last turn
        for turn, question in enumerate(QUESTIONS[:turns]):
            messages.append({"role": "user", "content": question})
            prompt, stops = service.chat_prompt(messages)
            if arm == "fresh":
                service.conversations.clear()  # a new session: the whole history goes up again
            new = prompt[common_prefix_length(held, prompt):] if arm == "kept" and turn else prompt
            out = service.run(Job(prompt, greedy, max_tokens, stops), lambda text: None, threading.Event())
            rows.append({
                "turn": turn + 1, "prompt_tokens": len(prompt), "tokens_sent": out.prompt_tokens_sent,
                "open_bytes": out.prompt_bytes_up, "new_tokens_packed_bytes": len(codec.encode_tokens(
                    new, service.vocab.size).data), "ttft_s": out.ttft_s, "reply": out.text,
                "tokens_per_s": len(out.tokens) / out.wall_s if out.wall_s else 0.0,
            })
            held = [*prompt, *out.tokens]
            messages.append({"role": "assistant", "content": out.text})
            progress(f"{arm} turn {turn + 1}: {len(prompt)} prompt tokens, {out.prompt_tokens_sent} sent, "
                     f"{out.prompt_bytes_up} B, ttft {out.ttft_s:.2f}s")
    for kept, fresh in zip(arms["kept"], arms["fresh"]):
        rows_out.append({
            "turn": kept["turn"], "prompt_tokens": kept["prompt_tokens"],
            "kept_tokens_sent": kept["tokens_sent"], "kept_open_bytes": kept["open_bytes"],
            "new_tokens_packed_bytes": kept["new_tokens_packed_bytes"], "kept_ttft_s": kept["ttft_s"],
            "kept_tokens_per_s": kept["tokens_per_s"],
            "fresh_tokens_sent": fresh["tokens_sent"], "fresh_open_bytes": fresh["open_bytes"],
            "fresh_ttft_s": fresh["ttft_s"], "identical": kept["reply"] == fresh["reply"],
        })
    return rows_out


def _cloud_only(address: str, vocab: tuple, prompt: list[int], params, max_tokens: int, repeats: int) -> dict[str, float]:
    """``prompt`` decoded cloud-only ``repeats`` times after a short unmeasured warm-up: median tokens/s and TTFT."""
    from edge.cloud_only import cloud_only_generate
    from edge.endpoint import VerifierEndpoint

    def once(tokens: int):
        return cloud_only_generate(VerifierEndpoint(address, *vocab), prompt, params, max_new_tokens=tokens)

    once(4)  # a fresh cloud's first forwards are slow
    runs = [once(max_tokens) for _ in range(repeats)]
    return {"tokens_per_s": statistics.median(len(r.tokens) / r.wall_s for r in runs),
            "ttft_s": statistics.median(r.ttft_s for r in runs), "repeats": repeats}


def _http_overhead(service, url: str, httpx, params, max_tokens: int, repeats: int, progress) -> dict[str, float]:
    """The same generation through the HTTP server at ``url`` (streamed) and called directly."""
    from edge.serving import Job

    messages = HTTP_MESSAGES
    prompt, stops = service.chat_prompt(messages)
    url = f"{url}/chat/completions"
    direct, http = [], []
    for _ in range(repeats):
        service.conversations.clear()
        started, first = time.perf_counter(), []

        def stamp(text: str, first: list = first) -> None:
            if not first:
                first.append(time.perf_counter())

        out = service.run(Job(prompt, params, max_tokens, stops), stamp, threading.Event())
        direct.append((len(out.tokens) / (time.perf_counter() - started), first[0] - started))
        service.conversations.clear()
        started, first, tokens = time.perf_counter(), [], 0
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url, json=body, timeout=600) as response:
            for line in response.iter_lines():
                if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                    first = first or [time.perf_counter()]
                if '"completion_tokens"' in line:
                    tokens = json.loads(line[6:])["usage"]["completion_tokens"]
        http.append((tokens / (time.perf_counter() - started), first[0] - started))
        progress(f"direct {direct[-1][0]:.1f} tok/s ttft {direct[-1][1]:.3f}s; "
                 f"http {http[-1][0]:.1f} tok/s ttft {http[-1][1]:.3f}s")
    direct_tps, direct_ttft = statistics.median(d[0] for d in direct), statistics.median(d[1] for d in direct)
    http_tps, http_ttft = statistics.median(h[0] for h in http), statistics.median(h[1] for h in http)
    return {"direct_tokens_per_s": direct_tps, "http_tokens_per_s": http_tps,
            "http_over_direct": http_tps / direct_tps, "direct_ttft_s": direct_ttft, "http_ttft_s": http_ttft,
            "http_extra_ttft_s": http_ttft - direct_ttft, "repeats": repeats}


def format_serve_report(report: dict[str, Any]) -> str:
    from tabulate import tabulate

    rows = [[t["turn"], t["prompt_tokens"], t["kept_tokens_sent"], t["kept_open_bytes"], t["new_tokens_packed_bytes"],
             f"{t['kept_ttft_s']:.2f}", t["fresh_tokens_sent"], t["fresh_open_bytes"], f"{t['fresh_ttft_s']:.2f}",
             f"{t['fresh_ttft_s'] / max(t['kept_ttft_s'], 1e-9):.1f}x", f"{t.get('kept_tokens_per_s', 0.0):.2f}",
             "yes" if t["identical"] else "NO"]
            for t in report["turns"]]
    table = tabulate(rows, headers=["turn", "prompt tok", "kept: sent", "kept: Open B", "new tok packed B",
                                    "kept: TTFT s", "fresh: sent", "fresh: Open B", "fresh: TTFT s", "TTFT gain",
                                    "kept: tok/s", "identical"])
    speeds = [t["kept_tokens_per_s"] for t in report["turns"] if "kept_tokens_per_s" in t]
    h = report["http"]
    http = (f"HTTP (streamed) vs direct: {h['http_tokens_per_s']:.2f} vs {h['direct_tokens_per_s']:.2f} tok/s "
            f"({h['http_over_direct']:.3f}x), TTFT {h['http_ttft_s'] * 1e3:.0f} vs {h['direct_ttft_s'] * 1e3:.0f} ms "
            f"({h['http_extra_ttft_s'] * 1e3:+.0f} ms), median of {h['repeats']}")
    c = report["cloud_only"]
    fastest, reproducible = c["fastest"], c["reproducible"]
    yardstick = (f"split (edge serve, direct, {c['split_shapes']} shapes) vs cloud-only on that prompt and link, the cloud "
                 f"on the same cores: {h['direct_tokens_per_s']:.2f} vs {fastest['tokens_per_s']:.2f} tok/s in "
                 f"{fastest['shapes']} shapes, the fastest ({_times(c['direct_over_fastest'])}), and "
                 f"{reproducible['tokens_per_s']:.2f} in {reproducible['shapes']} shapes, the reproducible "
                 f"({_times(c['direct_over_reproducible'])}); cloud-only TTFT {fastest['ttft_s'] * 1e3:.0f} / "
                 f"{reproducible['ttft_s'] * 1e3:.0f} ms, median of {fastest['repeats']}")
    lookup = "behind prompt lookup" if report.get("lookup") else "alone (no prompt lookup)"
    median = f"; kept arm median {statistics.median(speeds):.2f} tok/s over the turns" if speeds else ""
    load = f"\n\n{format_load(report['load'])}" if report.get("load") else ""
    return (f"conversation on {report['scenario']} (split both ways: kept session vs a fresh session per turn; the "
            f"drafter {lookup}, the {report.get('schedule', DEFAULT_SCHEDULE)} schedule{median}):\n{table}\n\n"
            f"{http}\n{yardstick}{load}")


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"
