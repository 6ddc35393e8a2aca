"""The OpenAI API's response bodies: whole completions, stream chunks, usage (with splitspec's
counters under ``usage.splitspec``), and the server-sent event that carries a chunk.

Beside the usage, the fields the field's tools read (``shared.spec_metrics``): vLLM's per-request
``metrics.speculative_decoding`` and llama-server's ``timings``, on a whole completion and on the
final usage chunk of a stream.

Pure: an ``Outcome`` and text in, dicts and strings out.
"""

from __future__ import annotations

import json
import time

from edge.serving import Outcome
from shared.spec_metrics import llama_timings, vllm_request_metrics

__all__ = ["SERVED_BY_HEADER", "Shape", "speculation_fields", "sse", "usage"]

SERVED_BY_HEADER = "X-Splitspec-Served-By"


class Shape:
    """OpenAI response bodies for one request (chat or text completion)."""

    def __init__(self, ident: str, model: str, chat: bool) -> None:
        self.ident, self.model, self.chat, self.created = ident, model, chat, int(time.time())

    def _head(self, kind: str) -> dict:
        return {"id": self.ident, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def whole(self, text: str, outcome: Outcome) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": outcome.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": outcome.finish_reason}
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [choice], "usage": usage(outcome), **speculation_fields(outcome),
                "splitspec_served_by": outcome.served_by}

    def chunk(self, delta, finish_reason: str | None = None) -> dict:
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, outcome: Outcome) -> dict:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": usage(outcome), **speculation_fields(outcome),
                "splitspec_served_by": outcome.served_by}


def usage(outcome: Outcome) -> dict:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": len(outcome.tokens),
        "total_tokens": outcome.prompt_tokens + len(outcome.tokens),
        "splitspec": {
            "served_by": outcome.served_by,
            "acceptance_length": round(outcome.acceptance_length, 4),
            "bytes_up": outcome.bytes_up,
            "bytes_down": outcome.bytes_down,
            "cloud_forwards": outcome.cloud_forwards,
            "prompt_tokens_sent": outcome.prompt_tokens_sent,
        },
    }


def speculation_fields(outcome: Outcome) -> dict:
    """vLLM's ``metrics.speculative_decoding`` and llama-server's ``timings`` for ``outcome``."""
    stats = outcome.decode
    predicted_s = max(outcome.wall_s - outcome.ttft_s, 0.0)
    return {
        "metrics": {"speculative_decoding": vllm_request_metrics(stats.accept_lengths, stats.drafted)},
        "timings": llama_timings(prompt_tokens=outcome.prompt_tokens, prompt_s=outcome.ttft_s,
                                 predicted_tokens=max(len(outcome.tokens) - 1, 0), predicted_s=predicted_s,
                                 drafted=stats.drafted, accepted=stats.accepted),
    }


def sse(payload: dict) -> str:
    """One server-sent event: a ``data:`` line of compact JSON."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
