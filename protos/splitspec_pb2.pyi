from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_GREEDY: _ClassVar[Mode]
    MODE_COUPLED: _ClassVar[Mode]
    MODE_REJECTION: _ClassVar[Mode]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_EOS: _ClassVar[StopReason]
    STOP_REASON_LENGTH: _ClassVar[StopReason]
MODE_UNSPECIFIED: Mode
MODE_GREEDY: Mode
MODE_COUPLED: Mode
MODE_REJECTION: Mode
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_EOS: StopReason
STOP_REASON_LENGTH: StopReason

class Sampling(_message.Message):
    __slots__ = ("mode", "temperature", "top_k", "top_p", "seed", "draft_top_k", "prob_bits", "reproducible")
    MODE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOP_K_FIELD_NUMBER: _ClassVar[int]
    PROB_BITS_FIELD_NUMBER: _ClassVar[int]
    REPRODUCIBLE_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    temperature: float
    top_k: int
    top_p: float
    seed: int
    draft_top_k: int
    prob_bits: int
    reproducible: bool
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., draft_top_k: _Optional[int] = ..., prob_bits: _Optional[int] = ..., reproducible: _Optional[bool] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("vocab_fingerprint", "vocab_size", "sampling", "prompt", "prompt_compressed", "max_new_tokens", "max_draft_len", "resume_ticket", "committed_length", "first_token", "extend", "takes_rebased", "takes_proposals", "takes_ahead", "takes_unasked_end")
    VOCAB_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_LEN_FIELD_NUMBER: _ClassVar[int]
    RESUME_TICKET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXTEND_FIELD_NUMBER: _ClassVar[int]
    TAKES_REBASED_FIELD_NUMBER: _ClassVar[int]
    TAKES_PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    TAKES_AHEAD_FIELD_NUMBER: _ClassVar[int]
    TAKES_UNASKED_END_FIELD_NUMBER: _ClassVar[int]
    vocab_fingerprint: bytes
    vocab_size: int
    sampling: Sampling
    prompt: bytes
    prompt_compressed: bool
    max_new_tokens: int
    max_draft_len: int
    resume_ticket: bytes
    committed_length: int
    first_token: bool
    extend: bool
    takes_rebased: bool
    takes_proposals: bool
    takes_ahead: bool
    takes_unasked_end: bool
    def __init__(self, vocab_fingerprint: _Optional[bytes] = ..., vocab_size: _Optional[int] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., prompt: _Optional[bytes] = ..., prompt_compressed: _Optional[bool] = ..., max_new_tokens: _Optional[int] = ..., max_draft_len: _Optional[int] = ..., resume_ticket: _Optional[bytes] = ..., committed_length: _Optional[int] = ..., first_token: _Optional[bool] = ..., extend: _Optional[bool] = ..., takes_rebased: _Optional[bool] = ..., takes_proposals: _Optional[bool] = ..., takes_ahead: _Optional[bool] = ..., takes_unasked_end: _Optional[bool] = ...) -> None: ...

class Draft(_message.Message):
    __slots__ = ("epoch", "start_position", "payload", "compressed", "more_follows", "branches", "before_opened", "empty_blocks")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    MORE_FOLLOWS_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    BEFORE_OPENED_FIELD_NUMBER: _ClassVar[int]
    EMPTY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_position: int
    payload: bytes
    compressed: bool
    more_follows: bool
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    before_opened: bool
    empty_blocks: int
    def __init__(self, epoch: _Optional[int] = ..., start_position: _Optional[int] = ..., payload: _Optional[bytes] = ..., compressed: _Optional[bool] = ..., more_follows: _Optional[bool] = ..., branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ..., before_opened: _Optional[bool] = ..., empty_blocks: _Optional[int] = ...) -> None: ...

class Branch(_message.Message):
    __slots__ = ("at", "payload", "compressed")
    AT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    at: int
    payload: bytes
    compressed: bool
    def __init__(self, at: _Optional[int] = ..., payload: _Optional[bytes] = ..., compressed: _Optional[bool] = ...) -> None: ...

