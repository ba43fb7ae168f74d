"""Servers the bench starts and stops, and what /proc says about them (RSS, CPU).

Every server runs in its own session, so its process group holds it and every
worker it forks (granian); stopping it signals the whole group, and its memory
and CPU are the sum over the group. psutil is not needed: /proc is enough.
Starting one (`spawn`) and picking a port (`free_port`) are the tests' own
(tests/support/procs.py): one way to run a server group in this repository.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, Self

from tests.support.procs import free_port, spawn

__all__ = ["Sampler", "Server", "cpu_seconds", "free_port", "group_pids", "http_ok", "rss_bytes"]

TICK = os.sysconf("SC_CLK_TCK")


class Server:
    """A started server process group; its output is kept for the report when it fails."""

    def __init__(
        self,
        name: str,
        args: list[str],
        port: int,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        self.name = name
        self.args = args
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.lines: list[str] = []
        self.popen = spawn(args, env, cwd)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        # Read the pipe to its end so a chatty server never blocks on a full pipe.
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if len(self.lines) < 2000:
                self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, n: int = 15) -> str:
        """The last lines the server printed."""
        return "\n".join(self.lines[-n:])

    def wait_ready(self, timeout: float, probe: str = "/health", line: str | None = None) -> None:
        """Waits until `line` was printed (if given) and GET `probe` answers 2xx; raises otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}"
                )
            if (line is None or any(line in x for x in self.lines)) and http_ok(self.port, probe):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.tail()}")

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the group, then SIGKILL whatever is left; always reaps the child."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError):  # workers that outlived the main
                    os.killpg(self.popen.pid, signal.SIGKILL)
            return


def http_ok(port: int, path: str) -> bool:
    """True when GET path on 127.0.0.1:port answers 2xx within a second."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(
                f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n".encode()
            )
            head = s.recv(64)
    except OSError:
        return False
    return head.startswith(b"HTTP/1.") and head[9:10] == b"2"


def group_pids(pgid: int) -> list[int]:
    """Every live process whose process group is `pgid`."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # Fields after the command (which may hold spaces) start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid:
            pids.append(int(d.name))
    return pids


def pin_group(pgid: int, cpus: set[int]) -> None:
    """Keeps every thread of process group `pgid` on `cpus` (threads made later inherit it)."""
    for pid in group_pids(pgid):
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue  # a process that just ended
        for tid in tids:
            with contextlib.suppress(OSError):  # a thread that just ended
                os.sched_setaffinity(tid, cpus)


def rss_bytes(pids: list[int]) -> int:
    """Sum of VmRSS over pids (processes that are gone count 0)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            pass
    return total


def cpu_seconds(pids: list[int]) -> float:
    """user+system CPU seconds used so far by pids."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total / TICK


# /proc/stat's first line, the fields after "cpu", in clock ticks over every CPU: user,
# nice, system, idle, iowait, irq, softirq, steal (guest time is inside user already).
_STAT_FIELDS = 8


def machine_ticks(text: str | None = None) -> tuple[int, ...]:
    """The whole machine's CPU time so far, in ticks (`/proc/stat`'s first line, or `text`)."""
    line = (text if text is not None else Path("/proc/stat").read_text()).split("\n", 1)[0]
    fields = line.split()
    if not fields or fields[0] != "cpu":
        raise ValueError(f"not a /proc/stat cpu line: {line[:60]!r}")
    got = [int(x) for x in fields[1:1 + _STAT_FIELDS]]
    return tuple(got + [0] * (_STAT_FIELDS - len(got)))


def busy_ticks(ticks: tuple[int, ...]) -> int:
    """Of `machine_ticks`, the time the CPUs ran something: user, nice, system, irq, softirq."""
    user, nice, system, _idle, _iowait, irq, softirq, _steal = ticks
    return user + nice + system + irq + softirq


def machine_split(before: tuple[int, ...], after: tuple[int, ...], wall_s: float) -> dict[str, float]:
    """How the whole machine spent a span, in cores (CPU seconds / wall seconds): `busy`
    (`busy_ticks`), `idle`, `iowait`, and `steal` (time the hypervisor gave this machine's
    CPUs to others: a round with steal ran on a noisy host)."""
    d = tuple(b - a for a, b in zip(before, after, strict=True))
    cores = 1.0 / TICK / wall_s if wall_s > 0 else 0.0
    return {"busy": busy_ticks(d) * cores, "idle": d[3] * cores, "iowait": d[4] * cores,
            "steal": d[7] * cores}


