"""The simulator's OpenAI surface, exercised with the official `openai` client."""

from __future__ import annotations

import base64
import http.client
import json
import struct
from pathlib import Path

import openai
import pytest

from tests.support.procs import Proc
from tests.support.sim import StartSim, client_for, metric

MSGS: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "tell me about the sea"},
]
PROMPT_TOKENS = 9  # "system: be brief" (3) + "user: tell me about the sea" (6), split on whitespace


def raw(proc: Proc, method: str, path: str, body: object = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """One HTTP request with http.client; returns status, headers (lower-case) and body."""
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=10)
    try:
        data = (
            body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        )
        conn.request(method, path, body=data, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_chat_non_streamed(sim: Proc) -> None:
    with client_for(sim) as client:
        resp = client.chat.completions.create(model="sim-model", messages=MSGS)
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-")
    assert resp.model == "sim-model"
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content is not None and len(choice.message.content.split()) == 16
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (PROMPT_TOKENS, 16)
    assert resp.usage.total_tokens == PROMPT_TOKENS + 16


def test_chat_streamed_with_usage(sim: Proc) -> None:
    with client_for(sim) as client:
        chunks = list(client.chat.completions.create(
            model="other-model", messages=MSGS, stream=True, max_tokens=5,
            stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    tokens = [c.choices[0].delta.content for c in chunks[1:6]]
    assert all(t and t.startswith(" ") and len(t.split()) == 1 for t in tokens)
    assert chunks[6].choices[0].finish_reason == "length"  # max_tokens 5 < 16
    assert chunks[6].choices[0].delta.content is None
    assert all(c.usage is None for c in chunks[:7])
    assert chunks[7].choices == []
    assert chunks[7].usage is not None
    assert chunks[7].usage.completion_tokens == 5
    assert chunks[7].usage.prompt_tokens == PROMPT_TOKENS
    assert len(chunks) == 8
    assert {c.model for c in chunks} == {"other-model"}
    assert len({c.id for c in chunks}) == 1


def test_chat_streamed_without_usage_matches_unary(sim: Proc) -> None:
    with client_for(sim) as client:
        chunks = list(client.chat.completions.create(model="sim-model", messages=MSGS, stream=True))
        unary = client.chat.completions.create(model="sim-model", messages=MSGS)
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == unary.choices[0].message.content


def test_raw_stream_is_one_event_per_token_and_done(sim: Proc) -> None:
    body = {"model": "sim-model", "prompt": "a b c", "stream": True, "max_tokens": 3}
    status, headers, data = raw(sim, "POST", "/v1/completions", body)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = data.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert len(payloads) == 3
    assert [p["choices"][0]["finish_reason"] for p in payloads] == [None, None, "length"]
    assert all("usage" not in p for p in payloads)


def test_completions(sim: Proc) -> None:
    with client_for(sim) as client:
        resp = client.completions.create(
            model="sim-model", prompt="once upon a time", max_tokens=40
        )
        streamed = list(client.completions.create(
            model="sim-model", prompt="once upon a time", stream=True,
            stream_options={"include_usage": True}))  # fmt: skip
        batch = client.completions.create(model="sim-model", prompt=["one", "two words"])
    assert resp.object == "text_completion"
    assert resp.id.startswith("cmpl-")
    assert resp.choices[0].finish_reason == "stop"  # 40 > --output-tokens 16
    assert resp.usage is not None and resp.usage.prompt_tokens == 4
    assert resp.usage.completion_tokens == 16
    assert "".join(c.choices[0].text for c in streamed[:-1]) == resp.choices[0].text
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens == 16
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.usage is not None and batch.usage.prompt_tokens == 3
    assert batch.usage.completion_tokens == 32


def test_determinism_across_processes(start_sim: StartSim) -> None:
    texts = []
    for _ in range(2):
        proc = start_sim("--seed", "7")
        with client_for(proc) as client:
            texts.append(client.chat.completions.create(model="sim-model", messages=MSGS)
                         .choices[0].message.content)  # fmt: skip
            seeded = client.chat.completions.create(model="sim-model", messages=MSGS, seed=8)
        proc.terminate()
    assert texts[0] == texts[1]
    assert seeded.choices[0].message.content != texts[0]  # the request seed overrides --seed


def test_embeddings(sim: Proc) -> None:
    with client_for(sim) as client:
        b64 = client.embeddings.create(model="sim-model", input=["hello world", "x"])
        flt = client.embeddings.create(model="sim-model", input="hello world",
                                       encoding_format="float")  # fmt: skip
    assert len(b64.data) == 2
    assert len(b64.data[0].embedding) == 64
    assert b64.data[0].embedding == pytest.approx(flt.data[0].embedding, rel=1e-6)
    assert b64.data[0].embedding != b64.data[1].embedding
    assert sum(v * v for v in flt.data[0].embedding) == pytest.approx(1.0)
    assert b64.usage.prompt_tokens == 3
    _, _, body = raw(sim, "POST", "/v1/embeddings",
                     {"model": "sim-model", "input": "hello world", "encoding_format": "base64"})  # fmt: skip
    packed = base64.b64decode(json.loads(body)["data"][0]["embedding"])
    assert list(struct.unpack("<64f", packed)) == pytest.approx(flt.data[0].embedding, rel=1e-6)


def test_models(sim: Proc) -> None:
    with client_for(sim) as client:
        ids = [m.id for m in client.models.list()]
        one = client.models.retrieve("other-model")
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("nope")
    assert ids == ["sim-model", "other-model"]
    assert one.owned_by == "llmgw-sim"


def test_unknown_model_is_404_openai_shape(sim: Proc) -> None:
    with client_for(sim) as client, pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=MSGS)
    assert info.value.status_code == 404
    status, _, body = raw(sim, "POST", "/v1/completions", {"model": "gpt-9", "prompt": "x"})
    err = json.loads(body)["error"]
    assert status == 404
    assert err["type"] == "NotFoundError" and err["code"] == 404 and "gpt-9" in err["message"]
    assert set(err) == {"message", "type", "param", "code"}


def test_bad_requests_are_400(sim: Proc) -> None:
    status, _, body = raw(sim, "POST", "/v1/chat/completions", b"{not json")
    assert status == 400 and json.loads(body)["error"]["type"] == "BadRequestError"
    status, _, _ = raw(sim, "POST", "/v1/chat/completions", {"model": "sim-model"})
    assert status == 400  # messages missing
    status, _, _ = raw(sim, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert status == 400
    status, _, _ = raw(sim, "GET", "/v1/nothing")
    assert status == 404


def test_headers_health_and_request_id(sim: Proc) -> None:
    status, headers, body = raw(sim, "GET", "/health", headers={"x-request-id": "abc123"})
    assert (status, body) == (200, b"")
    assert headers["x-request-id"] == "abc123"
    assert headers["x-llmgw-simulated"] == "true"
    status, headers, body = raw(sim, "POST", "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": [
                                    {"type": "text", "text": "hi there"}]}]})  # fmt: skip
    assert status == 200 and headers["x-llmgw-simulated"] == "true"
    assert len(headers["x-request-id"]) == 32
    assert json.loads(body)["id"] == "chatcmpl-" + headers["x-request-id"]
    assert json.loads(body)["usage"]["prompt_tokens"] == 3  # "user: hi there"


