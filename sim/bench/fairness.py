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

Contract. ``run_fairness_bench(...)`` returns the report dict; no argparse,
no printing (flags are in ``sim.commands.bench``).
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any

from edge.drafter import DraftBlock, ModelFreeDrafter, one_hot_block

__all__ = ["GarbageDrafter", "run_fairness_bench"]

_PROMPTS = ["The cat sat", "We have 3 dogs", "It was the best of times", "Hello there", "A dog ran up",
            "She said no", "The sun is red", "I see a big cat"]


class GarbageDrafter(ModelFreeDrafter):
    """Well-formed blocks of uniformly random tokens, always ``n`` long."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        super().__init__(vocab_size)
        self.rng = random.Random(seed)

    def propose_block(self, n: int) -> DraftBlock:
        return one_hot_block([self.rng.randrange(3, self.vocab_size) for _ in range(n)], self._params)


def run_fairness_bench(
    *, honest: int = 4, attackers: int = 2, max_new_tokens: int = 32, draft_len: int = 4,
    max_draft_len: int = 16, max_blocks_in_flight: int = 4, forward_ms: float = 5.0, row_ms: float = 0.2,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """The report; tiny generated models on CPU. ValueError on a bad count."""
    if honest < 1 or attackers < 0 or max_new_tokens < 1 or draft_len < 1:
        raise ValueError("need honest >= 1, attackers >= 0, max_new_tokens >= 1, draft_len >= 1")

    from cloud.engine import TargetEngine
    from cloud.fair_share import CAP_AFTER_DRAFTS
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from edge.llama_drafter import LlamaDrafter
    from shared.params import Mode, SamplingParams
    from sim.bench.capacity import RecordingDrafter, ReplayDrafter
    from sim.fixtures.tiny_models import write_tiny_models
    from sim.inprocess import generate

    params = SamplingParams(mode=Mode.GREEDY, temperature=0.0)
    with tempfile.TemporaryDirectory(prefix="splitspec-fairness-") as tmp:
        paths = write_tiny_models(tmp)
        engine = TargetEngine(paths["target"])
        recorder = RecordingDrafter(LlamaDrafter(paths["drafter_noisy"], n_ctx=2048, n_threads=1))
        try:
            prompts = [recorder.inner.vocab.tokenize(_PROMPTS[i % len(_PROMPTS)] + " " * (i // len(_PROMPTS)))
                       for i in range(honest)]
            want = [generate(engine, recorder.inner, p, params, max_new_tokens=max_new_tokens, draft_len=0).tokens
                    for p in prompts]
            for p in prompts:
                generate(engine, recorder, p, params, max_new_tokens=max_new_tokens, draft_len=draft_len)
        finally:
            recorder.close()
        forward_batch = engine.forward_batch

        def held_forward(items):  # (on the engine thread) a big target's cost, on the tiny one's logits
            out = forward_batch(items)
            time.sleep(1e-3 * (forward_ms + row_ms * sum(item.rows for item in items)))
            return out

        engine.forward_batch = held_forward
        limits = ServiceLimits(max_draft_len=max_draft_len, max_blocks_in_flight=max_blocks_in_flight)

        def connect(server, token: str) -> GrpcVerifier:
            verifier = GrpcVerifier(VerifierEndpoint(server.address, engine.vocab_size, engine.fingerprint,
                                                     auth_token=token))
            verifier.connect()
            return verifier

        def honest_round(server) -> tuple[float, list[list[int]]]:
            got: list = [None] * honest

            def edge(i: int) -> None:
                verifier = connect(server, f"honest-{i}")
                got[i] = run_decode(ReplayDrafter(recorder.blocks, engine.vocab_size), verifier, prompts[i], params,
                                    max_new_tokens=max_new_tokens, draft_len=draft_len).tokens
                verifier.close()

            started = time.perf_counter()
            threads = [threading.Thread(target=edge, args=(i,)) for i in range(honest)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout_s)
            wall = time.perf_counter() - started
            return sum(len(g or []) for g in got) / wall, got

        def attacked(limits: ServiceLimits, fair: bool) -> dict[str, Any]:
            """The honest round on a fresh verifier beside attackers (``fair``: shares and caps as shipped;
            else verifies packed oldest first, no cap: the rule before fair share)."""
            with BackgroundServer(engine, ServerConfig(port=0, limits=limits, auth_token=None)) as server:
                scheduler = server.server.servicer.scheduler
                scheduler.fair = fair
                stop = threading.Event()

                def judged() -> bool:  # (on the engine thread, which alone reads the ledger)
                    return all(scheduler.ledger.drafts_seen(f"token:attacker-{j}") >= CAP_AFTER_DRAFTS
                               for j in range(attackers))

                def attacker(j: int) -> None:
                    while not stop.is_set():  # a verifier per generation: ``run_decode`` closes its stream
                        verifier = connect(server, f"attacker-{j}")
                        try:
                            run_decode(GarbageDrafter(engine.vocab_size, j), verifier, prompts[j % honest], params,
                                       max_new_tokens=max_new_tokens, draft_len=max_draft_len,
                                       window=max_blocks_in_flight, on_tokens=lambda _: stop.is_set())
                        finally:
                            verifier.close()

                threads = [threading.Thread(target=attacker, args=(j,)) for j in range(attackers)]
                for t in threads:
                    t.start()
                # The honest round starts once every attacker has flooded long enough to be judged (the
                # ledger has seen CAP_AFTER_DRAFTS of its drafts): a fixed head start was too short on
                # some machines, and the round then measured attackers the verifier had not yet weighed.
                flooding_since = time.monotonic()
                while not scheduler.submit(judged).result(timeout_s):
                    if time.monotonic() - flooding_since > timeout_s:
                        raise RuntimeError(f"the attackers were not judged within {timeout_s:.0f} s")
                    time.sleep(0.05)
                tok_s, got = honest_round(server)
                rows, owed = dict(scheduler.stats.contended_rows), dict(scheduler.stats.contended_owed)
                stop.set()
                for t in threads:
                    t.join(timeout_s)
                ledger = scheduler.ledger  # (every attacker stopped: read from this thread)
                bad = [c for c in rows if c.startswith("token:attacker-")]
                return {
                    "tok_s": tok_s, "identical": got == want,
                    "row_share": sum(rows[c] for c in bad) / (sum(rows.values()) or 1),
                    "owed_share": sum(owed.get(c, 0.0) for c in bad) / (sum(owed.values()) or 1.0),
                    "contended_rows": sum(rows.values()),
                    "attackers_capped": sum(ledger.capped(f"token:attacker-{j}") for j in range(attackers)),
                    "honest_capped": sum(ledger.capped(f"token:honest-{i}") for i in range(honest)),
                }

        with BackgroundServer(engine, ServerConfig(port=0, limits=limits, auth_token=None)) as server:
            alone_tok_s, alone_got = honest_round(server)
        fair = attacked(limits, fair=True)
        oldest = attacked(replace(limits, capped_draft_len=0), fair=False)
    return {
        "honest": honest,
        "attackers": attackers,
        "max_new_tokens": max_new_tokens,
        "honest_tok_s_alone": alone_tok_s,
        "honest_tok_s_with_attackers": fair["tok_s"],
        "honest_ratio": fair["tok_s"] / alone_tok_s,
        "attacker_row_share": fair["row_share"],
        "fair_row_share": fair["owed_share"],
        "equal_row_share": attackers / (honest + attackers),
        "contended_rows": fair["contended_rows"],
        "identical": alone_got == want and fair["identical"] and oldest["identical"],
        "attackers_capped": fair["attackers_capped"],
        "honest_capped": fair["honest_capped"],
        # The same attack on the rule before fair share and caps (verifies packed oldest first):
        "oldest_first": {"honest_tok_s_with_attackers": oldest["tok_s"], "honest_ratio": oldest["tok_s"] / alone_tok_s,
                         "attacker_row_share": oldest["row_share"]},
    }
