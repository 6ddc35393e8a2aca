"""Tensor parallelism: the tiny target sharded over two CPU ranks (gloo) under torchrun."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import remote, tiny_drafter, tiny_prompt

from edge.cloud_only import cloud_only_generate
from edge.endpoint import VerifierEndpoint
from shared.params import Mode, SamplingParams


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Address:
    def __init__(self, port: int) -> None:
        self.address = f"127.0.0.1:{port}"


RANKS = 2
# ``splitspec-cloud serve`` as torchrun starts it, each rank first saying how many bytes of parameters it
# holds: its shards' elements (a DTensor's local part), and the whole model's.
SERVE_COUNTING_SHARDS = """
import sys
import cloud.tensor_parallel as tp
from cloud.cli import main

load = tp.load_engine


def counted(*args, **kwargs):
    engine = load(*args, **kwargs)
    held = whole = 0
    for parameter in engine.model.parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        held += local.numel() * local.element_size()
        whole += parameter.numel() * parameter.element_size()
    print(f"rank {tp.rank()} holds {held} of {whole} parameter bytes", file=sys.stderr, flush=True)
    return engine


tp.load_engine = counted
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_verifier_sharded_over_two_ranks_serves_token_identical_output(tiny_models, tiny_engine, tiny_vocab,
                                                                         tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    log = tempfile.NamedTemporaryFile(prefix="splitspec-tp-", suffix=".log", delete=False)
    script = tmp_path / "serve_counting_shards.py"
    script.write_text(SERVE_COUNTING_SHARDS)
    cmd = [str(torchrun), "--nproc-per-node", str(RANKS), "--master-port", str(_free_port()), str(script), "-v",
           "serve", "--target", tiny_models["target"], "--port", "0", "--grace", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    drafter = tiny_drafter(tiny_models)
    try:
        port = None
        for line in proc.stdout:
            if line.startswith("splitspec cloud: serving"):
                port = int(line.rsplit(":", 1)[1])
                break
        assert port, Path(log.name).read_text()[-3000:]
        server = _Address(port)
        prompt = tiny_prompt(tiny_engine, "The cat sat on the mat.")
        for params in (SamplingParams(mode=Mode.GREEDY), SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=5)):
            # target-only through the same sharded engine, then the split
            want = cloud_only_generate(VerifierEndpoint(server.address, *tiny_vocab), prompt, params,
                                       max_new_tokens=24).tokens
            got, _ = remote(server, tiny_vocab, drafter, prompt, params, draft_len=4, max_new_tokens=24)
            assert got.tokens == want
            assert len(want) == 24
    finally:
        drafter.close()
        proc.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks (and itself exits 1 on a signal)
        rest, _ = proc.communicate(timeout=60)
    # Rank 0 drained its calls and told the follower to stop.
    assert "splitspec cloud: stopped" in rest, Path(log.name).read_text()[-3000:]
    text = Path(log.name).read_text()
    assert "tensor parallel over 2 ranks" in text
    # Each rank holds its shard, not a copy of the model: 1/N of the parameter bytes, plus at most what
    # may stay replicated (the norms; the embeddings, which some plans do not split).
    model = dict(tiny_engine.model.named_parameters())
    whole = sum(p.numel() * p.element_size() for p in model.values())
    replicable = sum(p.numel() * p.element_size() for name, p in model.items() if "norm" in name or "embed" in name)
    held = {int(rank): (int(bytes_held), int(of)) for rank, bytes_held, of in
            re.findall(r"rank (\d+) holds (\d+) of (\d+) parameter bytes", text)}
    assert sorted(held) == list(range(RANKS)), text[-3000:]
    for rank, (bytes_held, of) in held.items():
        assert of == whole and whole / RANKS <= bytes_held <= whole / RANKS + replicable, (rank, bytes_held, whole)
    assert whole / RANKS + replicable < whole  # the bound tells a shard from a full copy of the model