def test_metrics_names(sim: Proc) -> None:
    with client_for(sim) as client:
        client.completions.create(model="sim-model", prompt="count me", max_tokens=2)
    status, headers, body = raw(sim, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
                 "llmgw_sim_requests_aborted_total"):  # fmt: skip
        assert f'\n{name}{{model_name="sim-model"' in text, name
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert metric(sim, "vllm:request_success_total", finished_reason="length") >= 1
    assert metric(sim, "vllm:generation_tokens_total") >= 2
    assert metric(sim, "vllm:num_requests_running") == 0


def test_request_log_lists_each_inference_request(start_sim: StartSim, tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    proc = start_sim("--request-log", str(log))
    for rid in ("req-a", "req-b"):
        status, _, _ = raw(proc, "POST", "/v1/chat/completions",
                           {"model": "sim-model", "messages": MSGS}, {"x-request-id": rid})
        assert status == 200
    assert raw(proc, "GET", "/v1/models")[0] == 200
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["req-a", "req-b"]


def test_api_key_guards_v1_like_vllm(start_sim: StartSim) -> None:
    proc = start_sim("--api-key", "k-123")
    assert raw(proc, "GET", "/v1/models")[0::2] == (401, b'{"error":"Unauthorized"}')
    bad = {"authorization": "Bearer wrong"}
    assert raw(proc, "POST", "/v1/chat/completions", {"messages": []}, bad)[0] == 401
    assert raw(proc, "GET", "/health")[0] == 200  # the readiness probe needs no key
    good = {"authorization": "Bearer k-123", "content-type": "application/json"}
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    assert raw(proc, "POST", "/v1/chat/completions", body, good)[0] == 200