def _tasks(pids: list[int]) -> Iterator[tuple[int, int]]:
    """(pid, thread id) of every thread of pids (a process that just ended has none)."""
    for pid in pids:
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            yield pid, tid


def thread_cpu(pids: list[int]) -> dict[int, int]:
    """Thread id -> nanoseconds it has run so far (schedstat), over every thread of pids."""
    out: dict[int, int] = {}
    for pid, tid in _tasks(pids):
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just ended
            out[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return out


class ThreadTimes(NamedTuple):
    """What the kernel counted for one thread so far (schedstat, stat and status)."""

    run_ns: int
    """Time it ran."""
    wait_ns: int
    """Time it was runnable but waited for a CPU (on a run queue)."""
    sys_ticks: int
    """Time it ran in the kernel, in clock ticks."""
    user_ticks: int
    voluntary: int
    """Context switches it asked for (it waited for something: epoll, a lock, a futex)."""
    involuntary: int
    """Context switches the scheduler imposed (another task took its CPU)."""


def thread_times(pid: int, tid: int) -> ThreadTimes | None:
    """One thread's counters, or None once it ended."""
    base = Path(f"/proc/{pid}/task/{tid}")
    try:
        run, wait, *_ = (base / "schedstat").read_text().split()
        stat = (base / "stat").read_text()
        status = (base / "status").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    switches = {k: int(v) for k, _, v in (line.partition(":\t") for line in status.splitlines())
                if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")}
    return ThreadTimes(int(run), int(wait), int(fields[12]), int(fields[11]),
                       switches.get("voluntary_ctxt_switches", 0), switches.get("nonvoluntary_ctxt_switches", 0))


def group_cpu_ns(pgid: int) -> int:
    """Nanoseconds every thread of process group `pgid` has run so far (schedstat)."""
    return sum(thread_cpu(group_pids(pgid)).values())


class Sampler:
    """Samples a process group's RSS every `every` seconds on a thread; CPU from start to stop.

    `busiest` is what its busiest thread ran, in cores: for llmgw's gateway, the worker's
    interpreter thread, which every request passes through and which bounds its rate. Per
    request it varies far less between rounds than the whole group's CPU, which moves with
    how the two cores are shared (a comparison of two gateways' code reads it first).
    """

    def __init__(self, pgid: int, every: float = 0.25, *, detail: bool = False) -> None:
        self.pids = group_pids(pgid)
        self.every = every
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.cpu = 0.0
        self.busiest = 0.0
        self._t0 = 0.0
        self._c0 = 0.0
        self._threads: dict[int, int] = {}
        self.detail = detail
        self._busiest_before: dict[int, tuple[int, ThreadTimes]] | None = None
        self.busiest_delta: ThreadTimes | None = None
        """With `detail`: what the kernel counted for the busiest thread over the span (its
        waits for a CPU, kernel time and context switches), to tell a slow round's cause."""

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(rss_bytes(self.pids))

    def __enter__(self) -> Self:
        self._t0, self._c0 = time.perf_counter(), cpu_seconds(self.pids)
        if self.detail:
            # Every thread's counters, so that the busiest one's can be told at the end; its
            # run times are what `busiest` is worked out from, read once.
            self._busiest_before = {tid: (pid, t) for pid, tid in _tasks(self.pids)
                                    if (t := thread_times(pid, tid)) is not None}
            self._threads = {tid: t.run_ns for tid, (_, t) in self._busiest_before.items()}
        else:
            self._threads = thread_cpu(self.pids)
        self.samples.append(rss_bytes(self.pids))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(rss_bytes(self.pids))
        wall = time.perf_counter() - self._t0
        self.cpu = (cpu_seconds(self.pids) - self._c0) / wall if wall > 0 else 0.0
        # Read after the wall time stops: the spans the threads are read over lie within it.
        ran = {tid: ns - self._threads.get(tid, 0) for tid, ns in thread_cpu(self.pids).items()}
        wall = time.perf_counter() - self._t0
        self.busiest = max(ran.values(), default=0) / 1e9 / wall if wall > 0 else 0.0
        if ran and self._busiest_before is not None:
            tid = max(ran, key=ran.__getitem__)
            if (marked := self._busiest_before.get(tid)) is not None:
                pid, before = marked
                if (after := thread_times(pid, tid)) is not None:
                    self.busiest_delta = ThreadTimes(*(a - b for a, b in zip(after, before, strict=True)))

    @property
    def rss_max_mb(self) -> float:
        return max(self.samples, default=0) / 2**20

    @property
    def rss_end_mb(self) -> float:
        return (self.samples[-1] if self.samples else 0) / 2**20
