"""Fixtures and HTTP helpers for gateways run against the control-plane stand-in."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.control_stub import ControlStub
from tests.support.gateway import Gateway

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlStub]:
    """A running control-plane stand-in with its data directory."""
    d = tmp_path / "cp"
    d.mkdir()
    stub = ControlStub(d).start()
    yield stub
    stub.stop()


def start_authed(gateway_factory: Callable[..., Gateway], sim_url: str, stub: ControlStub,
                 config: dict[str, Any] | None = None, *, ready: bool = True) -> Gateway:
    """A gateway in front of `sim_url` that takes its keys and limits from `stub`.

    With `ready`, returns once every worker has its first snapshot (the stub must have one).
    """
    before = stub.state.first_polls
    gw = gateway_factory([f"r1={sim_url}=sim-model"], config or {}, "--control-plane", stub.url,
                         "--data-dir", str(stub.data_dir))
    if ready:
        stub.wait_first_polls(before + int((config or {}).get("workers", 1)))
        wait_ready(gw)
    return gw


def wait_ready(gw: Gateway, timeout: float = 10.0) -> None:
    """Waits until /ready answers 200 (the first snapshot arrived)."""
    deadline = time.monotonic() + timeout
    while True:
        status, _, _ = request(gw.url + "/ready", None)
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gateway never ready (last {status})")
        time.sleep(0.02)


def request(url: str, body: Any, key: str | None = None, headers: dict[str, str] | None = None,
            method: str | None = None, timeout: float = 30) -> tuple[int, dict[str, str], Any]:
    """One request on a new connection: (status, lower-case headers, JSON body or text)."""
    h = {"content-type": "application/json", **(headers or {})}
    if key is not None:
        h["authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers.items()), e.read()
    hdrs = {k.lower(): v for k, v in hdrs.items()}
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw.decode()


def chat(gw: Gateway, key: str | None, body: dict[str, Any] | None = None,
         **kw: Any) -> tuple[int, dict[str, str], Any]:
    """POST /v1/chat/completions."""
    return request(gw.base_url + "/chat/completions", body or CHAT, key, **kw)
