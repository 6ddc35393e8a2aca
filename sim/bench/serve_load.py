"""``bench serve``'s load: ``edge serve`` over HTTP under 1, 2, 4, 8 concurrent conversations.

``edge serve`` runs one generation at a time on the device's drafter and queues the rest
(``edge.openai_api.state.DrafterTurns``), as llama-server does with one slot. What a user of the
local server sees as conversations pile up is the wait: each level here runs that many
conversations at once, each ``turns`` user turns (its own questions, every reply sent back as
the assistant's turn, greedy), every request streamed. Per level: the aggregate tokens/s, each
request's time to first token (its wait included) and end-to-end latency, median and worst, and
the requests refused (a status other than 200).

Contract: ``openai_server(service)`` serves ``service``'s OpenAI API on a loopback port for the
``with`` block and yields its base URL; ``load_levels(url, levels, ...)`` returns one row per level.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["CONVERSATIONS", "LEVELS", "format_load", "load_levels", "openai_server"]

LEVELS = (1, 2, 4, 8)
# Each conversation's user turns: its opening question, then a follow-up.
CONVERSATIONS = [
    ("Why is the sky blue?", "And why are sunsets red?"),
    ("How does a bicycle stay upright?", "Does it work without a rider?"),
    ("What is a prime number?", "Is 91 one?"),
    ("Explain what a compiler does.", "How is an interpreter different?"),
    ("Why do cats purr?", "Do big cats purr too?"),
    ("What causes the tides?", "Why are there two a day?"),
    ("How do vaccines work?", "Why are some given twice?"),
    ("What is photosynthesis?", "Why are leaves green, then?"),
]


@contextmanager
def openai_server(service, max_waiting: int = 8) -> Iterator[str]:
    """``service``'s OpenAI API (uvicorn) on 127.0.0.1 for the block: its base URL (``http://…/v1``)."""
    import uvicorn

    from edge.openai_server import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(service, max_waiting=max_waiting), host="127.0.0.1", port=0,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


def _conversation(url: str, questions: Sequence[str], max_tokens: int, requests: list[dict]) -> None:
    """One conversation's turns, streamed one after another; each request's figures go to ``requests``."""
    import httpx

    messages: list[dict] = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        started, first, tokens, text = time.perf_counter(), None, 0, []
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=600) as response:
            if response.status_code != 200:
                requests.append({"status": response.status_code})
                return
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    piece = choice.get("delta", {}).get("content")
                    if piece:
                        first = first or time.perf_counter()
                        text.append(piece)
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        ended = time.perf_counter()
        requests.append({"status": 200, "tokens": tokens, "ttft_s": (first or ended) - started,
                         "latency_s": ended - started})
        messages.append({"role": "assistant", "content": "".join(text)})


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "max": max(values)} if values else {"median": None, "max": None}


def load_levels(url: str, levels: Sequence[int] = LEVELS, max_tokens: int = 32, progress=lambda line: None) -> list[dict]:
    """Per level, that many conversations at once (each ``CONVERSATIONS``' turns, ``max_tokens`` a reply):
    aggregate tokens/s over the level's wall time, TTFT and latency (median, max) over its requests,
    how many were refused."""
    if not levels or min(levels) < 1 or max(levels) > len(CONVERSATIONS):
        raise ValueError(f"concurrency levels must be in [1, {len(CONVERSATIONS)}], got {list(levels)}")
    rows = []
    for level in levels:
        requests: list[dict] = []
        threads = [threading.Thread(target=_conversation, args=(url, CONVERSATIONS[i], max_tokens, requests))
                   for i in range(level)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        served = [r for r in requests if r["status"] == 200]
        row = {"conversations": level, "requests": len(requests), "refused": len(requests) - len(served),
               "tokens": sum(r["tokens"] for r in served), "wall_s": wall,
               "tokens_per_s": sum(r["tokens"] for r in served) / wall,
               "ttft_s": _spread([r["ttft_s"] for r in served]), "latency_s": _spread([r["latency_s"] for r in served])}
        rows.append(row)
        progress(f"{level} conversations: {row['tokens_per_s']:.2f} tok/s together, TTFT median "
                 f"{row['ttft_s']['median']:.2f}s (worst {row['ttft_s']['max']:.2f}s), {row['refused']} refused")
    return rows


def format_load(rows: list[dict]) -> str:
    from tabulate import tabulate

    table = [[r["conversations"], r["requests"], r["refused"], f"{r['tokens_per_s']:.2f}",
              f"{r['ttft_s']['median']:.2f}", f"{r['ttft_s']['max']:.2f}", f"{r['latency_s']['median']:.2f}",
              f"{r['latency_s']['max']:.2f}"] for r in rows]
    return ("edge serve under concurrent conversations (one generation at a time on the drafter, the rest wait; "
            "TTFT includes the wait):\n" + tabulate(table, headers=["conversations", "requests", "refused",
                                                                    "tok/s together", "TTFT median s", "TTFT worst s",
                                                                    "latency median s", "latency worst s"]))
