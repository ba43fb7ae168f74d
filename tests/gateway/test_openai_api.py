"""The official `openai` client against the gateway, for every endpoint, streamed and not."""

from __future__ import annotations

import openai
import pytest

from tests.support.gateway import Gateway


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)


def test_chat_not_streamed(gateway: Gateway) -> None:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="sim-model",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=5,
        extra_headers={"x-request-id": "req-abc-1"},
    )
    # The id is the gateway's own, never the client's: usage counts each id once.
    rid = raw.headers["x-request-id"]
    assert rid and rid != "req-abc-1"
    r = raw.parse()
    assert r.model == "sim-model"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 5
    rec = gateway.usage(1)[0]
    assert rec["request_id"] == rid
    assert rec["status"] == "ok" and rec["replica"] == "r1"
    assert rec["completion_tokens"] == 5 and rec["prompt_tokens"] == r.usage.prompt_tokens


def test_chat_streamed_yields_the_simulator_text(gateway: Gateway, sim: object) -> None:
    c = client(gateway)
    whole = c.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "tell me"}]
    )
    chunks = list(
        c.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "tell me"}], stream=True
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    # The client did not ask for usage: the usage chunk the gateway asked for is gone.
    assert all(ch.choices for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    recs = gateway.usage(2)
    assert (
        recs[1]["stream"] is True and recs[1]["completion_tokens"] == whole.usage.completion_tokens
    )  # type: ignore[union-attr]
    assert recs[1]["usage_estimated"] is False and recs[1]["ttft_ms"] is not None
    assert (
        gateway.metric("llmgw_tokens_total", model="sim-model", kind="completion")
        == 2 * whole.usage.completion_tokens
    )  # type: ignore[union-attr]
    assert gateway.metric("llmgw_requests_total", model="sim-model", status="ok") == 2
    assert gateway.metric("llmgw_time_to_first_token_seconds_count", model="sim-model") == 1


def test_stream_usage_kept_when_the_client_asks(gateway: Gateway) -> None:
    chunks = list(
        client(gateway).chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=3,
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


def test_completions_streamed_and_not(gateway: Gateway) -> None:
    c = client(gateway)
    r = c.completions.create(model="sim-model", prompt="once upon a time", max_tokens=4)
    assert r.choices[0].text and r.usage is not None and r.usage.completion_tokens == 4
    parts = list(
        c.completions.create(
            model="sim-model", prompt="once upon a time", max_tokens=4, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text


def test_embeddings(gateway: Gateway) -> None:
    r = client(gateway).embeddings.create(model="sim-model", input=["a b c", "d"])
    assert len(r.data) == 2 and len(r.data[0].embedding) > 0
    assert r.usage.prompt_tokens == 4
    assert gateway.usage(1)[0]["prompt_tokens"] == 4


def test_models_list_and_get(gateway: Gateway) -> None:
    c = client(gateway)
    ids = {m.id for m in c.models.list()}
    assert ids == {"sim-model", "gpt-test"}
    assert c.models.retrieve("gpt-test").id == "gpt-test"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("nope")


def test_alias_is_what_the_client_sees(gateway: Gateway) -> None:
    c = client(gateway)
    r = c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    assert r.model == "gpt-test"
    chunks = list(
        c.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert chunks and all(ch.model == "gpt-test" for ch in chunks)
    recs = gateway.usage(2)
    assert {r["model"] for r in recs} == {"gpt-test"} and {r["upstream_model"] for r in recs} == {
        "sim-model"
    }
