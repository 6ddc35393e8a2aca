"""Test helpers shared by several test files: exact distributions and distances, the tiny drafters,
scripted drafters and the pipelining tests' prompts, sessions and counting controller; links to a
loopback verifier, an edge service that notes its controllers, a test certificate."""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from edge.controller import Controller
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from edge.serving import EdgeService
from protos import splitspec_pb2 as pb
from shared import codec
from shared.logits import process_logits
from shared.params import Mode, SamplingParams
from shared.wire import sampling_to_proto

GREEDY = SamplingParams(mode=Mode.GREEDY)
TEXTS = ["The cat sat on the mat.", "We have 3 dogs and 12 cats!"]


def exact_distribution(engine, prompt, params, length=3) -> dict[tuple[int, ...], float]:
    """P(first ``length`` generated tokens) by enumerating the target's top-k tree."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix, prob):
        if len(prefix) == length:
            out[tuple(prefix)] = prob
            return
        seq = engine.new_sequence()
        logits = engine.forward(seq, list(prompt) + prefix)[-1:]
        p = process_logits(logits.numpy(), params)[0]
        for token in np.flatnonzero(p > 0):
            walk(prefix + [int(token)], prob * p[token])

    walk([], 1.0)
    return out


def total_variation(counts: Counter, n: int, dist: dict) -> float:
    keys = set(counts) | set(dist)
    return 0.5 * sum(abs(counts.get(k, 0) / n - dist.get(k, 0.0)) for k in keys)


# -- do samples come from an exact distribution? -------------------------------------------------

ALPHA = 1e-3  # the chance that a sampler with exactly the target's distribution fails ``TargetFit.fits``
MIN_EXPECTED = 5  # chi-square cells hold at least this expected count (Cochran's rule); smaller ones are pooled
UNCHECKED_EVERY = 10  # the control: one session in ten has its drafts accepted unchecked


def rejection_sampling(seed: int = 0, temperature: float = 1.0, **fields) -> SamplingParams:
    """Rejection mode at top-k 4, as the distribution tests sample (three tokens: 4**3 outcomes at most)."""
    return SamplingParams(mode=Mode.REJECTION, temperature=temperature, top_k=4, seed=seed, **fields)


def chi_square_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square with ``dof`` (a positive integer) degrees of freedom, exactly:
    the finite series of the regularized upper incomplete gamma function at integer and half-integer order."""
    if x <= 0:
        return 1.0
    half = x / 2
    if dof % 2 == 0:  # e^-h * sum_{j < dof/2} h^j / j!
        return min(1.0, sum(math.exp(j * math.log(half) - half - math.lgamma(j + 1)) for j in range(dof // 2)))
    # erfc(sqrt h) + e^-h * sum_{j < (dof-1)/2} h^(j+1/2) / Gamma(j+3/2)
    tail = sum(math.exp((j + 0.5) * math.log(half) - half - math.lgamma(j + 1.5)) for j in range(dof // 2))
    return min(1.0, math.erfc(math.sqrt(half)) + tail)


@dataclass(frozen=True)
class TargetFit:
    """How ``n`` samples fit an exact distribution p. Two tests, each at ``ALPHA / 2`` (Bonferroni):
    Pearson's chi-square over the outcomes (omnibus: any bias large enough for n), cells with expected
    count below ``MIN_EXPECTED`` pooled; and a z-test of the mean log p(x) of the samples against its
    mean under p (directed: a sampler too hot or too cold, as a temperature slightly off). A sample on
    an outcome p gives probability 0 fails outright. On the tiny target's 61 outcomes (top-k 4, three
    tokens; 4,000 simulated runs) a sampler of p fails at a rate of 0.001 (0.0008 to 0.002), and one at
    temperature 1.2 for 1.0 (TV 0.063) fails with power 0.99 at n = 1000, 0.999 at 1500, 1.0 at 2400;
    sampling noise alone gives a TV of 0.085 at n = 1000, 0.07 at 1500, 0.055 at 2400."""

    n: int
    impossible: int  # samples on outcomes of probability 0
    chi_square: float
    dof: int
    chi_square_p: float
    loglik_z: float  # (mean log p(x) - E_p[log p]) / its standard error
    loglik_p: float
    tv: float  # for the record: total variation between the samples' frequencies and p

    @property
    def p_value(self) -> float:
        """The smaller test's p-value, Bonferroni-corrected (0 with any impossible sample)."""
        return 0.0 if self.impossible else min(1.0, 2 * min(self.chi_square_p, self.loglik_p))

    def fits(self, alpha: float = ALPHA) -> bool:
        return self.p_value >= alpha

    def __repr__(self) -> str:
        return (f"TargetFit(n={self.n}: p={self.p_value:.2g}; chi-square {self.chi_square:.1f} on {self.dof} dof, "
                f"p={self.chi_square_p:.2g}; log-likelihood z={self.loglik_z:+.2f}, p={self.loglik_p:.2g}; "
                f"{self.impossible} impossible samples; TV {self.tv:.3f})")


def target_fit(counts: Counter, dist: dict) -> TargetFit:
    """``counts`` (outcome -> samples) against the exact ``dist`` (outcome -> probability)."""
    n = sum(counts.values())
    impossible = sum(c for k, c in counts.items() if dist.get(k, 0.0) <= 0)
    cells: list[list[float]] = []  # [expected, observed], small outcomes pooled smallest first
    pool = [0.0, 0.0]
    for key, prob in sorted(dist.items(), key=lambda item: item[1]):
        pool[0] += n * prob
        pool[1] += counts.get(key, 0)
        if pool[0] >= MIN_EXPECTED:
            cells.append(pool)
            pool = [0.0, 0.0]
    if pool[0] and cells:  # what is left below the minimum joins the smallest cell
        cells[0] = [cells[0][0] + pool[0], cells[0][1] + pool[1]]
    chi = sum((o - e) ** 2 / e for e, o in cells)
    dof = max(len(cells) - 1, 1)
    logs = {k: math.log(v) for k, v in dist.items() if v > 0}
    mean = sum(dist[k] * log for k, log in logs.items())
    spread = math.sqrt(sum(dist[k] * (log - mean) ** 2 for k, log in logs.items()))
    possible = n - impossible
    observed = sum(c * logs[k] for k, c in counts.items() if k in logs) / max(possible, 1)
    z = (observed - mean) / (spread / math.sqrt(possible)) if spread and possible else 0.0
    return TargetFit(n, impossible, float(chi), dof, chi_square_sf(chi, dof), float(z), math.erfc(abs(z) / math.sqrt(2)),
                     float(total_variation(counts, n, dist)))


def draws(dist: dict, n: int, seed: int) -> Counter:
    """``n`` samples of ``dist`` (seeded): a sampler with exactly that distribution."""
    keys = sorted(dist)
    probs = np.array([dist[k] for k in keys])
    picks = np.random.default_rng(seed).multinomial(n, probs / probs.sum())
    return Counter({k: int(c) for k, c in zip(keys, picks) if c})


def accepted_unchecked(samples: list[tuple[int, ...]], drafter, prompt, params_for, every: int = UNCHECKED_EVERY) -> Counter:
    """The control of a distribution test: ``samples`` (one per seed, ``samples[seed]``) with every
    ``every``-th seed's tokens replaced by the drafter's own for that seed (``params_for(seed)``), as a
    verifier that accepted the drafts without the min(1, p/q̃) test would emit them. One session in
    ten so treated is a bias of TV about 0.03 here (the drafter alone is at about 0.3)."""
    biased = list(samples)
    for seed in range(0, len(samples), every):
        drafter.begin(prompt, params_for(seed))
        biased[seed] = tuple(drafter.draft(len(samples[seed])).tokens)
    return Counter(biased)


def tiny_prompt(engine, text: str) -> list[int]:
    """BOS + the tiny tokenizer's ids (the tiny GGUF does not add BOS itself)."""
    return [1, *engine.tokenizer(text, add_special_tokens=False).input_ids]


def greedy_continuation(engine, prompt: list[int], n: int = 40) -> list[int]:
    """The target's own greedy continuation of ``prompt`` (``n`` tokens), decoded one token a forward."""
    from cloud.session import VerifierSession

    session = VerifierSession(engine, prompt, GREEDY, max_new_tokens=n + 24, max_draft_len=16)
    tokens = []
    while len(tokens) < n:  # (an empty block's verdict may bring tokens the verifier proposed itself first)
        tokens.extend(session.verify(session.epoch, len(prompt) + len(tokens), []).committed([]))
    return tokens[:n]


def tiny_drafter(tiny_models, name: str = "drafter_noisy", n_ctx: int = 512):
    """The ``tiny_models`` drafter ``name`` as the tests open one: a context of ``n_ctx`` positions, one
    thread, an F32 KV cache. The caller closes it."""
    from edge.llama_drafter import LlamaDrafter

    return LlamaDrafter(tiny_models[name], n_ctx=n_ctx, n_threads=1, f32_kv_cache=True)


def new_session(engine, prompt, max_new_tokens=64, params=GREEDY, **policy):
    """A verifier session on ``engine`` (greedy by default) that takes blocks of up to 16 drafts;
    ``policy``: ``SessionPolicy`` fields."""
    from cloud.session import SessionPolicy, VerifierSession

    return VerifierSession(engine, prompt, params, max_new_tokens=max_new_tokens, max_draft_len=16,
                           policy=SessionPolicy(**policy))


class CountingController(Controller):
    """Counts what the loop reports: acceptance (every drafted block's, and the early block's) and blocks."""

    acceptances = blocks = 0

    def observe_acceptance(self, drafted, accepted, first=0):
        self.acceptances += 1
        super().observe_acceptance(drafted, accepted, first)

    def observe_block(self, *args, **kwargs):
        self.blocks += 1
        super().observe_block(*args, **kwargs)


class ScriptedDrafter:
    """Drafts a wrong token at every position (every ``wrong_every``-th from ``offset``; the target's own
    token elsewhere, whatever came before), with a second choice that is the target's own token
    (``right``) or another wrong one: every correction is then a hit, or a miss. Its hedge branches
    continue with the target's own tokens. ``target``: the target's tokens from position ``offset``."""

    def __init__(self, vocab_size: int, target: list[int], offset: int, right: bool, wrong_every: int = 1) -> None:
        from edge.drafter import DrafterStats, Speculation

        self.vocab_size, self.target, self.offset, self.right = vocab_size, target, offset, right
        self.wrong_every = wrong_every
        self.stats = DrafterStats()
        self._spec = Speculation.start([])

    def begin(self, prompt, params) -> None:
        from edge.drafter import Speculation

        self._spec = Speculation.start(prompt)

    def _want(self) -> int:
        return self.target[len(self._spec.tokens) - self.offset]

    def draft(self, n: int, stop=None):
        from edge.drafter import DraftBlock

        tokens, runner_up = [], []
        for _ in range(n):
            if stop is not None and stop():
                break
            want = self._want()
            wrong = (len(self._spec.tokens) - self.offset) % self.wrong_every == 0
            tokens.append((want + 1) % self.vocab_size if wrong else want)
            runner_up.append(want if self.right else (want + 2) % self.vocab_size)
            self._spec.tokens.append(tokens[-1])
        self.stats.record_draft(len(tokens), 0.0)
        return DraftBlock(tokens, None, runner_up)

    def draft_branch(self, back: int, first: int, n: int, stop=None):
        from edge.drafter import DraftBlock

        out = []
        with self._spec.branched(back, first):
            for _ in range(n):
                if stop is not None and stop():
                    break
                out.append(self._want())
                self._spec.tokens.append(out[-1])
        return DraftBlock(out)

    @property
    def sequence(self) -> list[int]:
        return self._spec.tokens

    def speculate(self, tokens) -> None:
        self._spec.tokens.extend(tokens)

    def commit(self, tokens) -> None:
        self._spec.commit(tokens)

    def rewind(self) -> None:
        self._spec.rewind()

    def close(self) -> None:
        pass


def link_for(server, vocab, **kwargs):
    """A ``GrpcVerifier`` to ``server`` for the tiny models' ``vocab`` ((size, fingerprint))."""
    size, fingerprint = vocab
    return GrpcVerifier(VerifierEndpoint(server.address, size, fingerprint), **kwargs)


def remote(server, vocab, drafter, prompt, params, draft_len, max_new_tokens=32, channel=None):
    """``run_decode`` against ``server`` over a fresh link: (the result, the link)."""
    link = link_for(server, vocab, channel=channel)
    result = run_decode(drafter, link, prompt, params, max_new_tokens=max_new_tokens, spec=SpecConfig(draft_len))
    return result, link


class ControllersSeen(EdgeService):
    """The service, noting the controller each generation is given."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.controllers: list = []

    def _schedule(self, draft_len):
        window, controller = super()._schedule(draft_len)
        self.controllers.append(controller)
        return window, controller


def make_certificate(folder: Path) -> tuple[bytes, bytes]:
    """A self-signed certificate for localhost and 127.0.0.1: (cert PEM, key PEM)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is not installed; cannot make a test certificate")
    folder.mkdir(parents=True, exist_ok=True)
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert.read_bytes(), key.read_bytes()


def make_client_certificates(folder: Path, names: list[str]) -> tuple[bytes, dict[str, tuple[bytes, bytes]]]:
    """A certificate authority and a client certificate it signs for each common name in ``names``:
    (the CA's PEM, {name: (cert PEM, key PEM)}); EC keys (fast to make)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is not installed; cannot make a test certificate")
    folder.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ca, ca_key = folder / "ca.pem", folder / "ca-key.pem"
    openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "1", "-subj", "/CN=test-ca")
    clients = {}
    for name in names:
        key, request, cert = folder / f"{name}-key.pem", folder / f"{name}.csr", folder / f"{name}.pem"
        openssl("req", *ec, "-keyout", str(key), "-out", str(request), "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                "-out", str(cert), "-days", "1")
        clients[name] = (cert.read_bytes(), key.read_bytes())
    return ca.read_bytes(), clients


GENERATE = "/splitspec.v1.Verifier/Generate"  # the RPC's path, for raw gRPC calls


def generate_request(engine, prompt, max_new_tokens: int) -> bytes:
    """A serialized greedy ``GenerateRequest`` for ``engine``'s vocabulary (raw gRPC calls)."""
    from protos import splitspec_pb2 as pb
    from shared import codec
    from shared.wire import sampling_to_proto

    encoded = codec.encode_tokens(prompt, engine.vocab_size)
    return pb.GenerateRequest(vocab_size=engine.vocab_size, vocab_fingerprint=engine.fingerprint,
                              sampling=sampling_to_proto(SamplingParams(mode=Mode.GREEDY)), prompt=encoded.data,
                              max_new_tokens=max_new_tokens).SerializeToString()


DECODE = "/splitspec.v1.Verifier/Decode"  # the RPC's path, for raw gRPC calls


class HeldSession:
    """A Decode stream that sends its Open (``send_open``, else nothing at all) and then holds the stream
    open, silent, until ``close``; over ``channel`` (a plaintext one to ``address`` by default), which it
    closes."""

    def __init__(self, address: str, engine, token: str | None, send_open: bool = True, channel=None) -> None:
        self._send_open = send_open
        prompt = tiny_prompt(engine, "The cat sat")
        encoded = codec.encode_tokens(prompt, engine.vocab_size)
        self._open = pb.EdgeFrame(open=pb.Open(vocab_size=engine.vocab_size, vocab_fingerprint=engine.fingerprint,
                                               sampling=sampling_to_proto(SamplingParams(mode=Mode.GREEDY)),
                                               prompt=encoded.data, max_new_tokens=8)).SerializeToString()
        self._done = threading.Event()
        self._channel = channel or grpc.insecure_channel(address)
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._call = self._channel.stream_stream(DECODE, request_serializer=lambda b: b,
                                                 response_deserializer=pb.CloudFrame.FromString)(
            self._frames(), timeout=30, metadata=metadata)

    def _frames(self):
        if self._send_open:
            yield self._open
        self._done.wait(30)

    def first(self) -> str:
        """The first reply's kind, or the name of the status code that ended the stream instead."""
        try:
            return next(self._call).WhichOneof("kind")
        except grpc.RpcError as error:
            return error.code().name

    def close(self) -> None:
        self._done.set()
        self._call.cancel()
        self._channel.close()


def opened_in_turn(server, engine, tokens: list[str | None], channels=None) -> list[str]:
    """Open a session per token, one after another, every one held open until all have answered:
    each one's first reply (``opened``, or the status that refused it). ``channels``: a channel for each
    (plaintext ones by default)."""
    sessions, replies = [], []
    try:
        for i, token in enumerate(tokens):
            sessions.append(HeldSession(server.address, engine, token, channel=channels[i] if channels else None))
            replies.append(sessions[-1].first())
        return replies
    finally:
        for session in sessions:
            session.close()
