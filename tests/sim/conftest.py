"""Fixtures that run the engine simulator as a real subprocess."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support.procs import Proc, start_process
from tests.support.sim import READY, StartSim, sim_env


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Start simulators with extra CLI options; all are killed at the end of the test."""
    procs: list[Proc] = []

    def start(*options: str) -> Proc:
        args = [sys.executable, "-m", "llmgw.engines.sim", "--port", "0", *options]
        proc = start_process(args, READY, env=sim_env())
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.terminate()


@pytest.fixture(scope="module")
def sim() -> Iterator[Proc]:
    """One zero-latency simulator shared by a test module (tests must not need fresh metrics)."""
    args = [sys.executable, "-m", "llmgw.engines.sim", "--port", "0",
            "--model", "sim-model", "--model", "other-model"]  # fmt: skip
    with start_process(args, READY, env=sim_env()) as proc:
        yield proc
