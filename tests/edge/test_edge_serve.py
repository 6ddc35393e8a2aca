"""``splitspec-edge serve``: the official ``openai`` client against the OpenAI-compatible server on
real uvicorn, with a real verifier behind it (tiny models). Outputs equal ``edge run``'s, bad
input gets OpenAI-shaped errors, and the offline fallback says so."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from helpers import ControllersSeen, tiny_drafter

from cloud.limits import ServiceLimits
from cloud.server import BackgroundServer, ServerConfig
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.openai_server import create_app
from edge.schedule import SpecConfig
from edge.serving import SPLIT, EdgeService, Job, ServeConfig
from shared.params import Mode, SamplingParams

KEY = "sk-test-key"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The cat sat on the mat."}]


@pytest.fixture(scope="module")
def cloud(serve_module):
    return serve_module(ServiceLimits(max_draft_len=16))


@pytest.fixture(scope="module")
def drafter(tiny_models):
    made = tiny_drafter(tiny_models, "drafter_noisy")
    yield made
    made.close()


class Http:
    """The app on a real uvicorn server in a thread."""

    def __init__(self, service: EdgeService, max_waiting: int = 8) -> None:
        app = create_app(service, api_key=KEY, max_waiting=max_waiting)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.client = openai.OpenAI(base_url=f"{self.base}/v1", api_key=KEY, max_retries=0)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def make_service(drafter, address: str, **config) -> EdgeService:
    settings = dict(cloud=address, model_name="tiny", draft_len=4, connect_timeout_s=2.0, outage_budget_s=2.0)
    settings.update(config)
    return EdgeService.for_drafter(drafter, ServeConfig(**settings), "gemma")


@pytest.fixture()
def http(cloud, drafter):
    made = Http(make_service(drafter, cloud.address))
    yield made
    made.close()


def edge_run(service: EdgeService, cloud, prompt, params, max_tokens):
    verifier = GrpcVerifier(VerifierEndpoint(cloud.address, service.vocab.size, service.vocab.fingerprint))
    result = run_decode(service.drafter, verifier, prompt, params, max_new_tokens=max_tokens,
                        spec=SpecConfig(4, window=2))
    return service.vocab.detokenize(result.tokens)


def test_chat_streaming_and_whole_equal_edge_run(http, cloud):
    service = http.server.config.app.state.edge.service
    prompt, _ = service.chat_prompt(CHAT)
    params = SamplingParams(mode=Mode.COUPLED, temperature=0.8, top_k=64, top_p=0.95, seed=11)
    want = edge_run(service, cloud, prompt, params, 24)
    whole = http.client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0.8,
                                                top_p=0.95, seed=11)
    assert whole.choices[0].message.content == want and whole.choices[0].finish_reason == "length"
    usage = whole.usage.model_dump()
    assert usage["completion_tokens"] == 24 and usage["prompt_tokens"] == len(prompt)
    assert usage["splitspec"]["cloud_forwards"] >= 1 and usage["splitspec"]["bytes_up"] > 0
    chunks = list(http.client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0.8,
                                                      top_p=0.95, seed=11, stream=True,
                                                      stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices


def test_each_response_carries_the_field_s_speculation_fields_and_vllm_s_counters(http):
    """vLLM's ``metrics.speculative_decoding`` and llama-server's ``timings`` on a whole response and on a
    stream's usage chunk, consistent with the usage; ``/metrics`` counts the steps under vLLM's names."""
    import httpx

    def scrape(name: str) -> float:
        text = httpx.get(f"{http.base}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
                   or line.startswith(name + "{"))

    before = scrape("vllm:spec_decode_num_drafts_total")
    whole = http.client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0)
    body = whole.model_dump()
    spec, timings = body["metrics"]["speculative_decoding"], body["timings"]
    assert spec["num_spec_steps"] >= 1 and spec["num_draft_tokens"] >= spec["num_accepted_draft_tokens"] >= 0
    histogram = spec["acceptance_histogram"]  # dense: index j, the steps that accepted j drafts (aiperf's check)
    assert sum(histogram) == spec["num_spec_steps"]
    assert sum(j * n for j, n in enumerate(histogram)) == spec["num_accepted_draft_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_draft_tokens"]
                                                            / spec["num_spec_steps"], abs=1e-4)
    assert timings["predicted_n"] == 23 and timings["prompt_n"] == body["usage"]["prompt_tokens"]
    assert timings["draft_n"] == spec["num_draft_tokens"] and timings["prompt_ms"] > 0
    assert scrape("vllm:spec_decode_num_drafts_total") - before == spec["num_spec_steps"]
    chunks = list(http.client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0,
                                                      stream=True, stream_options={"include_usage": True}))
    last = chunks[-1].model_dump()  # (the same text; the steps may differ: how blocks meet verdicts is timing)
    streamed = last["metrics"]["speculative_decoding"]
    assert streamed["num_spec_steps"] == sum(streamed["acceptance_histogram"]) >= 1
    assert last["timings"]["draft_n_accepted"] == streamed["num_accepted_draft_tokens"]


def test_what_a_user_writes_is_text_never_a_control_token(cloud, drafter):
    """A message or a completion prompt that holds ``</s>`` (the tiny vocabulary's EOS, a control token)
    is tokenized as text: a user cannot end the text or a turn by writing it. The chat template's own
    markers stay control tokens."""
    service = make_service(drafter, cloud.address)
    eos = drafter.llm.token_eos()
    written = "The cat </s> sat."
    ids, _ = service.chat_prompt([{"role": "user", "content": written}])
    assert eos not in ids
    assert eos not in service.text_prompt(written)
    assert eos in drafter.vocab.tokenize(written)  # the control: read with special tokens on, it is EOS
    # The text of the message is all there, as text: the prompt decodes back to it.
    assert written in drafter.vocab.detokenize(ids)
    parts, _ = service.template.render_parts([{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": written}])
    assert "".join(text for text, _ in parts) == service.template.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": written}])[0]
    assert [text for text, template in parts if not template] == ["Be brief.", written]


def test_text_completions_greedy_equal_edge_run(http, cloud):
    service = http.server.config.app.state.edge.service
    prompt = service.text_prompt("We have 3 dogs and")
    want = edge_run(service, cloud, prompt, SamplingParams(mode=Mode.GREEDY, top_k=64, top_p=0.95), 16)
    whole = http.client.completions.create(model="tiny", prompt="We have 3 dogs and", max_tokens=16, temperature=0)
    assert whole.choices[0].text == want
    streamed = "".join(c.choices[0].text for c in http.client.completions.create(
        model="tiny", prompt="We have 3 dogs and", max_tokens=16, temperature=0, stream=True) if c.choices)
    assert streamed == want


def test_a_conversation_uploads_only_each_new_turn(http):
    messages = list(CHAT)
    sent, prompts = [], []
    for turn in range(3):
        reply = http.client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
        sent.append(reply.usage.model_dump()["splitspec"]["prompt_tokens_sent"])
        prompts.append(reply.usage.prompt_tokens)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": f"And then {turn}?"}]
    # The re-rendered history keeps the earlier prompt as its prefix: at most the new part goes up.
    assert sent[0] == prompts[0]
    assert all(0 < sent[t] <= prompts[t] - prompts[t - 1] for t in (1, 2)), (sent, prompts)


def test_stop_strings_end_the_reply_before_them(http):
    full = http.client.completions.create(model="tiny", prompt="The cat", max_tokens=20, temperature=0)
    text = full.choices[0].text
    stop = text[5:8]
    cut = http.client.completions.create(model="tiny", prompt="The cat", max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": CHAT, "n": 2}, "n"),
        ({"model": "tiny", "messages": CHAT, "presence_penalty": 0.5}, "presence_penalty"),
        ({"model": "tiny", "messages": CHAT, "tools": [{"type": "function"}]}, "tools"),
        ({"model": "tiny", "messages": CHAT, "max_tokens": "many"}, "max_tokens"),
        ({"model": "tiny", "messages": CHAT, "temperature": 7}, "temperature"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"model": "tiny", "messages": CHAT, "max_tokens": 100_000}, "max_tokens"),
        ({"model": "tiny", "messages": CHAT, "temperature": 1e-4}, "temperature"),  # degenerate, inside the schema
        ({"model": "tiny", "messages": CHAT, "top_p": 1e-46}, "top_p"),  # rounds to 0 in float32
        ({"model": "tiny", "messages": CHAT, "top_k": 2**40}, "top_k"),  # past the wire's uint32
    ],
)
def test_bad_requests_get_openai_shaped_400s(http, body, param):
    response = httpx.post(f"{http.base}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param, error


def _malformed_requests() -> list[tuple[str, bytes, str]]:
    """(path, body, content type) of requests no client should send: 50 of them."""
    chat, text = "/v1/chat/completions", "/v1/completions"
    user = [{"role": "user", "content": "hi"}]

    def c(**fields) -> bytes:  # a chat request with ``fields`` over a short valid one
        return json.dumps({"model": "tiny", "messages": user, "max_tokens": 2, **fields}).encode()

    def t(**fields) -> bytes:
        return json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2, **fields}).encode()

    raw = [b"", b"null", b"[]", b"123", b'"a string"', b"{", b'{"messages": "hi"}', b"\xff\xfe\x00",
           b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
           b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}']
    bodies = [*raw,
              c(messages=None), c(messages=[None]), c(messages=[{"role": "user", "content": 5}]),
              c(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
              c(messages=[{"role": "user", "content": [{"type": "text"}]}]), c(messages=[{"content": "hi"}]),
              c(messages=[{}] * 50), c(max_tokens=-1), c(max_tokens=0), c(max_tokens=1.5), c(max_tokens=2**70),
              c(temperature="hot"), c(temperature=-1), c(top_p=2), c(top_p=-0.1), c(top_k=-5), c(top_k="x"),
              c(seed=-1), c(seed=2**70), c(seed="abc"), c(stop=["a", "b", "c", "d", "e"]), c(stop=5), c(stop=[""]),
              c(stream="yes"), c(stream=True, stream_options={"include_usage": "maybe"}), c(n=0),
              c(logit_bias={"1": 5}), c(logprobs=True), c(response_format={"type": "json_object"}), c(model=5),
              c(frequency_penalty=3), c(functions=[{"name": "f"}])]
    texts = [t(prompt=None), t(prompt=[1, 2, 3]), t(prompt=[[1, 2]]), t(prompt=["a", "b"]), t(echo=True),
             t(suffix="x"), t(best_of=2), t(prompt=5)]
    return ([(chat, body, "application/json") for body in bodies] + [(text, body, "application/json") for body in texts]
            + [(chat, c(), "text/plain"), (chat, b"messages=hi", "application/x-www-form-urlencoded")])


def test_a_table_of_malformed_requests_gets_4xx_and_no_traceback(http, caplog):
    """No malformed request makes the server answer 5xx or log a traceback; each gets an OpenAI-shaped
    error (or, where a field is only unusual, an answer)."""
    import logging

    caplog.set_level(logging.WARNING)
    table = _malformed_requests()
    assert len(table) >= 40
    answered = []
    for path, body, content_type in table:
        response = httpx.post(f"{http.base}{path}", content=body,
                              headers={"Authorization": f"Bearer {KEY}", "Content-Type": content_type}, timeout=60)
        assert response.status_code < 500, (path, body[:120], response.status_code, response.text[:300])
        if response.status_code >= 400:
            assert "error" in response.json(), (body[:120], response.text[:300])
        answered.append(response.status_code)
    assert sum(code >= 400 for code in answered) >= 40  # (most are refused; a few unusual ones are served)
    assert "Traceback" not in caplog.text, caplog.text[-2000:]
    assert httpx.get(f"{http.base}/health").json()["status"] == "ok"


def test_unknown_paths_and_methods_get_openai_shaped_errors(http):
    headers = {"Authorization": f"Bearer {KEY}"}
    missing = httpx.get(f"{http.base}/v1/nothing-here", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error", missing.text
    wrong = httpx.get(f"{http.base}/v1/chat/completions", headers=headers)
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error", wrong.text


def test_a_body_over_the_limit_is_refused_whole_or_chunked_and_the_server_stays_up(http):
    from edge.openai_api.body_limit import MAX_BODY_BYTES

    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    huge = json.dumps({"messages": [{"role": "user", "content": "a" * (MAX_BODY_BYTES + 10)}]}).encode()
    whole = httpx.post(f"{http.base}/v1/chat/completions", content=huge, headers=headers)
    assert whole.status_code == 413 and whole.json()["error"]["code"] == "request_too_large", whole.text[:200]

    def chunks():
        for start in range(0, len(huge), 1 << 16):
            yield huge[start:start + (1 << 16)]

    chunked = httpx.post(f"{http.base}/v1/chat/completions", content=chunks(), headers=headers)
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    assert httpx.get(f"{http.base}/health").json()["status"] == "ok"


def test_malformed_json_a_wrong_key_and_an_overlong_prompt(http):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    response = httpx.post(f"{http.base}/v1/chat/completions", content=b"{not json", headers=headers)
    assert response.status_code == 400 and "error" in response.json()
    wrong = httpx.post(f"{http.base}/v1/chat/completions", json={"messages": CHAT},
                       headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    long = [{"role": "user", "content": "cat " * 600}]
    over = httpx.post(f"{http.base}/v1/chat/completions", json={"messages": long}, headers=headers)
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"
    models = httpx.get(f"{http.base}/v1/models", headers=headers).json()
    assert "gemma" in models["data"][0]["splitspec"]["chat_template"]
    assert httpx.get(f"{http.base}/health").json()["status"] == "ok"
    assert "splitspec_edge_requests" in httpx.get(f"{http.base}/metrics").text


def test_two_requests_at_once_both_complete_correctly(http):
    results = {}

    def ask(i):
        results[i] = http.client.completions.create(model="tiny", prompt="The cat", max_tokens=12, temperature=0)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results[0].choices[0].text == results[1].choices[0].text and results[0].usage.completion_tokens == 12


def test_past_the_waiting_room_a_request_gets_a_clear_429(cloud, drafter):
    http = Http(make_service(drafter, cloud.address), max_waiting=1)
    turns = http.server.config.app.state.edge.turns
    headers = {"Authorization": f"Bearer {KEY}"}
    second = {}
    try:
        with httpx.stream("POST", f"{http.base}/v1/completions", headers=headers, timeout=60,
                          json={"prompt": "The cat", "max_tokens": 480, "temperature": 0, "stream": True}) as first:
            lines = first.iter_lines()  # (kept: a dropped iterator closes the stream, and the request is cancelled)
            next(line for line in lines if line.startswith("data: {"))  # it holds the drafter
            waiter = threading.Thread(target=lambda: second.update(response=httpx.post(
                f"{http.base}/v1/completions", headers=headers, timeout=60,
                json={"prompt": "The cat", "max_tokens": 4, "temperature": 0})))
            waiter.start()
            wait_deadline = time.monotonic() + 10
            while turns.waiting < 1:
                assert time.monotonic() < wait_deadline, "the second request never queued"
                time.sleep(0.02)
            third = httpx.post(f"{http.base}/v1/completions", headers=headers, timeout=10,
                               json={"prompt": "The cat", "max_tokens": 4, "temperature": 0})
            assert third.status_code == 429 and third.json()["error"]["type"] == "rate_limit_error"
        waiter.join(60)
        assert second["response"].status_code == 200  # it waited its turn, then ran
        assert second["response"].json()["usage"]["completion_tokens"] == 4
    finally:
        http.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_adaptive_schedule_s_controller_steers_each_request(cloud, drafter):
    """Each served generation of the adaptive schedule is decoded under a fresh controller (it measured
    that generation's blocks), and answers as the target alone would; the fixed schedules get none."""
    params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=3)
    tokens = {}
    for schedule in ("adaptive", "pipelined", "lockstep"):
        config = ServeConfig(cloud=cloud.address, model_name="tiny", draft_len=4, schedule=schedule, window=3)
        service = ControllersSeen.for_drafter(drafter, config, "gemma")
        tokens[schedule] = [service.run(Job(service.text_prompt(text), params, 24), lambda text: None,
                                        threading.Event()).tokens for text in ("The cat sat", "Once upon a time")]
        service.close()
        seen = service.controllers
        assert len(seen) == 2
        if schedule != "adaptive":
            assert seen == [None, None]
            continue
        assert seen[0] is not seen[1]  # what one generation measured is not the next's
        for controller in seen:
            assert controller.window == 3 and controller.max_draft_len == 4
            assert controller.acceptance.samples > 0  # it measured the generation's blocks
    assert tokens["adaptive"] == tokens["pipelined"] == tokens["lockstep"]


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_served_generations_hedge_and_cache_as_the_flags_ask(cloud, drafter):
    """``edge serve --hedge`` and ``--speculation-cache`` reach each request's decoding as ``edge run``'s
    do: the hedged generations send branches, the cached ones draft bets, the others neither, and every
    one answers as the target alone would."""
    params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=3)
    tokens, stats = {}, {}
    for name, config in (("plain", {}), ("hedged", {"hedge_width": 1}), ("cached", {"speculation_cache": True})):
        service = make_service(drafter, cloud.address, schedule="pipelined", window=3, **config)
        outcomes = [service.run(Job(service.text_prompt(text), params, 24), lambda text: None, threading.Event())
                    for text in ("The cat sat", "Once upon a time")]
        service.close()
        tokens[name] = [outcome.tokens for outcome in outcomes]
        stats[name] = [(outcome.decode.hedges_sent, outcome.decode.cache_branches) for outcome in outcomes]
    assert tokens["hedged"] == tokens["cached"] == tokens["plain"]
    assert stats["plain"] == [(0, 0), (0, 0)]
    assert all(hedges > 0 and branches == 0 for hedges, branches in stats["hedged"]), stats
    assert any(branches > 0 for _, branches in stats["cached"]) and all(h == 0 for h, _ in stats["cached"]), stats


