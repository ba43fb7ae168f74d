"""Suite-wide fixtures."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import refused_port as _refused_port


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """A full collection after each test, so that a connection or file a test left open is
    reported (ResourceWarning, an error here) in that test, not in whichever test happens to
    run when the collector next gets to it."""
    yield
    gc.collect()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections for the whole test (`support.procs`)."""
    with _refused_port() as port:
        yield port


# Every process the suite starts inherits this marker (servers, agents, and the engines
# agents start in sessions of their own, which outlive an agent that is killed). At the end
# of the run whatever still carries it is killed: a test that forgot one, or one whose pid
# nobody learned, cannot leave it running past the suite (and holding its port).
_MARK = "LLMGW_TEST_RUN"


def pytest_sessionstart(session: pytest.Session) -> None:
    os.environ[_MARK] = f"{os.getpid()}-{time.time_ns()}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    mark = f"{_MARK}={os.environ.get(_MARK, '')}".encode()
    left = [pid for pid in _marked(mark) if pid != os.getpid()]
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if left:
        # Said, not failed: the run's own verdict stands, and the leak is on record.
        print(f"\ntests: killed {len(left)} process(es) still running after the suite: {left}")


def _marked(mark: bytes) -> list[int]:
    """Pids of live processes whose environment holds `mark` (NAME=value, whole)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if mark in env.split(b"\0"):
            out.append(int(d.name))
    return out
