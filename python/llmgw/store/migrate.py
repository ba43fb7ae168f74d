"""Numbered migrations, applied in order at start, each exactly once.

`migrations/NNNN_name.sql` holds SQL both backends run; where a statement must
differ, `NNNN_name.sqlite.sql` or `NNNN_name.postgres.sql` replaces the common
file for that backend. A file once released is never edited: a change is a new
number. Several control planes may start together against one PostgreSQL, so
there the whole run holds an advisory lock.
"""

from __future__ import annotations

import re
import time
from importlib import resources

from .db import Database, StoreError

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+?)(?:\.(sqlite|postgres))?\.sql$")
# An arbitrary constant shared by every llmgw control plane: the advisory lock's key.
_LOCK_KEY = 7_366_621_120_233

_TABLE = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
);"""


def available(dialect: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration for `dialect`, in order."""
    chosen: dict[int, tuple[str, str, bool]] = {}
    for entry in resources.files("llmgw.store.migrations").iterdir():
        m = _NAME.match(entry.name)
        if m is None:
            continue
        version, name, only = int(m.group(1)), m.group(2), m.group(3)
        if only is not None and only != dialect:
            continue
        prev = chosen.get(version)
        if prev is not None and prev[0] != name:
            raise StoreError(f"two migrations are numbered {version:04d} ({prev[0]}, {name}); renumber one")
        if prev is None or only is not None:
            chosen[version] = (name, entry.read_text(), only is not None)
    return [(v, chosen[v][0], chosen[v][1]) for v in sorted(chosen)]


async def migrate(db: Database) -> list[int]:
    """Applies the migrations not applied yet; returns their numbers."""
    done: list[int] = []
    async with db.transaction() as tx:
        if tx.dialect == "postgres":
            await tx.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await tx.script(_TABLE)
        applied = {int(r[0]) for r in await tx.fetch("SELECT version FROM schema_migrations")}
        known = available(tx.dialect)
        newest = max((v for v, _, _ in known), default=0)
        ahead = [v for v in applied if v > newest]
        if ahead:
            raise StoreError(f"the store has migration {max(ahead):04d}, newer than this llmgw knows "
                             f"({newest:04d}); run the llmgw version that wrote it, or newer")
        for version, name, sql in known:
            if version in applied:
                continue
            await tx.script(sql)
            await tx.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
                             version, name, time.time())
            done.append(version)
    return done
