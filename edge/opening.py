"""What an Open asks and what its Opened grants: the edge's side of opening a session, pure.

``OpenRequest`` is what the decode loop asked the connection for;
``open_message`` the Open frame that carries it (a first Open, a reopen on
the committed tokens, a conversation's next turn); ``session_terms`` what
the Opened allows. No I/O: ``edge.grpc_verifier`` sends and receives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edge.endpoint import VerifierEndpoint
from edge.verifier_protocol import LinkHint, SessionTerms
from protos import splitspec_pb2 as pb
from shared import codec
from shared.params import SamplingParams
from shared.wire import sampling_to_proto

__all__ = ["OpenRequest", "asked_draft_len", "open_message", "session_terms"]


@dataclass(frozen=True)
class OpenRequest:
    """What a session was opened for (``VerifierConnection.open``)."""

    params: SamplingParams = SamplingParams()
    prompt_len: int = 0
    max_new_tokens: int = 0
    max_draft_len: int = 0  # drafts per block the edge asks for (the verifier may grant fewer)
    pipelined: bool = False  # more than one block in flight: it takes tokens decoded ahead (Open.takes_ahead)

    @property
    def takes_ahead(self) -> bool:
        """Whether the verifier may decode ahead for the session (``Open.takes_ahead``) and tell those
        tokens at once where they end it (``Open.takes_unasked_end``): pipelined, drafting."""
        return self.pipelined and self.max_draft_len > 0


def asked_draft_len(draft_len: int, window: int, hint: LinkHint | None, reproducible: bool = False) -> int:
    """Drafts per block the Open asks for, which is also what one verdict may carry (0: the session
    drafts nothing). A block after a correction carries a guess for each void block in flight: room for
    ``draft_len + window - 1``. A pipelined session's verifier also decodes ahead over a correction's gap,
    holding those tokens for the next verdict, no more than this limit (``cloud.decode_ahead``). The gap
    is a round trip and then the next block's drafting. Where ``hint`` gives the round trip and the
    cloud's pace alone, the ask also covers the gap at that pace: ceil(round trip / token) + ``draft_len``
    (the drafting counted at one cloud token a draft at most; a drafter slower than that does not pay).
    A fast cloud on a long link needs more tokens ahead than ``draft_len + window - 1`` (measured: 11 held
    against 15 that a 600 ms trip holds of a 41 ms token, docs/history.md). The verifier grants at most
    its own limit, which also bounds what an edge that stops sending gets decoded for it."""
    if draft_len <= 0:
        return 0
    asked = draft_len + window - 1
    token_s = hint.cloud.token_s_for(reproducible) if hint is not None else 0.0
    if window > 1 and token_s > 0 and hint.round_trip_s > 0:
        asked = max(asked, math.ceil(hint.round_trip_s / token_s) + draft_len)
    return asked


def open_message(endpoint: VerifierEndpoint, request: OpenRequest, tokens: Sequence[int], generated: int,
                 **fields) -> pb.Open:
    """An Open for ``request`` carrying ``tokens`` as its prompt, ``generated`` tokens of the budget
    spent (``fields``: a ticket, a committed length, ``extend``)."""
    encoded = codec.encode_tokens(tokens, endpoint.vocab_size)
    return pb.Open(
        vocab_fingerprint=endpoint.fingerprint,
        vocab_size=endpoint.vocab_size,
        sampling=sampling_to_proto(request.params),
        prompt=encoded.data,
        prompt_compressed=encoded.compressed,
        max_new_tokens=request.max_new_tokens - generated,
        max_draft_len=request.max_draft_len,
        first_token=True,
        takes_rebased=True,
        takes_proposals=request.max_draft_len > 0,
        takes_ahead=request.takes_ahead,
        takes_unasked_end=request.takes_ahead,
        **fields,
    )


def session_terms(opened: pb.Opened, request: OpenRequest, early_drafts: int | None = None,
                  head_start: int = 0) -> SessionTerms:
    """The session's terms. ``early_drafts``: the drafts of a block sent before the Opened (None: none
    went); it stands only within the session's draft length (the verifier drops a longer one,
    unanswered) and where the Opened answers the first position, as do the ``head_start`` empty blocks
    sent behind the Open."""
    max_draft_len = min(request.max_draft_len, opened.max_draft_len)
    answers_first = opened.HasField("first_verdict")
    return SessionTerms(
        max_draft_len,
        max(opened.max_blocks_in_flight, 1),  # a verifier that predates pipelining sends no window: one at a time
        answers_first_position=answers_first,
        max_branches=opened.max_branches,
        kept_early_block=early_drafts is not None and early_drafts <= max_draft_len and answers_first,
        row_tile=opened.row_tile,
        head_start=head_start if answers_first else 0,
        max_empty_blocks=max(opened.max_empty_blocks, 1),
    )
