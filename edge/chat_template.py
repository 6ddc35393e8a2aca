"""Chat messages to prompt text, on the edge (the cloud only ever sees token ids).

A GGUF that carries a chat template (``tokenizer.chat_template``) is rendered
with it through llama-cpp-python's Jinja formatter. One that does not (the
default Gemma 3 270M GGUF carries none) uses a named format from
llama-cpp-python's formatters, ``gemma`` by default; ``--chat-format NAME``
picks a named format over the GGUF's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ChatTemplate", "NAMED_FORMATS", "GGUF_TEMPLATE", "chat_template_for"]

GGUF_TEMPLATE = "gguf"  # the model's own template
DEFAULT_NAMED_FORMAT = "gemma"
# Named formats from llama-cpp-python (its registry holds handlers, not formatters: map them here).
NAMED_FORMATS = {
    "gemma": "format_gemma",
    "chatml": "format_chatml",
    "llama-2": "format_llama2",
    "llama-3": "format_llama3",
    "mistral-instruct": "format_mistral_instruct",
    "qwen": "format_qwen",
    "zephyr": "format_zephyr",
}


@dataclass
class ChatTemplate:
    """Renders OpenAI-style messages; ``description`` says which template (for /v1/models)."""

    name: str
    description: str
    _formatter: object
    merge_system: bool = False  # the format has no system role: prepend it to the first user turn

    def render_parts(self, messages: Sequence[dict]) -> tuple[list[tuple[str, bool]], list[str]]:
        """``render``, as parts (text, whether it is the template's own): each message's content is its
        own part (False), so what a user wrote is never read as the template's control tokens."""
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]  # (private-use: never in a template)
        text, stops = self.render([{**m, "content": mark} for m, mark in zip(messages, marks)])
        parts: list[tuple[str, bool]] = []
        rest = text
        for mark, message in zip(marks, messages):
            before, found, after = rest.partition(mark)
            if not found:  # (a template that leaves a message out)
                continue
            parts += [(before, True), (str(message.get("content") or ""), False)]
            rest = after
        return [*parts, (rest, True)], stops

    def render(self, messages: Sequence[dict]) -> tuple[str, list[str]]:
        """(prompt text ending where the assistant's reply begins, stop strings of the format)."""
        messages = [dict(m) for m in messages]
        if self.merge_system and messages and messages[0]["role"] == "system":
            system = messages.pop(0)["content"]
            if messages and messages[0]["role"] == "user":
                messages[0]["content"] = f"{system}\n\n{messages[0]['content']}"
            else:
                messages.insert(0, {"role": "user", "content": system})
        result = self._formatter(messages=messages)
        stop = result.stop if isinstance(result.stop, list) else [result.stop] if result.stop else []
        return result.prompt, [s for s in stop if s]


def chat_template_for(llm, requested: str | None = None) -> ChatTemplate:
    """The template for the model loaded in ``llm`` (a ``llama_cpp.Llama``).

    ``requested``: a name of ``NAMED_FORMATS``, or ``"gguf"`` to insist on the
    model's own template (``ValueError`` when it has none); default: the
    model's own if it has one, else ``gemma``.
    """
    from llama_cpp import llama_chat_format

    template = (llm.metadata or {}).get("tokenizer.chat_template")
    if requested not in (None, GGUF_TEMPLATE) and requested not in NAMED_FORMATS:
        raise ValueError(f"unknown chat format {requested!r}; choose from {', '.join([GGUF_TEMPLATE, *NAMED_FORMATS])}")
    if requested == GGUF_TEMPLATE and not template:
        raise ValueError("the drafter GGUF carries no chat template; pass --chat-format NAME")
    if template and requested in (None, GGUF_TEMPLATE):
        def token_text(token: int) -> str:
            return llm.detokenize([token], special=True).decode("utf-8", "replace") if token >= 0 else ""

        formatter = llama_chat_format.Jinja2ChatFormatter(
            template=template, eos_token=token_text(llm.token_eos()), bos_token=token_text(llm.token_bos()),
            stop_token_ids=[llm.token_eos()],
        )
        return ChatTemplate(GGUF_TEMPLATE, "the GGUF's own chat template (Jinja)", formatter)
    name = requested or DEFAULT_NAMED_FORMAT
    why = "requested" if requested else "the GGUF carries no chat template"
    return ChatTemplate(name, f"llama-cpp-python's '{name}' format ({why})",
                        getattr(llama_chat_format, NAMED_FORMATS[name]), merge_system=name == "gemma")
