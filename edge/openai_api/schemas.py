"""The OpenAI API's request bodies, and the validation that turns one into a ``Job``.

Lenient where a field changes nothing (unknown fields are accepted as clients send them), a
clear 400 (``ApiError``) for what the device cannot honour: n > 1, penalties, logit bias,
logprobs, tools, non-text content, echo and suffix.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from edge.openai_api.errors import ApiError
from edge.serving import Job
from shared.params import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, Mode, SamplingParams

__all__ = ["DEFAULT_MAX_TOKENS", "ChatMessage", "ChatRequest", "CompletionRequest", "SamplingRequest", "job_for"]

DEFAULT_MAX_TOKENS = 256
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")  # SamplingParams' refusals start with the field's name


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields that change nothing are accepted as clients send them


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(part.type != "text" for part in self.content):
            raise ApiError(400, "only text content parts are supported", "messages")
        return "".join(part.text or "" for part in self.content)


class StreamOptions(_Lenient):
    include_usage: bool = False


class SamplingRequest(_Lenient):
    """The fields chat and text completions share."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, lt=2**32)  # an extension clients of llama-server and vLLM send (uint32)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        """A clear 400 for what we cannot honour (a value that changes nothing passes)."""
        if self.n != 1:
            raise ApiError(400, "n > 1 is not supported: one completion per request", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported (only 0)", name)
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported", "logit_bias")
        if self.logprobs:
            raise ApiError(400, "logprobs are not supported", "logprobs")
        if self.best_of not in (None, 1):
            raise ApiError(400, "best_of is not supported", "best_of")

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ApiError(400, "at most 4 stop sequences", "stop")
        return stops

    def sampling(self) -> SamplingParams:
        """The request's sampling; temperature 0 is greedy, and without a seed one is drawn. A request with a
        ``seed`` (OpenAI's determinism knob) is reproducible: the same seed gives the same tokens whatever
        else the verifier batches."""
        temperature = DEFAULT_TEMPERATURE if self.temperature is None else self.temperature
        try:
            return SamplingParams(
                mode=Mode.GREEDY if temperature == 0 else Mode.COUPLED,
                temperature=temperature,
                top_k=DEFAULT_TOP_K if self.top_k is None else self.top_k,
                top_p=DEFAULT_TOP_P if self.top_p is None else self.top_p,
                seed=secrets.randbelow(2**63) if self.seed is None else self.seed,
                reproducible=self.seed is not None,
            )
        except ValueError as exc:  # a value inside the schema's range the sampler cannot take (a degenerate one)
            param = next((name for name in _SAMPLING_FIELDS if str(exc).startswith(name)), None)
            raise ApiError(400, str(exc), param) from exc

    @property
    def include_usage(self) -> bool:
        """A stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tools or self.functions:
            raise ApiError(400, "tools and functions are not supported", "tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ApiError(400, "only the text response format is supported", "response_format")


class CompletionRequest(SamplingRequest):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None

    def text(self) -> str:
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise ApiError(400, "one prompt per request", "prompt")
            return self.prompt[0]
        return self.prompt

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo or self.suffix:
            raise ApiError(400, "echo and suffix are not supported", "echo" if self.echo else "suffix")


def job_for(body: SamplingRequest, prompt: list[int], stops: list[str], max_tokens: int | None,
            context_size: int) -> Job:
    """The generation ``body`` asks for, or a 400: unsupported fields, or a prompt plus ``max_tokens``
    past ``context_size`` (without ``max_tokens``: up to ``DEFAULT_MAX_TOKENS`` that fit)."""
    body.refuse_unsupported()
    room = context_size - len(prompt) - 1
    if room < 1:
        raise ApiError(400, f"the prompt has {len(prompt)} tokens; the context holds {context_size}",
                       "messages", "context_length_exceeded")
    wanted = max_tokens or min(DEFAULT_MAX_TOKENS, room)
    if wanted > room:
        raise ApiError(400, f"{len(prompt)} prompt tokens plus max_tokens {wanted} exceed the context of "
                       f"{context_size}", "max_tokens", "context_length_exceeded")
    return Job(prompt, body.sampling(), wanted, stops)
