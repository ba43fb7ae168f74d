"""Usage on the control plane: ingesting gateways' batches and settling what a dead gateway left.

Attached at start (see `ATTACH` in control/server.py). Ingestion runs as the
internal route receives a batch; two loops run beside it: settling the open
requests of gateways gone silent (so a gateway killed with SIGKILL leaves no
request unaccounted) and compacting the opens of live ones, and pruning request
rows past their retention (the hourly rollups are kept, so usage reports never
lose history).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from llmgw.store import StoreError
from llmgw.store.usage import Post, compact_opens, ingest, prune, settle_stale
from llmgw.store.usage_report import tokens_used

if TYPE_CHECKING:
    from .server import ControlPlane

log = logging.getLogger("llmgw.control")

SETTLE_EVERY = 2.0
COMPACT_AFTER = 10.0
"""Age of an open_batches row before compaction looks at it: most of its requests ended."""
PRUNE_EVERY = 3600.0


async def attach(cp: ControlPlane) -> None:
    """Sets `cp.ingest_usage` and `cp.used_tokens`, and starts the settle and prune loops."""

    async def ingest_usage(post: Post) -> None:
        started = time.perf_counter()
        try:
            result = await ingest(cp.db, post, time.time())
        except StoreError:
            cp.metrics.ingest_failed()
            raise
        cp.metrics.ingested(post.gateway_id, result, time.perf_counter() - started)

    async def used_tokens(scope: str, period_start: float) -> int:
        return await tokens_used(cp.db, scope, period_start)

    cp.ingest_usage = ingest_usage
    # Read by the limits authority when it (re)learns a budget's scope; attach order in
    # ATTACH puts this part first.
    cp.used_tokens = used_tokens
    cp.spawn(_settle(cp), "usage-settle")
    cp.spawn(_prune(cp), "usage-prune")


async def _settle(cp: ControlPlane) -> None:
    while True:
        await asyncio.sleep(SETTLE_EVERY)
        now = time.time()
        try:
            n = await settle_stale(cp.db, cp.settings.gateway_silent_for, now)
            # A live gateway's batches leave a row of opens each; without this they piled up
            # for as long as it ran (a row per post), and its next settle read all of them.
            await compact_opens(cp.db, now - COMPACT_AFTER)
        except StoreError as e:
            # The store may be restarting; the next pass settles the same rows.
            log.warning("could not settle or compact open requests: %s", e)
            continue
        if n:
            cp.metrics.settled(n)
            log.warning("settled %d requests left open by gateways silent for %.0fs as interrupted",
                        n, cp.settings.gateway_silent_for)


async def _prune(cp: ControlPlane) -> None:
    while True:
        try:
            n = await prune(cp.db, time.time() - cp.settings.request_retention)
            if n:
                log.info("pruned %d request records older than the retention", n)
        except StoreError as e:
            log.warning("could not prune old request records: %s", e)
        await asyncio.sleep(PRUNE_EVERY)