class Close(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EdgeFrame(_message.Message):
    __slots__ = ("open", "draft", "close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: Open
    draft: Draft
    close: Close
    def __init__(self, open: _Optional[_Union[Open, _Mapping]] = ..., draft: _Optional[_Union[Draft, _Mapping]] = ..., close: _Optional[_Union[Close, _Mapping]] = ...) -> None: ...

class Opened(_message.Message):
    __slots__ = ("resume_ticket", "vocab_size", "committed_length", "max_draft_len", "forwards", "max_blocks_in_flight", "epoch", "committed_tail", "committed_tail_compressed", "stop_reason", "replica", "first_verdict", "max_branches", "row_tile", "target_fingerprint", "max_empty_blocks")
    RESUME_TICKET_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_LEN_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCKS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TAIL_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TAIL_COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    FIRST_VERDICT_FIELD_NUMBER: _ClassVar[int]
    MAX_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    ROW_TILE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MAX_EMPTY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    resume_ticket: bytes
    vocab_size: int
    committed_length: int
    max_draft_len: int
    forwards: int
    max_blocks_in_flight: int
    epoch: int
    committed_tail: bytes
    committed_tail_compressed: bool
    stop_reason: StopReason
    replica: str
    first_verdict: Verdict
    max_branches: int
    row_tile: int
    target_fingerprint: bytes
    max_empty_blocks: int
    def __init__(self, resume_ticket: _Optional[bytes] = ..., vocab_size: _Optional[int] = ..., committed_length: _Optional[int] = ..., max_draft_len: _Optional[int] = ..., forwards: _Optional[int] = ..., max_blocks_in_flight: _Optional[int] = ..., epoch: _Optional[int] = ..., committed_tail: _Optional[bytes] = ..., committed_tail_compressed: _Optional[bool] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., replica: _Optional[str] = ..., first_verdict: _Optional[_Union[Verdict, _Mapping]] = ..., max_branches: _Optional[int] = ..., row_tile: _Optional[int] = ..., target_fingerprint: _Optional[bytes] = ..., max_empty_blocks: _Optional[int] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("epoch", "start_position", "accepted", "token", "bonus", "done", "stop_reason", "server_us", "forwards", "branch", "branch_accepted", "stale", "rebased", "rebased_verified", "forward_us", "draft_limit", "forward_rows", "ahead", "unasked")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    BONUS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    SERVER_US_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    BRANCH_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    REBASED_FIELD_NUMBER: _ClassVar[int]
    REBASED_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    FORWARD_US_FIELD_NUMBER: _ClassVar[int]
    DRAFT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ROWS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    UNASKED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_position: int
    accepted: int
    token: int
    bonus: bool
    done: bool
    stop_reason: StopReason
    server_us: int
    forwards: int
    branch: int
    branch_accepted: int
    stale: bool
    rebased: _containers.RepeatedScalarFieldContainer[int]
    rebased_verified: int
    forward_us: int
    draft_limit: int
    forward_rows: int
    ahead: int
    unasked: bool
    def __init__(self, epoch: _Optional[int] = ..., start_position: _Optional[int] = ..., accepted: _Optional[int] = ..., token: _Optional[int] = ..., bonus: _Optional[bool] = ..., done: _Optional[bool] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., server_us: _Optional[int] = ..., forwards: _Optional[int] = ..., branch: _Optional[int] = ..., branch_accepted: _Optional[int] = ..., stale: _Optional[bool] = ..., rebased: _Optional[_Iterable[int]] = ..., rebased_verified: _Optional[int] = ..., forward_us: _Optional[int] = ..., draft_limit: _Optional[int] = ..., forward_rows: _Optional[int] = ..., ahead: _Optional[int] = ..., unasked: _Optional[bool] = ...) -> None: ...

class CloudFrame(_message.Message):
    __slots__ = ("opened", "verdict")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    opened: Opened
    verdict: Verdict
    def __init__(self, opened: _Optional[_Union[Opened, _Mapping]] = ..., verdict: _Optional[_Union[Verdict, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("vocab_fingerprint", "vocab_size", "sampling", "prompt", "prompt_compressed", "max_new_tokens")
    VOCAB_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    vocab_fingerprint: bytes
    vocab_size: int
    sampling: Sampling
    prompt: bytes
    prompt_compressed: bool
    max_new_tokens: int
    def __init__(self, vocab_fingerprint: _Optional[bytes] = ..., vocab_size: _Optional[int] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., prompt: _Optional[bytes] = ..., prompt_compressed: _Optional[bool] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("tokens", "compressed", "done", "stop_reason", "server_us", "forwards", "target_fingerprint")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    SERVER_US_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    tokens: bytes
    compressed: bool
    done: bool
    stop_reason: StopReason
    server_us: int
    forwards: int
    target_fingerprint: bytes
    def __init__(self, tokens: _Optional[bytes] = ..., compressed: _Optional[bool] = ..., done: _Optional[bool] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., server_us: _Optional[int] = ..., forwards: _Optional[int] = ..., target_fingerprint: _Optional[bytes] = ...) -> None: ...
