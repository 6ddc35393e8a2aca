"""The verifier service's limits: one dataclass, its defaults the command line's.

Importable without torch, so ``splitspec-cloud --help`` shows the defaults.
Which verification modes it serves, and to whom, is a limit too: an Open for a
mode not served is refused (``cloud.handshake``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ServiceLimits", "ALL_MODES"]

ALL_MODES = ("greedy", "coupled", "rejection")  # shared.params.Mode values (not imported: no numpy for --help)


@dataclass(frozen=True)
class ServiceLimits:
    max_sessions: int = 64
    max_sessions_per_client: int = 16  # per identity (cloud.identity); parked ones included
    max_streams_per_client: int = 32  # Decode and Generate calls one identity may have open, before its Open too
    # New sessions (Opens, Generates) per identity: a burst, then a rate (each costs a prefill; 0: no bound).
    open_burst_per_client: int = 32
    opens_per_client_s: float = 2.0
    write_timeout_s: float = 10.0  # a verdict or token not taken by the edge this long: its stream is parked (ended: Generate)
    idle_timeout_s: float = 5.0  # an attached stream with no verdict that commits a token this long is parked
    # When the table is full, an attached session that committed fewer tokens than this in the last idle_timeout_s
    # (a keep-alive block now and then) gives its slot to the new one (cloud.session_table; 0: never).
    min_tokens_to_keep_slot: int = 4
    max_draft_len: int = 32  # drafts per block
    max_blocks_in_flight: int = 16  # blocks with drafts a session may have sent and not had answered
    # Empty blocks (a token each, decoded alone: one row) a session may have in flight besides, and one Draft frame
    # may stand for. A cloud stretch over a long, lossy link keeps a round trip and a retransmission's worth in flight
    # (edge.link_windows.cloud_window_for: 43 over satellite), or its cloud waits on the edge after every lost packet.
    max_empty_blocks: int = 64
    session_ttl_s: float = 120.0  # how long a broken session stays resumable; also the idle limit
    max_new_tokens: int = 4096
    max_prompt_tokens: int = 16384
    open_timeout_s: float = 30.0  # the first frame must arrive within this
    refusal_delay_s: float = 1.0  # a stream refused (credentials, grant, room) is told so after this (cloud.refusals)
    max_kv_tokens: int = 262_144  # KV positions all sessions may reserve (prompt + max new tokens each)
    max_kv_mib_per_client: int = 2048  # KV cache one identity's sessions may reserve together, MiB (what positions cost)
    max_batch_rows: int = 256  # rows one target forward packs across sessions (prompts are prefilled in chunks)
    capped_draft_len: int = 2  # a new session's draft length for a client whose rows commit next to nothing (0: no cap)
    max_branches: int = 4  # hedge branches per block, each up to max_draft_len tokens (0: hedging off)
    decode_stale: bool = True  # a stale block gets the next token decoded when nothing usable is pending
    rebase_stale: bool = True  # ... and that forward verifies the drafts sent past the correction (greedy, coupled)
    modes: tuple[str, ...] = ALL_MODES  # verification modes served (temperature 0 is greedy in every mode)
    # Whom rejection mode is served to (cloud.identity.granted): "all", "clients" (every client with a token),
    # client ids, or peer identities ("peer:ipv4:10.0.0.7"). Default: nobody. Its exactness rests on q̃ being the
    # drafter's, which a client that knows its noise can shape: a grant says whom the operator trusts with that.
    rejection_to: tuple[str, ...] = ()
    audit_drafts: bool = True  # rejection mode: refuse drafts not sampled from their q̃ (off: tests' controls only)
    # Rejection mode: the largest q̃ support an Open may ask for. A client that knows its noise can put the token it
    # wants where the noise falls in a uniform q̃ over K tokens and have it accepted with min(1, K p): K bounds that.
    max_draft_top_k: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "modes", tuple(dict.fromkeys(self.modes)))
        object.__setattr__(self, "rejection_to", tuple(dict.fromkeys(self.rejection_to)))
        if any(not grant or grant.isspace() for grant in self.rejection_to):
            raise ValueError("a rejection-mode grant cannot be empty")
        unknown = sorted(set(self.modes) - set(ALL_MODES))
        if unknown or not self.modes:
            raise ValueError(f"modes must be one or more of {', '.join(ALL_MODES)}, got {', '.join(self.modes) or 'none'}")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (bool, tuple)):
                continue
            if not (value >= 0 if f.name in _MAY_BE_ZERO else value > 0):
                raise ValueError(f"{f.name} must be {'>= 0' if f.name in _MAY_BE_ZERO else '> 0'}, got {value}")


_MAY_BE_ZERO = {"max_branches", "capped_draft_len", "min_tokens_to_keep_slot", "opens_per_client_s", "refusal_delay_s"}
