"""The control plane's background loop: woken or timed, and a failing step is retried."""

from __future__ import annotations

import asyncio
import logging

import pytest

from llmgw.control.periodic import run_periodically


def test_a_step_runs_when_woken_and_on_time_and_survives_failures(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> list[str]:
        wake = asyncio.Event()
        runs: list[str] = []

        async def step() -> None:
            runs.append("run")
            if len(runs) <= 2:
                raise RuntimeError("store down")

        task = asyncio.ensure_future(run_periodically(wake, 0.05, step, "step failed (%d in a row)"))
        await asyncio.sleep(0.18)  # timed turns: the first two fail, later ones succeed
        n = len(runs)
        wake.set()  # a wake runs it at once, long before the next timed turn
        await asyncio.sleep(0.01)
        assert len(runs) == n + 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return runs

    with caplog.at_level(logging.ERROR, logger="llmgw.control"):
        runs = asyncio.run(main())
    assert len(runs) >= 4
    # Logged once for the first failure of the run of two, not for each.
    assert [r.getMessage() for r in caplog.records] == ["step failed (1 in a row)"]
