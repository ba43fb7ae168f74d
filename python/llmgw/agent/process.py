"""Engine processes: started in their own session, output kept line by line, signalled as a group."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol

from llmgw.engines.launch import Launch

LineSink = Callable[[str], None]


class EngineProcess(Protocol):
    """A running engine as the supervisor sees it."""

    pid: int

    async def wait(self) -> int:
        """The exit status once the process ended (negative: killed by that signal)."""
        ...

    def signal(self, sig: int) -> None:
        """Send `sig` to the engine and every process it started."""
        ...


Spawn = Callable[[Launch, LineSink], Awaitable[EngineProcess]]


class ChildProcess:
    """An engine started by `spawn`; its merged stdout and stderr go to a line sink."""

    def __init__(self, proc: asyncio.subprocess.Process, sink: LineSink) -> None:
        self._proc = proc
        self.pid = proc.pid
        self._reader = asyncio.create_task(self._read(sink))

    async def _read(self, sink: LineSink) -> None:
        assert self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            sink(line.decode(errors="replace").rstrip("\r\n"))

    async def wait(self) -> int:
        """The exit status, after the output up to the exit has been read."""
        code = await self._proc.wait()
        # A grandchild can keep the pipe open after the engine died: do not wait on it long.
        await asyncio.wait((self._reader,), timeout=1)
        self._reader.cancel()
        return code

    def signal(self, sig: int) -> None:
        """Signal the engine's process group (granian and vLLM fork workers)."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # group gone and the id reused: at least the child itself
            self._proc.send_signal(sig)


async def spawn(launch: Launch, sink: LineSink) -> EngineProcess:
    """Start `launch.argv` in a new session with `launch.env` over the agent's environment.

    Raises OSError (FileNotFoundError, PermissionError) when it cannot start.
    """
    proc = await asyncio.create_subprocess_exec(
        *launch.argv,
        env={**os.environ, **launch.env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        # Its own process group, so a stop reaches the workers it forks; not tied to
        # the agent's terminal, so a ^C to the agent is handled by the agent (drain).
        start_new_session=True,
    )
    return ChildProcess(proc, sink)


def describe_exit(code: int) -> str:
    """`exited with code 1` / `was killed by SIGKILL`: for status reasons."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
