"""``splitspec bench fairness``: honest edges beside clients that draft garbage at the largest D and window.

One in-process verifier on loopback. ``honest`` edges (each its own bearer
token) replay a real drafter's blocks (recorded in process first, greedy, so
the drafter's CPU time is not in the timed runs) through ``run_decode`` over
``GrpcVerifier``: alone, then beside ``attackers`` edges (their own tokens)
that loop ``run_decode`` with random drafts at the verifier's largest draft
length and window (the honest round starts once the verifier has judged each
of them: ``CAP_AFTER_DRAFTS`` drafts verified) until the honest edges are done, on a fresh verifier as
shipped (fair share, caps) and on one that packs verifies oldest first with
no cap (the rule before fair share: ``oldest_first``). Reports the honest
tokens/s each way, the attackers' share of verify rows in forwards where
both waited against their unweighted max-min share
(``SchedulerStats.contended_*``) and against an equal share per client, and
whether every honest output equals target-only decoding. The tiny target's forwards take about a millisecond,
so nothing would queue: each forward is held ``forward_ms`` plus
``row_ms`` per row, as a big target's would be (rows cost time, which is
what the attackers exploit).

Contract. ``run_fairness_bench(FairnessBench(...))`` returns the report dict; no argparse,
no printing (flags are in ``sim.commands.bench.fairness``).
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from edge.drafter import DraftBlock, ModelFreeDrafter, one_hot_block
from edge.schedule import SpecConfig

__all__ = ["FairnessBench", "GarbageDrafter", "run_fairness_bench"]

_PROMPTS = ["The cat sat", "We have 3 dogs", "It was the best of times", "Hello there", "A dog ran up",
            "She said no", "The sun is red", "I see a big cat"]


class GarbageDrafter(ModelFreeDrafter):
    """Well-formed blocks of uniformly random tokens, always ``n`` long."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        super().__init__(vocab_size)
        self.rng = random.Random(seed)

    def propose_block(self, n: int) -> DraftBlock:
        return one_hot_block([self.rng.randrange(3, self.vocab_size) for _ in range(n)], self._params)


@dataclass(frozen=True)
class FairnessBench:
    """What ``run_fairness_bench`` runs (``splitspec bench fairness``'s flags)."""

    honest: int = 4  # honest edges
    attackers: int = 2  # garbage-drafting edges
    max_new_tokens: int = 32  # per honest edge
    draft_len: int = 4  # the honest edges' D
    max_draft_len: int = 16  # the verifier's largest D: the attackers'
    max_blocks_in_flight: int = 4  # the verifier's window: the attackers'
    forward_ms: float = 5.0  # each forward held this long, as a big target's
    row_ms: float = 0.2  # ... plus this per row
    timeout_s: float = 120.0

    def checked(self) -> FairnessBench:
        if self.honest < 1 or self.attackers < 0 or self.max_new_tokens < 1 or self.draft_len < 1:
            raise ValueError("need honest >= 1, attackers >= 0, max_new_tokens >= 1, draft_len >= 1")
        return self


def run_fairness_bench(bench: FairnessBench) -> dict[str, Any]:
    """The report; tiny generated models on CPU. ValueError on a bad count."""
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig

    bench = bench.checked()
    with tempfile.TemporaryDirectory(prefix="splitspec-fairness-") as tmp:
        run = _FairnessRun(bench, tmp)
        limits = ServiceLimits(max_draft_len=bench.max_draft_len, max_blocks_in_flight=bench.max_blocks_in_flight)
        with BackgroundServer(run.engine, ServerConfig(port=0, limits=limits, credentials=run.credentials)) as server:
            alone_tok_s, alone_got = run.honest_round(server)
        fair = run.attacked(limits, fair=True)
        oldest = run.attacked(replace(limits, capped_draft_len=0), fair=False)
    return {
        "honest": bench.honest,
        "attackers": bench.attackers,
        "max_new_tokens": bench.max_new_tokens,
        "honest_tok_s_alone": alone_tok_s,
        "honest_tok_s_with_attackers": fair["tok_s"],
        "honest_ratio": fair["tok_s"] / alone_tok_s,
        "attacker_row_share": fair["row_share"],
        "fair_row_share": fair["owed_share"],
        "equal_row_share": bench.attackers / (bench.honest + bench.attackers),
        "contended_rows": fair["contended_rows"],
        "identical": alone_got == run.want and fair["identical"] and oldest["identical"],
        "attackers_capped": fair["attackers_capped"],
        "honest_capped": fair["honest_capped"],
        # The same attack on the rule before fair share and caps (verifies packed oldest first):
        "oldest_first": {"honest_tok_s_with_attackers": oldest["tok_s"], "honest_ratio": oldest["tok_s"] / alone_tok_s,
                         "attacker_row_share": oldest["row_share"]},
    }


