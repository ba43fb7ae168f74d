"""Running a coroutine against a migrated store from a synchronous test, and the key of its
key hashes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from llmgw.secrets.keys import derive
from llmgw.store import Database, connect, migrate

T = TypeVar("T")

HASH_KEY = derive(b"s" * 32, "llmgw api-key hash v1")
"""The key of key hashes, as a data dir's secret gives it, for tests that make keys."""


def with_db(url: str, fn: Callable[[Database], Awaitable[T]]) -> T:
    """Opens the store at `url`, applies the migrations, runs `fn(db)`, closes it."""

    async def main() -> T:
        db = await connect(url)
        try:
            await migrate(db)
            return await fn(db)
        finally:
            await db.close()

    return asyncio.run(main())
