"""Helpers for the simulator tests: environment, clients, metrics scraping."""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import openai

from tests.support.procs import Proc

StartSim = Callable[..., Proc]

READY = "llmgw-sim listening on"
PYTHON_DIR = str(Path(__file__).resolve().parents[2] / "python")


KV_ANY = "tcp://127.0.0.1:*"
"""A KV-event endpoint on a port the simulator's bind picks (`kv_endpoints` reads it)."""


def kv_endpoints(proc: Proc) -> tuple[str, str]:
    """The KV-event and replay endpoints a started simulator bound, from the line it printed."""
    from llmgw.engines.sim.app import KV_LINE

    line = next(x for x in proc.lines if x.startswith(KV_LINE))
    m = re.fullmatch(re.escape(KV_LINE) + r" (\S+), replays them on (\S+)", line)
    assert m, f"no endpoints in {line!r}"
    return m.group(1), m.group(2)


def sim_env() -> dict[str, str]:
    """The test environment with the source tree importable (before `maturin develop`)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_DIR, env.get("PYTHONPATH")) if p)
    return env


def client_for(proc: Proc, **kw: object) -> openai.OpenAI:
    """An OpenAI client for a simulator; no retries so faults are seen as they are."""
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, **kw)  # type: ignore[arg-type]


def scrape(proc: Proc) -> dict[str, float]:
    """GET /metrics and return {'name{labels}': value}."""
    with urllib.request.urlopen(proc.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric(proc: Proc, name: str, **labels: str) -> float:
    """One sample's value; labels besides model_name="sim-model" are given as kwargs."""
    parts = ['model_name="sim-model"', *(f'{k}="{v}"' for k, v in labels.items())]
    return scrape(proc)[name + "{" + ",".join(parts) + "}"]