class _FairnessRun:
    """The tiny target (its forwards held as a big one's), the honest edges' recorded blocks and
    target-only outputs, and the rounds run against verifiers on loopback."""

    def __init__(self, bench: FairnessBench, tmp: str) -> None:
        from cloud.engine import TargetEngine
        from cloud.identity import Credentials
        from edge.llama_drafter import LlamaDrafter
        from shared.params import Mode, SamplingParams
        from sim.bench.bench_sessions import RecordingDrafter
        from sim.fixtures.tiny_models import write_tiny_models
        from sim.inprocess import generate

        self.bench = bench
        # Every edge its own client (its token is its name: loopback only), each a share of the verifier.
        names = [f"honest-{i}" for i in range(bench.honest)] + [f"attacker-{j}" for j in range(bench.attackers)]
        self.credentials = Credentials({name: name for name in names})
        self.params = SamplingParams(mode=Mode.GREEDY, temperature=0.0)
        paths = write_tiny_models(tmp)
        self.engine = TargetEngine(paths["target"])
        recorder = RecordingDrafter(LlamaDrafter(paths["drafter_noisy"], n_ctx=2048, n_threads=1))
        try:
            self.prompts = [recorder.inner.vocab.tokenize(_PROMPTS[i % len(_PROMPTS)] + " " * (i // len(_PROMPTS)))
                            for i in range(bench.honest)]
            self.want = [generate(self.engine, recorder.inner, p, self.params, max_new_tokens=bench.max_new_tokens,
                                  spec=SpecConfig(0)).tokens for p in self.prompts]
            for p in self.prompts:
                generate(self.engine, recorder, p, self.params, max_new_tokens=bench.max_new_tokens,
                         spec=SpecConfig(bench.draft_len))
        finally:
            recorder.close()
        self.blocks = recorder.blocks
        forward_batch = self.engine.forward_batch

        def held_forward(items):  # (on the engine thread) a big target's cost, on the tiny one's logits
            out = forward_batch(items)
            time.sleep(1e-3 * (bench.forward_ms + bench.row_ms * sum(item.rows for item in items)))
            return out

        self.engine.forward_batch = held_forward

    def connect(self, server, token: str):
        from edge.endpoint import VerifierEndpoint
        from edge.grpc_verifier import GrpcVerifier

        verifier = GrpcVerifier(VerifierEndpoint(server.address, self.engine.vocab_size, self.engine.fingerprint,
                                                 auth_token=token))
        verifier.connect()
        return verifier

    def honest_round(self, server) -> tuple[float, list[list[int]]]:
        """Every honest edge at once, replaying its recorded blocks: (their tokens/s together, outputs)."""
        from edge.decode_loop import run_decode
        from sim.bench.bench_sessions import ReplayDrafter

        bench, got = self.bench, [None] * self.bench.honest

        def edge(i: int) -> None:
            verifier = self.connect(server, f"honest-{i}")
            got[i] = run_decode(ReplayDrafter(self.blocks, self.engine.vocab_size), verifier, self.prompts[i],
                                self.params, max_new_tokens=bench.max_new_tokens,
                                spec=SpecConfig(bench.draft_len)).tokens
            verifier.close()

        started = time.perf_counter()
        threads = [threading.Thread(target=edge, args=(i,)) for i in range(bench.honest)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(bench.timeout_s)
        wall = time.perf_counter() - started
        return sum(len(g or []) for g in got) / wall, got

    def attack(self, server, j: int, stop: threading.Event) -> None:
        """Attacker ``j``: garbage at the largest D and window until ``stop`` (a verifier per generation:
        ``run_decode`` closes its stream)."""
        from edge.decode_loop import run_decode

        bench = self.bench
        while not stop.is_set():
            verifier = self.connect(server, f"attacker-{j}")
            try:
                run_decode(GarbageDrafter(self.engine.vocab_size, j), verifier, self.prompts[j % bench.honest],
                           self.params, max_new_tokens=bench.max_new_tokens,
                           spec=SpecConfig(bench.max_draft_len, window=bench.max_blocks_in_flight),
                           on_tokens=lambda _: stop.is_set())
            finally:
                verifier.close()

    def attacked(self, limits, fair: bool) -> dict[str, Any]:
        """The honest round on a fresh verifier beside attackers (``fair``: shares and caps as shipped;
        else verifies packed oldest first, no cap: the rule before fair share)."""
        from cloud.server import BackgroundServer, ServerConfig

        bench = self.bench
        with BackgroundServer(self.engine, ServerConfig(port=0, limits=limits, credentials=self.credentials)) as server:
            scheduler = server.server.servicer.scheduler
            scheduler.fair = fair
            stop = threading.Event()
            threads = [threading.Thread(target=self.attack, args=(server, j, stop)) for j in range(bench.attackers)]
            for t in threads:
                t.start()
            self._wait_until_judged(scheduler)
            tok_s, got = self.honest_round(server)
            rows, owed = dict(scheduler.stats.contended_rows), dict(scheduler.stats.contended_owed)
            stop.set()
            for t in threads:
                t.join(bench.timeout_s)
            ledger = scheduler.ledger  # (every attacker stopped: read from this thread)
            bad = [c for c in rows if c.startswith("client:attacker-")]
            return {
                "tok_s": tok_s, "identical": got == self.want,
                "row_share": sum(rows[c] for c in bad) / (sum(rows.values()) or 1),
                "owed_share": sum(owed.get(c, 0.0) for c in bad) / (sum(owed.values()) or 1.0),
                "contended_rows": sum(rows.values()),
                "attackers_capped": sum(ledger.capped(f"client:attacker-{j}") for j in range(bench.attackers)),
                "honest_capped": sum(ledger.capped(f"client:honest-{i}") for i in range(bench.honest)),
            }

    def _wait_until_judged(self, scheduler) -> None:
        """Until every attacker has flooded long enough to be judged (the ledger has seen
        ``CAP_AFTER_DRAFTS`` of its drafts): a fixed head start was too short on some machines, and the
        round then measured attackers the verifier had not yet weighed."""
        from cloud.fair_share import CAP_AFTER_DRAFTS

        bench = self.bench

        def judged() -> bool:  # (on the engine thread, which alone reads the ledger)
            return all(scheduler.ledger.drafts_seen(f"client:attacker-{j}") >= CAP_AFTER_DRAFTS
                       for j in range(bench.attackers))

        flooding_since = time.monotonic()
        while not scheduler.submit(judged).result(bench.timeout_s):
            if time.monotonic() - flooding_since > bench.timeout_s:
                raise RuntimeError(f"the attackers were not judged within {bench.timeout_s:.0f} s")
            time.sleep(0.05)