def test_edge_serve_s_command_line_becomes_the_service_s_config(tmp_path):
    """What ``edge serve``'s flags set reaches ``ServeConfig`` (``edge.cli.serve_config``): the speculation
    flags, the schedule and its caps, the timeouts, the fallback and the cloud's credentials."""
    from edge.cli import build_parser, serve_config
    from edge.cli_options import cloud_options

    def config(*flags: str) -> ServeConfig:
        args = build_parser().parse_args(["serve", "--cloud", "cloud.example:50051", *flags])
        return serve_config(args, cloud_options(args), "tiny")

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    set_ = config("--hedge", "2", "--speculation-cache", "--schedule", "adaptive", "--draft-len", "6", "--window", "3",
                  "--verdict-timeout", "30", "--outage-budget", "7", "--connect-timeout", "20", "--fallback", "local",
                  "--auth-token-file", str(token))
    assert (set_.hedge_width, set_.speculation_cache) == (2, True)
    assert (set_.schedule, set_.draft_len, set_.window) == ("adaptive", 6, 3)
    assert (set_.verdict_timeout_s, set_.outage_budget_s, set_.connect_timeout_s) == (30, 7, 5.0)  # (held to 5 s)
    assert (set_.cloud, set_.model_name, set_.fallback, set_.auth_token) == ("cloud.example:50051", "tiny", "local",
                                                                             "s3cret")
    plain = config()
    assert (plain.hedge_width, plain.speculation_cache, plain.fallback, plain.auth_token) == (0, False, "error", None)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # (gRPC's threads: none fails)
