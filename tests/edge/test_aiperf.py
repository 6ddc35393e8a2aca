"""NVIDIA's aiperf, the field's benchmark client, drives ``edge serve`` and reads our acceptance length.

aiperf (0.13, in ``.venv-aiperf``: ``make install`` makes it) sends streamed chat requests to the OpenAI
server and reads vLLM's per-request ``metrics.speculative_decoding`` from each stream's usage chunk: it
checks that the object's counts add up (histogram steps, the j-weighted accepted drafts) and drops it
otherwise. Here it must complete a run with a record for every request, and the acceptance length it
reports (1 + accepted drafts per step, over the run) must equal what ``edge serve``'s own
``vllm:spec_decode_*`` counters say to 1%.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from helpers import tiny_drafter

from edge.serving import EdgeService, ServeConfig
from sim.bench.serve_load import openai_server

AIPERF = Path(__file__).resolve().parents[2] / ".venv-aiperf" / "bin" / "aiperf"
REQUESTS = 6


def counters(url: str) -> dict[str, float]:
    """edge serve's vLLM spec-decode counters now."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    out = {}
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"):
        out[name] = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))
    return out


def test_aiperf_reads_the_acceptance_length_edge_serve_reports(tiny_models, verifier, tmp_path):
    assert AIPERF.exists(), f"{AIPERF} is missing: `make install` creates .venv-aiperf with aiperf 0.13"
    drafter = tiny_drafter(tiny_models, "drafter_noisy", n_ctx=2048)  # (a drafter the target rejects at times)
    try:
        service = EdgeService.for_drafter(drafter, ServeConfig(cloud=verifier.address, model_name="tiny"))
        with openai_server(service) as url:
            before = counters(url)
            run = subprocess.run(
                [str(AIPERF), "profile", "--model", "tiny", "--url", url.removesuffix("/v1"), "--endpoint-type", "chat",
                 "--streaming", "--request-count", str(REQUESTS), "--concurrency", "1",
                 "--tokenizer", tiny_models["target"], "--prompt-input-tokens-mean", "16",
                 "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", "24",
                 "--prompt-output-tokens-stddev", "0", "--random-seed", "1", "--ui", "none", "--no-server-metrics",
                 "--output-artifact-dir", str(tmp_path)],
                capture_output=True, text=True, timeout=300)
            after = counters(url)
    finally:
        drafter.close()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert report["request_count"]["avg"] == REQUESTS and not report.get("error_summary")
    assert report["spec_decode_acceptance_length"]["count"] == REQUESTS  # every request's object was taken
    steps = report["total_spec_decode_steps"]["avg"]
    accepted = report["spec_decode_accepted_draft_tokens"]["sum"]
    theirs = 1 + accepted / steps
    drafts = after["vllm:spec_decode_num_drafts_total"] - before["vllm:spec_decode_num_drafts_total"]
    ours = 1 + (after["vllm:spec_decode_num_accepted_tokens_total"]
                - before["vllm:spec_decode_num_accepted_tokens_total"]) / drafts
    assert steps == drafts
    assert theirs == pytest.approx(ours, rel=0.01)
    assert 1.0 < ours < 1 + 24  # something was accepted, and not everything
    assert report["spec_decode_token_weighted_acceptance_length"]["avg"] == pytest.approx(theirs, rel=0.01)
