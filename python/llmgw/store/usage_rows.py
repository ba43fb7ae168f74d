"""Writing usage rows in bulk, one statement per table and batch, on each backend.

SQLite runs in-process: `executemany` of one VALUES statement is one C loop with no
round trips. PostgreSQL gets one statement per table: asyncpg's executemany sends a
statement per row, and unnest() of one array per column spent most of its time in
asyncpg checking every array element (an `isinstance` per value, about 20 µs per
record). Finals, the bulk of a batch, are one row per batch and a narrow id row per
request (`write_finals`); on PostgreSQL the ids go by binary COPY into a temporary table
and one INSERT .. SELECT.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import msgspec

from llmgw.protocol import wire

from .db import Database, Row
from .usage_post import Post
from .usage_report import DAY

Delta = dict[tuple[int, str, str, str, str, str, str], list[int]]
"""(hour, org, team, project, user, key, model) -> [requests, errors, prompt, completion]."""

_json = msgspec.json.Encoder()


async def bulk_insert(
    tx: Database, head: str, cols: Sequence[tuple[str, str]], rows: list[tuple[Any, ...]], tail: str
) -> None:
    """`INSERT INTO t (cols) <rows> tail` for a few rows of plain values (rollups, bodies).

    `cols` pairs each column with its PostgreSQL type, for the unnest() arrays.
    """
    names = ", ".join(c for c, _ in cols)
    if tx.dialect == "postgres":
        arrays = ", ".join(f"${i}::{t}[]" for i, (_, t) in enumerate(cols, 1))
        await tx.execute(
            f"{head} ({names}) SELECT * FROM unnest({arrays}) {tail}",
            *[list(c) for c in zip(*rows, strict=True)],
        )
        return
    await tx.insert_values(f"{head} ({names})", rows, tail)


# Finals (migration 0007): a post's records as one `request_batches` row, the JSON array of
# their wire.UsageRow arrays as posted, with no kept bodies (those go to request_bodies), and
# one `request_ids` row per request naming its batch. The id row is what counts: the first
# final of a request writes it, and a later copy (a batch sent again, another control
# plane's ingest) finds it taken and is not counted; its batch row may still hold the copy,
# which no id row points to and readers skip. Within one batch, the first row of an id is
# its record (a post is stored as sent, repeats included).
_rows_decoder = msgspec.json.Decoder(list[wire.UsageRow])

# PostgreSQL: the id rows land in a temporary table by binary COPY, then move with one
# insert that returns the ids it wrote. The table is per connection and emptied at each
# commit; CREATE .. IF NOT EXISTS runs in every transaction because the pool may hand out
# a connection that has not made it yet (it is a no-op after).
_IDS_IN = "usage_ids_in"
_IDS_IN_TABLE = f"CREATE TEMPORARY TABLE IF NOT EXISTS {_IDS_IN} (LIKE request_ids) ON COMMIT DELETE ROWS"
_IDS_PG = (
    f"INSERT INTO request_ids (id, batch) SELECT id, batch FROM {_IDS_IN} "
    "ON CONFLICT (id) DO NOTHING RETURNING id"
)


async def write_finals(tx: Database, post: Post, ids: list[str], now: float) -> set[str] | None:
    """Stores a post's finished requests: its rows in one batch row, and an id row for each
    of `ids` that has none yet (`ids` must hold no request already final in `requests`).

    Returns None when every id row was written, else the ids whose row was (the others
    were final already: a post sent again, or another control plane's ingest first). The
    insert is the check, so a post of new requests costs no lookup. An interrupted row a
    final replaces is the caller's to delete.
    """
    batch = await tx.fetchval(
        "INSERT INTO request_batches (gateway_id, received_at, started_max, rows) "
        "VALUES ($1, $2, $3, $4) RETURNING id",
        post.gateway_id,
        now,
        post.started_max,
        post.rows,
    )
    pairs = [(i, batch) for i in ids]
    if tx.dialect == "postgres":
        await tx.execute(_IDS_IN_TABLE)
        await tx.copy_records(_IDS_IN, ("id", "batch"), pairs)
        written = {r["id"] for r in await tx.fetch(_IDS_PG)}
        return None if len(written) == len(ids) else written
    n = await tx.insert_values("INSERT INTO request_ids (id, batch)", pairs, "ON CONFLICT (id) DO NOTHING")
    if n == len(ids):
        return None
    cond, arg = id_list(tx, ids)
    return {r["id"] for r in await tx.fetch(f"SELECT id FROM request_ids WHERE id {cond} AND batch = $2",
                                            arg, batch)}


class _RowId(msgspec.Struct, array_like=True):
    """The first field of a stored row (its request id); msgspec skips the rest unread."""

    request_id: str


_row_ids = msgspec.json.Decoder(list[_RowId])


async def drop_batches(tx: Database, older_than: float, limit: int) -> tuple[int, int]:
    """Deletes up to `limit` posts whose requests all started before `older_than`, with the
    id rows and bodies of the requests each one stored: (posts, requests) deleted.

    A post's ids are read from its own text (there is no index by batch: each stored id
    would pay for it); an id whose row names another post (a final posted twice) stays.
    """
    posts = await tx.fetch(
        "DELETE FROM request_batches WHERE id IN (SELECT id FROM request_batches WHERE started_max < $1 "
        "ORDER BY id LIMIT $2) RETURNING id, rows",
        older_than,
        limit,
    )
    gone: list[str] = []
    for p in posts:
        cond, arg = id_list(tx, [r.request_id for r in _row_ids.decode(p["rows"])])
        deleted = await tx.fetch(f"DELETE FROM request_ids WHERE id {cond} AND batch = $2 RETURNING id", arg, p["id"])
        gone += [r["id"] for r in deleted]
    if gone:
        cond, arg = id_list(tx, gone)
        await tx.execute(f"DELETE FROM request_bodies WHERE request_id {cond}", arg)
    return len(posts), len(gone)


async def stored_final(db: Database, request_id: str) -> tuple[str, wire.UsageRow] | None:
    """(gateway id, record) of a request whose final is stored by batch, or None."""
    r = await db.fetchrow(
        "SELECT b.gateway_id, b.rows FROM request_ids i JOIN request_batches b ON b.id = i.batch "
        "WHERE i.id = $1",
        request_id,
    )
    if r is None:
        return None
    for rec in _rows_decoder.decode(r["rows"]):
        if rec.request_id == request_id:
            return r["gateway_id"], rec
    return None


async def write_bodies(tx: Database, bodies: list[tuple[str, str | None, str | None]]) -> None:
    """Keeps kept bodies: (request id, request body, response body) each."""
    if bodies:
        await bulk_insert(
            tx,
            "INSERT INTO request_bodies",
            (("request_id", "text"), ("request", "text"), ("response", "text")),
            bodies,
            "ON CONFLICT (request_id) DO NOTHING",
        )


async def write_opens(
    tx: Database, gateway_id: str, opens: list[wire.UsageOpen], now: float
) -> None:
    """Stores a batch's opens as one row. A late open (its request finished already) is
    stored too and dropped when settled or compacted, where `finished` is checked."""
    await tx.execute(
        "INSERT INTO open_batches (id, gateway_id, received_at, opens) VALUES ($1, $2, $3, $4)",
        secrets.token_hex(12),
        gateway_id,
        now,
        encode_opens(opens),
    )


def encode_opens(opens: list[wire.UsageOpen]) -> str:
    """The JSON an open_batches row holds."""
    return _json.encode(opens).decode()


def read_opens(text: str) -> list[wire.UsageOpen]:
    """The opens of one open_batches row."""
    return _opens_decoder.decode(text)


_opens_decoder = msgspec.json.Decoder(list[wire.UsageOpen])


async def find_open(db: Database, request_id: str) -> tuple[str, wire.UsageOpen] | None:
    """(gateway id, open) of a request still running, or None.

    A text search over the batches' JSON: they hold the last minutes of opens only
    (compaction drops finished ones), and this serves one admin lookup, not ingestion.
    """
    needle = '"request_id":' + _json.encode(request_id).decode()
    find = "strpos(opens, $1) > 0" if db.dialect == "postgres" else "instr(opens, $1) > 0"
    for row in await db.fetch(f"SELECT gateway_id, opens FROM open_batches WHERE {find}", needle):
        for o in read_opens(row["opens"]):
            if o.request_id == request_id:
                return row["gateway_id"], o
    return None


def id_list(tx: Database, ids: list[str]) -> tuple[str, Any]:
    """A condition `id IN <these ids>` and its one argument ($1): an array on PostgreSQL,
    a JSON array on SQLite (which has no array parameters; json_each reads it in C)."""
    if tx.dialect == "postgres":
        return "= ANY($1::text[])", ids
    return "IN (SELECT value FROM json_each($1))", _json.encode(ids).decode()


ROW_COLS = (
    "id, state, started_at, org_id, team_id, project_id, user_id, key_id, model, "
    "status, prompt_tokens, completion_tokens"
)
"""What `request_rows` reads: enough to take back what a row contributed."""


async def request_rows(tx: Database, ids: list[str]) -> dict[str, Row]:
    """The `requests` rows of these ids: interrupted requests, and finals stored before
    migration 0007. Without a lookup when the table is empty, as it is on a store made
    since then while no gateway has died."""
    if not await tx.fetchval("SELECT EXISTS (SELECT 1 FROM requests)"):
        return {}
    cond, arg = id_list(tx, ids)
    return {r["id"]: r for r in await tx.fetch(f"SELECT {ROW_COLS} FROM requests WHERE id {cond}", arg)}


async def finished(tx: Database, ids: list[str]) -> set[str]:
    """The ids among these whose request has a finished record: a final (by batch, or a
    `requests` row from before migration 0007) or an interrupted row. What settling and
    compaction ask: whether an open still stands, not what the record holds."""
    cond, arg = id_list(tx, ids)
    rows = await tx.fetch(
        f"SELECT id FROM request_ids WHERE id {cond} UNION SELECT id FROM requests WHERE id {cond}", arg
    )
    return {r["id"] for r in rows}


_ROLLUP_COLS = (
    ("org_id", "text"),
    ("team_id", "text"),
    ("project_id", "text"),
    ("user_id", "text"),
    ("key_id", "text"),
    ("model", "text"),
    ("requests", "int8"),
    ("errors", "int8"),
    ("prompt_tokens", "int8"),
    ("completion_tokens", "int8"),
)
_ROLLUP_TAIL = (
    "ON CONFLICT ({first}, org_id, team_id, project_id, user_id, key_id, model) DO UPDATE SET "
    "requests = {table}.requests + excluded.requests, "
    "errors = {table}.errors + excluded.errors, "
    "prompt_tokens = {table}.prompt_tokens + excluded.prompt_tokens, "
    "completion_tokens = {table}.completion_tokens + excluded.completion_tokens"
)


async def add_to_rollups(tx: Database, delta: Delta) -> None:
    """Adds hourly deltas to usage_hourly and, summed by day, to usage_daily.

    Rows are written in key order so that concurrent ingests lock them in the same
    order (no deadlock); all-zero deltas (a correction that changed nothing) are skipped.
    """
    daily: Delta = {}
    for k, v in delta.items():
        acc = daily.setdefault(
            (k[0] - k[0] % DAY, k[1], k[2], k[3], k[4], k[5], k[6]), [0, 0, 0, 0]
        )
        for i in range(4):
            acc[i] += v[i]
    for table, first, d in (("usage_hourly", "hour", delta), ("usage_daily", "day", daily)):
        rows = [(*k, *v) for k, v in sorted(d.items()) if any(v)]
        if rows:
            await bulk_insert(
                tx,
                f"INSERT INTO {table}",
                ((first, "int8"), *_ROLLUP_COLS),
                rows,
                _ROLLUP_TAIL.format(table=table, first=first),
            )
