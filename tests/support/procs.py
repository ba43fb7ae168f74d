"""Start real server processes for tests and always clean them up; wait for them; talk to them.

`start_process` runs a command in its own session (process group), waits
until a line of its merged stdout/stderr contains `ready_line`, and returns a
`Proc`. Leaving the `with` block (or calling `kill()`) stops the whole group,
so server workers forked by the child (granian) go too. llmgw's servers are started on
port 0 (`--port 0`, the control plane's `agent_port: 0`, the simulator's KV endpoints on
`tcp://127.0.0.1:*`, `llmgw up`'s three ports) and report the ports they bound; `free_port`
is left for an agent's `--port-range`, the ports it hands its engines (an engine is told its
port, as vLLM is, and the agent skips one that is taken), and for the bench (bench/procs.py,
with the same `spawn`).

`wait_for` (and `wait_for_async` in an event loop), `killpg` and `chat` are the one poll,
kill and chat-completion helpers of the tests: a test waits on the condition it needs,
with a deadline and a sentence saying what never came, not for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

_URL = re.compile(r"https?://(\[[^\]]+\]|[^\s:/]+):(\d+)")
T = TypeVar("T")


_LOWEST = 10000
"""Below it: the well-known ports of this machine's services (PostgreSQL, Redis)."""
_given: set[int] = set()
"""Every port `free_port` handed out in this process: none is handed out twice."""
_rng = random.Random()
"""Its own generator: a test that seeds `random` does not make the ports repeat."""


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections' local ports."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(span: int = 1) -> int:
    """The first of `span` consecutive TCP ports on 127.0.0.1 that were free a moment ago.

    For an agent's engine port range, which is a range of ports by design; a server a test
    starts binds port 0 and names its port instead (the module's docstring).

    Chosen below the kernel's ephemeral range, never from it: there any client connection
    of any process may take the port as its local one between this check and the server's
    bind (gRPC then cannot listen, and the server exits). No port is handed out twice in
    one process, so two servers of one test never race for the same one.
    """
    top = _ephemeral_low() - span
    for _ in range(1000):
        low = _rng.randrange(_LOWEST, top)
        run = range(low, low + span)
        if any(p in _given for p in run) or not all(_bindable(p) for p in run):
            continue
        _given.update(run)
        return low
    raise RuntimeError(f"no {span} free consecutive ports between {_LOWEST} and {top + span}")


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections while the block runs.

    Bound and never listening: a connect gets ECONNREFUSED, and no other process can take
    the port meanwhile, as it could one found free and let go before it is dialled.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Proc:
    """A started process; `.port` and `.url` come from its ready line (or its --port)."""

    def __init__(self, popen: subprocess.Popen[str], args: list[str]) -> None:
        self.popen = popen
        self.args = args
        self.lines: list[str] = []
        self.port = 0
        self.url = ""
        self._ready = threading.Event()
        self._ready_line = ""
        self._reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:  # drains the pipe so the child never blocks on it
            self.lines.append(line.rstrip("\n"))
            if self._ready_line and self._ready_line in line and not self._ready.is_set():
                m = _URL.search(line)
                if m:
                    self.port = int(m.group(2))
                    self.url = f"http://{m.group(1)}:{self.port}"
                self._ready.set()
        self._ready.set()  # EOF: wake the waiter so it sees the exit

    @property
    def output(self) -> str:
        """Everything the process printed so far."""
        return "\n".join(self.lines)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)  # the group id is the child's pid (own session)

    def terminate(self, timeout: float = 10) -> int:
        """SIGTERM the process group, wait, and SIGKILL it if it lingers."""
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        return self.kill()

    def kill(self) -> int:
        """SIGKILL the whole process group and reap the child; returns its exit status."""
        self._signal(signal.SIGKILL)
        rc = self.popen.wait()
        self._reader.join(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return rc

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.terminate()


def spawn(args: list[str], env: dict[str, str] | None = None,
          cwd: str | None = None) -> subprocess.Popen[str]:
    """`args` in its own session (so its group holds every worker it forks), stdout and
    stderr merged into one line-buffered text pipe that the caller must drain."""
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )


def start_process(
    args: list[str],
    ready_line: str,
    timeout: float = 20,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Proc:
    """Start `args` and wait until it prints a line containing `ready_line`.

    `.port`/`.url` come from the first URL in the ready line, else from `port`,
    else from a `--port N` argument. A server started on `--port 0` binds a port the kernel
    picks and names it in its ready line: no port is chosen here and let go before it binds.
    """
    popen = spawn(args, env)
    proc = Proc(popen, args)
    proc._ready_line = ready_line
    if port is None and "--port" in args:
        port = int(args[args.index("--port") + 1])
    if port:
        proc.port = port
        proc.url = f"http://127.0.0.1:{port}"
    proc._reader.start()
    deadline = time.monotonic() + timeout
    while not proc._ready.wait(0.05):
        if time.monotonic() > deadline:
            break
    if popen.poll() is not None or not any(ready_line in line for line in proc.lines):
        proc.kill()
        raise RuntimeError(
            f"{args!r} did not print {ready_line!r} within {timeout}s "
            f"(exit {popen.returncode}); output:\n{proc.output}"
        )
    return proc


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 20.0, every: float = 0.1) -> T:
    """`fn()`'s first truthy answer, asked every `every` s; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"not within {timeout}s: {what} (last: {last!r})")


async def wait_for_async(what: str, fn: Callable[[], T | None], timeout: float = 10.0) -> T:
    """`wait_for` inside an event loop: `fn()` asked every 0.01 s, the loop running between."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout}s: {what} (last: {last!r})")


def killpg(pid: int) -> None:
    """SIGKILL a process group (an engine, an agent); nothing if it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def chat(url: str, key: str | None, model: str = "sim-model") -> int:
    """POST a short chat completion to `url` (an engine or a gateway); its HTTP status. A 2xx
    must be a chat completion."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4}).encode()
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    parts = urllib.parse.urlsplit(url)
    # http.client, its connection closed here whatever happens, not whenever urllib's response
    # objects are collected: tests/conftest.py fails a test that leaves a socket to the collector.
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.request("POST", parts.path.rstrip("/") + "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if 200 <= resp.status < 300:
        assert json.loads(data)["object"] == "chat.completion"
    return resp.status