def test_requests_share_one_connection_to_the_cloud(cloud, drafter):
    """Each request's session goes over the connection the first one opened (no TCP, TLS and
    HTTP/2 setup per request); after ``close`` the next request connects anew."""
    from sim.experiment.processes import BackgroundLink
    from sim.link.config import LinkConfig

    with BackgroundLink(LinkConfig(), cloud.port) as link:
        service = make_service(drafter, link.address)
        params = SamplingParams(mode=Mode.GREEDY)
        for question in ("Hello", "The cat sat on the mat.", "Why is the sky blue?"):
            prompt = service.text_prompt(question)
            out = service.run(Job(prompt, params, 6), lambda text: None, threading.Event())
            assert out.served_by == SPLIT and out.tokens
        assert link.emulator.connections == 1
        service.close()
        # gRPC tears a closed channel's connection down on its own threads (and a channel opened before
        # then may share it: C-core's subchannel pool): the next request comes once it is gone.
        deadline = time.monotonic() + 10
        while link.emulator.active_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert link.emulator.active_connections == 0
        service.run(Job(service.text_prompt("Hello"), params, 6), lambda text: None, threading.Event())
        assert link.emulator.connections == 2
        service.close()


def test_a_client_that_disconnects_mid_stream_closes_the_cloud_session(http, cloud):
    table = cloud.server.servicer.table
    before = len(table)  # sessions parked by earlier tests' conversations
    with httpx.stream("POST", f"{http.base}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"prompt": "The cat", "max_tokens": 200, "temperature": 0, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # the first piece of text arrived: hang up
    deadline = time.monotonic() + 10
    while len(table) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(table) == before, "the cloud session outlived its client"
    after = http.client.completions.create(model="tiny", prompt="The cat", max_tokens=4, temperature=0)
    assert after.usage.completion_tokens == 4  # the service is free again


def test_a_client_that_gives_up_on_a_whole_response_closes_the_cloud_session(http, cloud):
    table = cloud.server.servicer.table
    before = len(table)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{http.base}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=0.3,
                   json={"prompt": "The cat", "max_tokens": 480, "temperature": 0})
    deadline = time.monotonic() + 10
    while len(table) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(table) == before, "the cloud session outlived its client"
    after = http.client.completions.create(model="tiny", prompt="The cat", max_tokens=4, temperature=0)
    assert after.usage.completion_tokens == 4


