"""The GPU check's service sections: the verifier service on the device, over loopback gRPC, against target-only.

``service`` runs the tiny target (its tokenizer, text prompts, prompt-lookup drafts); ``service_8b`` the
random-weight 8B shape (prompts of token ids; drafts of target-only's own answer with every fifth token
wrong, since a random model's output gives prompt lookup nothing to copy). Both run reproducible greedy
and coupled sessions at once through the real scheduler (``serve_sessions``), so the device's canonical
shapes are checked under real batching.

Contract. ``serve_sessions(engine, prompts, tokens, lookup)`` returns the section's dict; ``service`` and
``service_8b`` take the check and its deadline as every section does (``sim.bench.gpu_check``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sim.bench.gpu_models import build_engine, release_memory

if TYPE_CHECKING:
    from sim.bench.gpu_plan import Deadline, GpuCheck

__all__ = ["serve_sessions", "service", "service_8b"]


def _tiny_target(check: GpuCheck, folder: str) -> str:
    if check.tiny_target:
        return check.tiny_target
    from sim.fixtures.tiny_models import write_tiny_models

    return write_tiny_models(folder, seed=0)["target"]


def _answer_drafter(vocab_size: int, prompt: list[int], answer: list[int], wrong_every: int = 5):
    """A drafter that proposes target-only's own continuation with every ``wrong_every``-th token wrong:
    blocks accepted in part, rejected, corrected, as a drafter fit for a random-weight target would be
    (prompt lookup finds nothing to draft in such a target's output)."""
    from edge.drafter import ModelFreeDrafter, one_hot_block

    class AnswerDrafter(ModelFreeDrafter):
        def propose_block(self, n: int):
            at = len(self._spec.tokens) - len(prompt)
            tokens = [answer[i] if (i + 1) % wrong_every else (answer[i] + 1) % vocab_size
                      for i in range(max(at, 0), min(at + n, len(answer)))]
            return one_hot_block(tokens, self._params)

    return AnswerDrafter(vocab_size)


def serve_sessions(engine, prompts: list[list[int]], tokens: int, lookup: bool = True) -> dict[str, Any]:
    """Reproducible greedy and coupled sessions on ``engine`` behind a loopback gRPC server: each alone
    cloud-only (target-only: a token a forward), then all at once split and cloud-only; how many of each
    were identical to target-only. The split drafts by prompt lookup (``lookup``), else target-only's
    answer with every fifth token wrong (``_answer_drafter``)."""
    from concurrent.futures import ThreadPoolExecutor

    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig
    from edge.cloud_only import cloud_only_generate
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from edge.ngram_drafter import NgramDrafter
    from edge.schedule import SpecConfig
    from shared.params import Mode, SamplingParams

    out: dict[str, Any] = {"device": str(engine.device), "dtype": str(engine.dtype), "padding": repr(engine.padding),
                           "attention_padding": repr(engine.attention_padding),
                           "serves_reproducible": engine.serves_reproducible}
    sessions = [(prompt, SamplingParams(mode=Mode.GREEDY, reproducible=True)) for prompt in prompts]
    sessions += [(prompt, SamplingParams(mode=Mode.COUPLED, temperature=0.7, seed=7 + i, reproducible=True))
                 for i, prompt in enumerate(prompts)]
    server = BackgroundServer(engine, ServerConfig(port=0, limits=ServiceLimits(max_draft_len=16))).start()
    endpoint = VerifierEndpoint(server.address, engine.vocab_size, engine.fingerprint)
    try:
        def cloud_only(session):
            return cloud_only_generate(endpoint, session[0], session[1], max_new_tokens=tokens).tokens

        def split(session_and_answer):
            (prompt, params), answer = session_and_answer
            drafter = NgramDrafter(engine.vocab_size) if lookup else _answer_drafter(engine.vocab_size, prompt, answer)
            result = run_decode(drafter, GrpcVerifier(endpoint), prompt, params, max_new_tokens=tokens,
                                spec=SpecConfig(6))
            return result.tokens, result.stats.drafted, result.stats.accepted

        try:
            reference = [cloud_only(session) for session in sessions]  # target-only: each alone, a token a forward
        except Exception as exc:  # noqa: BLE001 - a refusal is the finding, said as it was said
            out["refused"] = f"{type(exc).__name__}: {exc}"
            return out
        with ThreadPoolExecutor(len(sessions)) as pool:
            started = time.perf_counter()
            split_runs = list(pool.map(split, zip(sessions, reference)))
            split_s = time.perf_counter() - started
            batched_cloud_only = list(pool.map(cloud_only, sessions))
        out["largest_forward_rows"] = server.server.servicer.scheduler.stats.max_rows
    finally:
        server.stop()
    out.update(
        sessions=len(sessions), tokens_each=tokens,
        split_identical=sum(run[0] == ref for run, ref in zip(split_runs, reference)),
        cloud_only_batched_identical=sum(got == ref for got, ref in zip(batched_cloud_only, reference)),
        drafted=sum(run[1] for run in split_runs), accepted=sum(run[2] for run in split_runs),
        split_wall_s=round(split_s, 2))
    out["all_identical"] = out["split_identical"] == out["cloud_only_batched_identical"] == len(sessions)
    return out


def service(check: GpuCheck, deadline: Deadline) -> dict[str, Any]:
    """The verifier service on the device with the tiny target (its tokenizer, its text prompts)."""
    import tempfile

    from cloud.engine import NotRowInvariant, TargetEngine

    with tempfile.TemporaryDirectory(prefix="splitspec-gpu-check-") as tmp:
        target = _tiny_target(check, tmp)
        refused = None
        try:
            engine = TargetEngine(target, device=check.device, dtype=check.dtype, shapes="canonical")
        except NotRowInvariant as exc:  # said, and the reproducible sessions are then refused in turn
            refused = str(exc)
            engine = TargetEngine(target, device=check.device, dtype=check.dtype, shapes="auto")
        texts = ["The cat sat on the mat.", "We have 3 dogs and 12 cats!", "the sun is big and red", "I see a new day"]
        prompts = [[1, *engine.tokenizer(text, add_special_tokens=False).input_ids] for text in texts]
        out = serve_sessions(engine, prompts, 48 if not check.dry_run else 24)
    return {**out, **({"canonical_refused": refused} if refused else {})}


def service_8b(check: GpuCheck, deadline: Deadline) -> dict[str, Any]:
    """The verifier service on the 8B shape (random weights, random prompts of token ids): the engine's
    canonical shapes for it under the scheduler's real batching, against target-only; the split drafts
    target-only's answer with every fifth token wrong (``_answer_drafter``)."""
    import random

    big, _ = check.shapes
    engine = build_engine(big, device=check.device, dtype=check.torch_dtype, shapes="auto")
    rng = random.Random(3)
    prompts = [[1, *(rng.randrange(3, min(engine.vocab_size, 20_000)) for _ in range(rng.randrange(20, 120)))]
               for _ in range(4)]
    out = serve_sessions(engine, prompts, 32 if not check.dry_run else 16, lookup=False)
    del engine
    release_memory(check.device)
    return out
