"""Running a coroutine against a migrated store from a synchronous test."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from llmgw.store import Database, connect, migrate

T = TypeVar("T")


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