def test_without_a_cloud_the_fallback_answers_or_a_503_says_why(drafter):
    dead = "127.0.0.1:9"  # nothing listens there
    for fallback, status in (("error", 503), ("local", 200)):
        http = Http(make_service(drafter, dead, fallback=fallback))
        try:
            response = httpx.post(f"{http.base}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                                  json={"prompt": "The cat", "max_tokens": 6, "temperature": 0}, timeout=30)
            assert response.status_code == status, response.text
            if status == 503:
                assert response.json()["error"]["code"] == "cloud_unavailable"
            else:
                body = response.json()
                assert response.headers["x-splitspec-served-by"] == "drafter-only"
                assert body["splitspec_served_by"] == "drafter-only" and body["usage"]["completion_tokens"] == 6
                lines = [json.loads(line[6:]) for line in httpx.post(
                    f"{http.base}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
                    json={"prompt": "The cat", "max_tokens": 6, "temperature": 0, "stream": True},
                ).text.splitlines() if line.startswith("data: {")]
                assert "".join(chunk["choices"][0]["text"] for chunk in lines) == body["choices"][0]["text"]
        finally:
            http.close()


def _health(http: Http) -> tuple[int, dict]:
    response = httpx.get(f"{http.base}/health", timeout=10)
    return response.status_code, response.json()


def _health_becomes(http: Http, status: int, serving: str | None = None, within_s: float = 8.0) -> dict:
    """Poll /health until it answers ``status`` (and, when given, ``serving``).

    The answer is cached for a second and a reconnect takes up to two, so a server that
    answers 200 throughout (the local fallback) must be polled for what it serves, not its code.
    """
    deadline = time.monotonic() + within_s
    while True:
        code, body = _health(http)
        arrived = code == status and (serving is None or body.get("serving") == serving)
        if arrived or time.monotonic() > deadline:
            assert arrived, body
            return body
        time.sleep(0.2)


def test_health_says_the_cloud_is_loading_then_ready_then_degraded(tiny_engine, drafter):
    with socket.socket() as probe:  # a port nothing listens on yet: the verifier "still loading"
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    http, local = Http(make_service(drafter, address)), Http(make_service(drafter, address, fallback="local"))
    try:
        code, body = _health(http)
        assert code == 503 and body["status"] == body["cloud"] == "loading" and body["serving"] is None, body
        assert address in body["reason"] and body["cloud_address"] == address
        code, body = _health(local)  # the fallback serves meanwhile, and says from what
        assert code == 200 and (body["status"], body["cloud"], body["serving"]) == ("ok", "loading", "drafter-only")
        with BackgroundServer(tiny_engine, ServerConfig(port=port)):
            body = _health_becomes(http, 200)
            assert (body["status"], body["cloud"], body["serving"]) == ("ok", "ready", "split") and "reason" not in body
            _health_becomes(local, 200, serving="split")
        body = _health_becomes(http, 503)  # the verifier went away
        assert body["status"] == body["cloud"] == "degraded" and address in body["reason"], body
        body = _health_becomes(local, 200, serving="drafter-only")
        assert body["cloud"] == "degraded", body
    finally:
        http.close()
        local.close()


def test_the_cloud_s_health_is_asked_at_most_once_a_second():
    from edge.cloud_health import LOADING, CloudHealth

    now = [100.0]
    health = CloudHealth(VerifierEndpoint("127.0.0.1:9", 512, b"x" * 32), clock=lambda: now[0])
    try:
        first = health.state()
        now[0] += 0.9
        assert health.state() is first and first.state == LOADING  # cached: no second probe
        now[0] += 0.2
        assert health.state() is not first
    finally:
        health.close()


@pytest.mark.parametrize("extra", [[], ["--api-key-file", "KEY"]], ids=["no-key", "key-in-cleartext"])
def test_edge_serve_refuses_the_network_without_a_key_and_tls_unless_insecure(tmp_path, tiny_models, extra):
    """Off loopback, edge serve needs a key and TLS, or an explicit --insecure: exit 2, one line, no
    traceback, before any model loads."""
    import subprocess
    import sys
    from pathlib import Path

    key = tmp_path / "key"
    key.write_text("sk-test\n")
    args = [a if a != "KEY" else str(key) for a in extra]
    result = subprocess.run(
        [sys.executable, "-m", "sim.cli", "edge", "serve", "--host", "0.0.0.0", "--port", "0",
         "--cloud", "127.0.0.1:1", "--drafter", tiny_models["drafter_f32"], *args],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 2, result.stderr
    assert "--insecure" in result.stderr and "Traceback" not in result.stderr, result.stderr
