"""Fixtures for the gateway's end-to-end tests: real simulator and gateway processes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway import GATEWAY_READY, Gateway, start_sim
from tests.support.procs import Proc, start_process


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """Starts gateways: factory(endpoints=[...], config={...}); all are stopped at the end."""
    started: list[Proc] = []

    def make(endpoints: list[str], config: dict[str, Any] | None = None, *args: str) -> Gateway:
        n = len(started)
        usage_log = tmp_path / f"usage-{n}.jsonl"
        cmd = [
            sys.executable,
            "-m",
            "llmgw",
            "gateway",
            "--port",
            "0",
            "--usage-log",
            str(usage_log),
        ]
        if config:
            cfg = tmp_path / f"server-{n}.yaml"
            cfg.write_text(json.dumps({"gateway": config}))  # JSON is YAML
            cmd += ["--config", str(cfg)]
        for e in endpoints:
            cmd += ["--endpoint", e]
        proc = start_process([*cmd, *args], GATEWAY_READY)
        started.append(proc)
        return Gateway(proc, usage_log)

    yield make
    for p in started:
        p.terminate()


@pytest.fixture
def sim() -> Iterator[Proc]:
    """One simulator serving `sim-model`, zero latency."""
    with start_sim("--model", "sim-model") as p:
        yield p


@pytest.fixture
def gateway(gateway_factory: Callable[..., Gateway], sim: Proc) -> Gateway:
    """A gateway in front of the `sim` fixture, with an alias `gpt-test` for `sim-model`."""
    return gateway_factory([f"r1={sim.url}=sim-model"], {"aliases": {"gpt-test": "sim-model"}})
