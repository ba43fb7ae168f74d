"""Per-request fault injection, chosen by the `x-sim-fault` request header.

Several faults may be combined with commas, e.g. `slow=20,reset-after=3`.
"""

from __future__ import annotations

from functools import lru_cache

import msgspec

from llmgw.net.connections import TcpDiag, address

HEADER = "x-sim-fault"

FAULT_HELP = "fail, fail=CODE, hang, hang-after=N, reset, reset-after=N, slow=MS, error-after=N"


class FaultError(ValueError):
    """The header named a fault that does not exist or had a bad argument."""


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    """What to break in one request; `None` fields are inactive."""

    fail: int | None = None  # answer this HTTP status at once
    hang: bool = False  # never answer
    hang_after: int | None = None  # stream N token events, then hang
    reset_after: int | None = None  # stream N token events, then break the connection
    slow_ms: float | None = None  # inter-token latency for this request
    error_after: int | None = None  # stream N token events, then `data: {"error": ...}`

    @property
    def needs_watch(self) -> bool:
        """True if the request may wait, so the client's disconnect must be watched."""
        return self.hang or self.hang_after is not None or bool(self.slow_ms)


def _count(name: str, arg: str | None) -> int:
    if arg is None:
        raise FaultError(f"x-sim-fault {name} needs =N")
    try:
        n = int(arg)
    except ValueError:
        raise FaultError(f"x-sim-fault {name}={arg}: N must be an integer") from None
    if n < 0:
        raise FaultError(f"x-sim-fault {name}={arg}: N must be >= 0")
    return n


@lru_cache(maxsize=256)
def parse(value: str) -> Fault:
    """Parse an `x-sim-fault` header value; raise FaultError naming the valid values."""
    kw: dict[str, object] = {}
    for item in value.split(","):
        item = item.strip().lower()
        if not item:
            continue
        name, eq, raw = item.partition("=")
        arg = raw.strip() if eq else None
        name = name.strip()
        if name == "fail":
            code = 500 if arg is None else _count(name, arg)
            if not 100 <= code <= 599:
                raise FaultError(f"x-sim-fault fail={arg}: CODE must be an HTTP status")
            kw["fail"] = code
        elif name == "hang" and arg is None:
            kw["hang"] = True
        elif name == "hang-after":
            kw["hang_after"] = _count(name, arg)
        elif name == "reset":
            kw["reset_after"] = 0 if arg is None else _count(name, arg)
        elif name == "reset-after":
            kw["reset_after"] = _count(name, arg)
        elif name == "error-after":
            kw["error_after"] = _count(name, arg)
        elif name == "slow":
            try:
                ms = float(arg) if arg is not None else -1.0
            except ValueError:
                ms = -1.0
            if not ms >= 0:
                raise FaultError(f"x-sim-fault slow needs =MS (a number >= 0), got {item!r}")
            kw["slow_ms"] = ms
        else:
            raise FaultError(f"unknown x-sim-fault {item!r}; valid values: {FAULT_HELP}")
    return Fault(**kw)  # type: ignore[arg-type]


def reset_connection(client: str, server: str) -> bool:
    """Break the TCP connection of one request, behind granian's back.

    RSGI has no way to abort a response: an exception raised after
    `response_stream` still ends the chunked body cleanly. So the connection is
    shut down by its (local, peer) addresses (`llmgw.net.connections`); the peer then
    sees EOF mid-body (no terminating chunk), or EOF before any status line if no
    response was started. Linux only. Returns False if it was not found.
    """
    local, peer = address(server), address(client)
    if local is None or peer is None:
        return False
    diag = TcpDiag()
    try:
        return diag.shutdown((local, peer))
    finally:
        diag.close()
