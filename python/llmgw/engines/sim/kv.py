"""The seam for KV-cache events: the prefix cache reports stores and evictions here.

`NullSink` (the default) drops them; a later publisher (e.g. vLLM-style ZMQ KV
events) implements `KvEventSink` and is handed to `PrefixCache`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class KvEventSink(Protocol):
    """Receiver of prefix-cache block events, shaped like vLLM's KV events."""

    def blocks_stored(
        self,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
    ) -> None:
        """A contiguous run of full blocks was stored; `parent_hash` precedes the first."""

    def blocks_removed(self, block_hashes: Sequence[int]) -> None:
        """Blocks were evicted."""

    def all_cleared(self) -> None:
        """The whole cache was dropped."""

    def flush(self) -> None:
        """The events so far form one batch (one engine step): send them."""


class NullSink:
    """A `KvEventSink` that ignores every event (the default: nobody listens)."""

    def blocks_stored(
        self,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
    ) -> None:
        """Ignore stored blocks."""

    def blocks_removed(self, block_hashes: Sequence[int]) -> None:
        """Ignore evictions."""

    def all_cleared(self) -> None:
        """Ignore a clear."""

    def flush(self) -> None:
        """Nothing to send."""


class RecordingSink:
    """A `KvEventSink` that keeps events in a list (for tests and debugging)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[object, ...]]] = []

    def blocks_stored(
        self,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
    ) -> None:
        """Record a store."""
        self.events.append(
            ("stored", (list(block_hashes), parent_hash, list(token_ids), block_size))
        )

    def blocks_removed(self, block_hashes: Sequence[int]) -> None:
        """Record an eviction."""
        self.events.append(("removed", (list(block_hashes),)))

    def all_cleared(self) -> None:
        """Record a clear."""
        self.events.append(("cleared", ()))

    def flush(self) -> None:
        """Record a batch boundary."""
        self.events.append(("flush", ()))
