"""A conversation's cloud session, kept between turns so each turn uploads only what is new.

After a turn the cloud session is left parked (``GrpcVerifier(keep_session=True)``)
holding every token of the conversation so far. The next turn's prompt is
re-rendered by the chat template from the whole history, so it is never
assumed to extend the old tokens: the verifier keeps the longest prefix the
two share and sends the rest (``Open.extend``). A session the cloud no longer
has (TTL, restart, another replica) is reopened on the whole prompt; the
output is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.verifier_protocol import ServedBy

__all__ = ["Conversation"]


@dataclass
class Conversation:
    """State of one conversation: its session's ticket and the tokens the session holds."""

    ticket: bytes = b""
    tokens: list[int] = field(default_factory=list)  # prompt and replies, as the cloud session holds them
    replica: str = ""  # the verifier replica holding the session (a proxy routes the next turn there)
    turns: int = 0

    def verifier(self, endpoint: VerifierEndpoint, **kwargs) -> GrpcVerifier:
        """A verifier for the next turn: it continues the session if there is one, and keeps it after."""
        continue_from = (self.ticket, self.tokens) if self.ticket else None
        link = GrpcVerifier(endpoint, keep_session=True, continue_from=continue_from, **kwargs)
        link.served_by = ServedBy(self.replica if self.ticket else "")
        return link

    def record(self, verifier: GrpcVerifier, prompt: Sequence[int], generated: Sequence[int]) -> None:
        """The turn finished: its session now holds ``prompt`` + ``generated``."""
        self.ticket, self.replica = verifier.resume_ticket, verifier.served_by.replica
        self.tokens = [*prompt, *generated]
        self.turns += 1

    def forget(self) -> None:
        """The turn failed: the next one opens a new session."""
        self.ticket, self.tokens, self.replica = b"", [], ""
