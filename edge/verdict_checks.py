"""What the edge refuses of a verdict: the checks that come before anything is taken from it.

``check_verdict_tokens`` reads the message as it arrived (token ids, rebased
drafts); ``check_answers`` whether it answers the oldest block in flight, as
the decode loop sent it. Both raise; neither commits anything. Pure: no I/O.
"""

from __future__ import annotations

from typing import Protocol

from edge.drafter import DraftBlock
from edge.verifier_protocol import ProtocolError, VerifierError
from protos import splitspec_pb2 as pb
from shared.verdict import Verdict

__all__ = ["check_verdict_tokens", "check_answers", "answers_branch", "skips"]


class Sent(Protocol):
    """What the checks read of a block in flight (``edge.decode_loop``'s record)."""

    epoch: int
    start_position: int
    block: DraftBlock
    more_follows: bool


def check_verdict_tokens(message: pb.Verdict, vocab_size: int, max_draft_len: int, takes_unasked: bool) -> None:
    """Refuse (``VerifierError``) a verdict's token ids before anything is taken from it: ids outside the
    vocabulary, more rebased drafts than it verified or than a block may hold (``max_draft_len``),
    rebased drafts with neither a token after them nor the end, more tokens decoded ahead than it commits;
    and a verdict no block asked for where the session does not take one (``takes_unasked``: the Open's
    ``takes_unasked_end``). Whether it answers the block sent is ``check_answers``' question."""
    if message.unasked and not takes_unasked:
        raise VerifierError("a verdict no block asked for, from a verifier this session did not allow it")
    rebased = message.rebased
    if len(rebased) > message.rebased_verified or message.rebased_verified > max_draft_len:
        raise VerifierError(f"malformed verdict from the cloud: {len(rebased)} rebased drafts of "
                            f"{message.rebased_verified} verified, at most {max_draft_len}")
    if rebased and not message.HasField("token") and not message.done:
        raise VerifierError("malformed verdict from the cloud: rebased drafts with no token after them")
    if message.ahead > message.accepted + len(rebased) + message.HasField("token"):
        raise VerifierError(f"malformed verdict from the cloud: {message.ahead} tokens decoded ahead of fewer committed")
    if any(token >= vocab_size for token in rebased) or message.token >= vocab_size:
        raise VerifierError(f"malformed verdict from the cloud: a token id outside the vocabulary of {vocab_size}")


def check_answers(verdict: Verdict, sent: Sent, skip: int, drafts: list[int],
                   branches: tuple[tuple[int, list[int]], ...], generated: list[int], prompt_len: int) -> None:
    """Raise ``ProtocolError`` unless ``verdict`` answers ``sent``, the oldest block in flight (for an
    unasked verdict, ``Verdict.unasked``: an empty block at the committed end, as a final stale verdict)."""
    committed_end = prompt_len + len(generated)
    if (
        verdict.epoch != sent.epoch
        or verdict.start_position != committed_end
        or (not verdict.stale and sent.block.tokens
            and not skips(sent, skip, generated[sent.start_position - prompt_len:]))
        or (verdict.stale and (verdict.accepted or verdict.branch))
        or (verdict.rebased and not verdict.stale and sent.block.tokens)  # (an empty block's: the cloud's proposals)
        or verdict.accepted > len(drafts)
        or verdict.ahead > (verdict.accepted if sent.block.tokens and not verdict.stale else verdict.committed_count)
        or (verdict.is_deferred and not sent.more_follows)
        or (verdict.unasked and not (verdict.done and verdict.stale))
        or not answers_branch(verdict, branches)
    ):
        raise ProtocolError(
            f"verdict for epoch {verdict.epoch} position {verdict.start_position} ({verdict.accepted} accepted) "
            f"does not answer the block sent at epoch {sent.epoch} position {sent.start_position} "
            f"with {len(generated)} tokens committed"
        )


def answers_branch(verdict: Verdict, branches: tuple[tuple[int, list[int]], ...]) -> bool:
    """Whether a verdict's branch fields fit the block's ``branches`` (indexed from the verdict's
    start): a branch it had, hung on the draft the verdict rejected, no more of it accepted than it held."""
    if not verdict.branch:
        return verdict.branch_accepted == 0
    if verdict.branch > len(branches):
        return False
    at, tokens = branches[verdict.branch - 1]
    return at == verdict.accepted and verdict.branch_accepted < len(tokens)


def skips(sent: Sent, skip: int, committed_since: list[int]) -> bool:
    """Whether a verifier may skip the first ``skip`` drafts of ``sent``: the tokens committed
    since its start position are exactly those drafts."""
    return 0 <= skip <= len(sent.block.tokens) and sent.block.tokens[:skip] == committed_since
