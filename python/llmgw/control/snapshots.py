"""The snapshot publisher: the gateways' view of keys and limits, and the long-poll that pushes it.

The leading control plane calls `refresh(build)` after every admin change and once a
second; gateways wait in `GET /internal/v1/snapshot?after=N` and are answered as
soon as the version differs from N. A revoked key therefore reaches every gateway
worker within one round trip of the change.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from llmgw.control.periodic import run_periodically
from llmgw.protocol.wire import Snapshot

POLL_WAIT = 20.0
"""Longest a long-poll waits for a change before answering with the same version."""
REFRESH_EVERY = 1.0
"""The snapshot is rebuilt at least this often, so a change made without a poke (a key that
expired, a change by another control plane on the same store) reaches gateways within it."""


class SnapshotPublisher:
    """Holds the current snapshot (and its JSON) and wakes the gateways waiting for a newer one."""

    def __init__(self) -> None:
        self.current: Snapshot | None = None
        self.encoded = b""
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()
        self._poke = asyncio.Event()
        self.parts: list[Callable[[Snapshot], Snapshot]] = []
        """Other parts' additions to every snapshot built (the fleet's models and replicas),
        applied in order after the store's; see `add_part`."""

    def add_part(self, part: Callable[[Snapshot], Snapshot]) -> None:
        """Adds `part(snapshot) -> snapshot` to every build. A part must not change what it
        adds without bumping the store's snapshot version, or gateways never see it."""
        self.parts.append(part)

    @property
    def version(self) -> int | None:
        """The version published, or None before the first refresh."""
        return None if self.current is None else self.current.version

    async def refresh(self, build: Callable[[], Awaitable[Snapshot]]) -> bool:
        """Builds the snapshot and publishes it when its version changed; True when it did."""
        async with self._lock:  # two refreshes must not publish out of order
            snap = await build()
            if self.current is not None and snap.version == self.current.version:
                return False
            self.publish(snap)
            return True

    def publish(self, snap: Snapshot) -> None:
        """Makes `snap` current and answers every waiting long-poll."""
        self.current = snap
        self.encoded = msgspec.json.encode(snap)
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait(self, after: int | None, timeout: float = POLL_WAIT) -> bytes | None:
        """The snapshot's JSON once its version is not `after` (at once if it already is not).

        After `timeout` seconds without a change it answers the same version again;
        None when nothing was ever published. A version lower than `after` is
        answered too: a control plane restored from a backup must not leave its
        gateways waiting for a version that never comes.
        """
        if self.current is not None and self.current.version != after:
            return self.encoded
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        return self.encoded if self.current is not None else None

    def poke(self) -> None:
        """Asks `follow` to rebuild now (after an admin change), not at its next second."""
        self._poke.set()

    async def follow(self, build: Callable[[], Awaitable[Snapshot]], every: float = REFRESH_EVERY) -> None:
        """Refreshes on every `poke()` and at least every `every` seconds, forever.

        A failing build (the store unreachable) keeps the last snapshot published:
        gateways go on with the keys they have rather than with none.
        """
        await run_periodically(self._poke, every, lambda: self.refresh(build),
                               "cannot build the gateways' snapshot (%d failures in a row); "
                               "they keep the last one")


async def attach(cp: Any) -> None:
    """Control plane part (see `llmgw.control.server.ATTACH`): `cp.snapshots`, built from the store."""
    from llmgw.store.snapshot import build_snapshot

    pub = SnapshotPublisher()

    async def build() -> Snapshot:
        snap = await build_snapshot(cp.db)
        for part in pub.parts:
            snap = part(snap)
        return snap

    await pub.refresh(build)
    cp.snapshots = pub
    cp.spawn(pub.follow(build), "snapshots")
