"""Exact usage: one record per request, the hourly rollup, and settling what dead gateways left open.

The counting rule. A request is `open` (announced in a row of `open_batches`), then
`final` or `interrupted` (a record; where each is kept is said below), and what it adds
to the rollups is a function of its record alone:

- open: nothing (the request has not finished; its tokens are unknown);
- final: 1 request, 1 error unless its status is `ok`, its prompt and completion
  tokens, in the hour it started, under its org, team, project, user, key, model;
- interrupted: the same with status `interrupted` (an error), the open's prompt
  estimate and 0 completion tokens.

Every change of state adds (new contribution - old contribution) to the rollups in
the same transaction, so they always equal the sum over the rows. States only move
forward: open -> interrupted -> final, or open -> final. A final row never changes
again (the first final wins; later copies are ignored), an interrupted row changes
only into a final, and an open counts for nothing until a settle finds no finished
row for it (a late open, after its final or after an earlier settle, is dropped
there). So, whatever the order, repetition or interleaving of opens, finals and
settles:

- open then final, or final alone, or final then a late open: counted once, as final;
- open, settle, then the final after all: counted as interrupted, then corrected
  (minus the interrupted contribution, plus the final one): once, as final;
- open, settle, no final: counted once, as interrupted.

Opens are kept one row per batch (`open_batches`), not per request: settling reads a
silent gateway's rows, and compaction (`compact_opens`) drops the opens of requests
that finished, so a live gateway's rows stay as few as its running requests.

Races between control planes sharing one PostgreSQL: ingests hold a shared advisory
lock and settles an exclusive one, so no row turns interrupted between the moment an
ingest reads it and the moment it writes it; two ingests of the same final both try
`INSERT INTO request_ids .. ON CONFLICT DO NOTHING`, and only the one whose write
happened gets the id back and counts it. SQLite has a single writer.

Where records are: a final in `request_batches` (one row per posted batch, its records as
the gateway encoded them) and `request_ids` (the batch of each request id); an
interrupted request in `requests`, until its final replaces it (as are finals stored
before migration 0007). Retention finds a post's id rows from the ids in its text.

One corner is accepted: a final arriving after retention deleted its row counts
again; retention is days, a gateway holds records for seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmgw.protocol import wire

from .db import Database, Row
from .snapshot import touch_keys
from .usage_post import Group, Post, from_batch, group_key
from .usage_report import (
    DIMENSIONS,
    ExportRow,
    Period,
    ScopeKind,
    ScopeUsage,
    export,
    hour_of,
    month_of,
    usage_by_scope,
)
from .usage_rows import (
    Delta,
    add_to_rollups,
    bulk_insert,
    drop_batches,
    encode_opens,
    finished,
    id_list,
    read_opens,
    request_rows,
    write_bodies,
    write_finals,
    write_opens,
)

__all__ = [
    "DIMENSIONS",
    "ExportRow",
    "IngestResult",
    "Period",
    "Post",
    "ScopeKind",
    "ScopeUsage",
    "compact_opens",
    "export",
    "hour_of",
    "ingest",
    "month_of",
    "prune",
    "settle_gateway",
    "settle_stale",
    "usage_by_scope",
]

PRUNE_POSTS = 64
"""Posts deleted per retention transaction."""
# Shared by every control plane on one PostgreSQL: ingests take it shared, settles exclusive.
_SETTLE_LOCK = 7_366_621_120_234


@dataclass(frozen=True)
class IngestResult:
    """What one batch changed."""

    counted: int
    """Requests whose final record was counted for the first time."""
    corrected: int
    """Of those, requests that had been counted as interrupted and were corrected."""
    duplicates: int
    """Final records ignored because their request was already final."""
    opens: int
    """Open records received (an open whose request exists already changes nothing)."""


def _add(
    delta: Delta,
    key: tuple[int, str, str, str, str, str, str],
    sign: int,
    error: bool,
    prompt: int,
    completion: int,
) -> None:
    acc = delta.setdefault(key, [0, 0, 0, 0])
    acc[0] += sign
    acc[1] += sign if error else 0
    acc[2] += sign * prompt
    acc[3] += sign * completion


def _add_groups(delta: Delta, groups: list[Group]) -> None:
    """Adds a post's rollup sums (`usage_post.Group`: the key, then the four sums)."""
    for g in groups:
        acc = delta.setdefault(g[:7], [0, 0, 0, 0])
        acc[0] += g[7]
        acc[1] += g[8]
        acc[2] += g[9]
        acc[3] += g[10]


def _add_record(delta: Delta, rec: wire.UsageRecord, sign: int) -> None:
    """Adds (sign=1) or takes back (sign=-1) what one final record contributes."""
    _add(delta, group_key(rec), sign, rec.status != "ok", rec.prompt_tokens, rec.completion_tokens)


def _add_row(delta: Delta, row: Row, sign: int) -> None:
    """Adds (sign=1) or takes back (sign=-1) what a finished row contributes."""
    key = (
        hour_of(row["started_at"]),
        row["org_id"] or "",
        row["team_id"] or "",
        row["project_id"] or "",
        row["user_id"] or "",
        row["key_id"] or "",
        row["model"],
    )
    _add(
        delta,
        key,
        sign,
        row["status"] != "ok",
        int(row["prompt_tokens"]),
        int(row["completion_tokens"]),
    )


def _unfinished(prior: dict[str, Row], request_id: str) -> bool:
    """Whether a final for this request may count: it has no `requests` row, or an
    interrupted one (its id row, written next, tells whether it was final already)."""
    row = prior.get(request_id)
    return row is None or row["state"] != "final"


async def ingest(db: Database, post: Post | wire.UsageBatch, now: float) -> IngestResult:
    """Stores one gateway post and updates the rollups, all in one transaction.

    Finals are stored (by post) unless their request is final already, replacing an
    interrupted row; the post's opens are stored as one row (settling and compaction drop
    those whose request finished); the rollups move only for the finals written (see the
    module's counting rule): by the post's native sums, less the few finals not written.
    Bodies are kept only where the record carries them. The gateway's `last_seen` becomes
    `now`, and each key's last use moves to the post's `key_last_used` (never back; see
    `store.snapshot.touch_keys`), in the same transaction.
    """
    posted = from_batch(post) if isinstance(post, wire.UsageBatch) else post
    ids = posted.ids
    opens: dict[str, wire.UsageOpen] = {}
    if posted.opens:
        ended = set(ids)
        for o in posted.opens:
            if o.request_id not in ended:  # finished within the post: the final says it all
                opens.setdefault(o.request_id, o)

    async def store(tx: Database) -> IngestResult:
        delta: Delta = {}
        counted = corrected = 0
        if tx.dialect == "postgres":
            await tx.execute("SELECT pg_advisory_xact_lock_shared($1)", _SETTLE_LOCK)
        await tx.execute(
            "INSERT INTO gateways (gateway_id, first_seen, last_seen) VALUES ($1, $2, $2) "
            "ON CONFLICT (gateway_id) DO UPDATE SET last_seen = "
            "CASE WHEN gateways.last_seen > excluded.last_seen THEN gateways.last_seen "
            "ELSE excluded.last_seen END",
            posted.gateway_id,
            now,
        )
        if ids:
            # One lock order for every transaction on PostgreSQL (no deadlock); SQLite has
            # one writer.
            order = sorted(ids) if tx.dialect == "postgres" else ids
            prior = await request_rows(tx, order)  # interrupted, or final before 0007
            todo = [i for i in order if _unfinished(prior, i)] if prior else order
            written = await write_finals(tx, posted, todo, now) if todo else set()
            if written is not None:  # some were final already: only the rest count
                todo = [i for i in todo if i in written]
            counted = len(todo)
            _add_groups(delta, posted.groups)
            if counted < len(ids):  # the sums hold every id: take back those not written now
                at = {i: n for n, i in enumerate(ids)}
                for i in set(ids).difference(todo):
                    _add_record(delta, posted.record(at[i]), -1)
            replaced = []
            for i in todo if prior else ():
                old = prior.get(i)
                if old is not None:  # it was interrupted: take back what the settle counted
                    corrected += 1
                    _add_row(delta, old, -1)
                    replaced.append(i)
            if replaced:  # the final is stored by post now; its interrupted row goes
                cond, arg = id_list(tx, replaced)
                await tx.execute(f"DELETE FROM requests WHERE id {cond}", arg)
            if posted.bodies:
                await write_bodies(tx, [(i, *posted.bodies[i]) for i in todo if i in posted.bodies])
        if opens:
            await write_opens(tx, posted.gateway_id, [opens[i] for i in sorted(opens)], now)
        await add_to_rollups(tx, delta)
        if posted.key_last_used:
            await touch_keys(tx, posted.key_last_used)
        return IngestResult(
            counted=counted, corrected=corrected, duplicates=len(ids) - counted, opens=len(opens)
        )

    # One hand-off to SQLite's thread for the whole post, not one per statement.
    return await db.run_transaction(store)


# An interrupted row: the open's fields, the prompt estimate as its prompt tokens, nothing else.
_SETTLED_COLS = (
    ("id", "text"),
    ("state", "text"),
    ("gateway_id", "text"),
    ("org_id", "text"),
    ("team_id", "text"),
    ("project_id", "text"),
    ("user_id", "text"),
    ("key_id", "text"),
    ("model", "text"),
    ("started_at", "float8"),
    ("status", "text"),
    ("prompt_estimate", "int8"),
    ("prompt_tokens", "int8"),
    ("usage_estimated", "int4"),
    ("updated_at", "float8"),
)


async def _settle(db: Database, where: str, arg: Any, now: float) -> int:
    """Turns the opens of matching open_batches rows into interrupted rows and counts them,
    except for requests that finished meanwhile (their final, or a late open's)."""
    async with db.transaction() as tx:
        if tx.dialect == "postgres":
            # Exclusive: no ingest runs meanwhile, so what `finished` reads stays true.
            await tx.execute("SELECT pg_advisory_xact_lock($1)", _SETTLE_LOCK)
        rows = await tx.fetch(
            f"DELETE FROM open_batches WHERE {where} RETURNING gateway_id, opens", arg
        )
        opens: dict[str, tuple[str, wire.UsageOpen]] = {}
        for row in rows:
            for o in read_opens(row["opens"]):
                opens.setdefault(o.request_id, (row["gateway_id"], o))
        if not opens:
            return 0
        done = await finished(tx, sorted(opens))
        fresh = [opens[i] for i in sorted(opens) if i not in done]
        delta: Delta = {}
        for _, o in fresh:
            _add(delta, group_key(o), 1, True, o.prompt_estimate, 0)
        if fresh:
            await bulk_insert(
                tx,
                "INSERT INTO requests",
                _SETTLED_COLS,
                [
                    (
                        o.request_id,
                        "interrupted",
                        g,
                        o.org_id,
                        o.team_id,
                        o.project_id,
                        o.user_id,
                        o.key_id,
                        o.model,
                        o.started_at,
                        "interrupted",
                        o.prompt_estimate,
                        o.prompt_estimate,
                        1,
                        now,
                    )
                    for g, o in fresh
                ],
                "ON CONFLICT (id) DO NOTHING",
            )
            await add_to_rollups(tx, delta)
    return len(fresh)


async def compact_opens(db: Database, older_than: float) -> int:
    """Drops, from open_batches rows received before `older_than`, the requests that have
    finished, and the rows left empty; returns how many opens remain in those rows.

    Without it a live gateway's rows would pile up forever. It changes no count: a
    finished request is counted by its record (its id row, or its `requests` row) whatever
    happens to its open. Ingests only ever finish requests (an interrupted row gives way
    to its final in one transaction, and `finished` reads both tables in one statement),
    so this runs beside them (shared lock); settles, which delete rows, wait (and are
    waited for).
    """
    async with db.transaction() as tx:
        if tx.dialect == "postgres":
            await tx.execute("SELECT pg_advisory_xact_lock_shared($1)", _SETTLE_LOCK)
        rows = await tx.fetch(
            "SELECT id, opens FROM open_batches WHERE received_at < $1", older_than
        )
        if not rows:
            return 0
        batches = [(r["id"], read_opens(r["opens"])) for r in rows]
        done = await finished(tx, sorted({o.request_id for _, os in batches for o in os}))
        empty, left = [], 0
        for bid, os in batches:
            keep = [o for o in os if o.request_id not in done]
            left += len(keep)
            if not keep:
                empty.append(bid)
            elif len(keep) < len(os):
                await tx.execute(
                    "UPDATE open_batches SET opens = $2 WHERE id = $1", bid, encode_opens(keep)
                )
        if empty:
            cond, arg = id_list(tx, empty)
            await tx.execute(f"DELETE FROM open_batches WHERE id {cond}", arg)
    return left


async def settle_gateway(db: Database, gateway_id: str, now: float) -> int:
    """Marks the open requests of one gateway `interrupted` and counts them once; returns how many.

    For a gateway known to be gone (it said goodbye, or an operator says so). A final
    arriving afterwards still corrects the row and the rollups.
    """
    return await _settle(db, "gateway_id = $1", gateway_id, now)


async def settle_stale(db: Database, silent_for: float, now: float) -> int:
    """Settles the open requests of every gateway not heard from for `silent_for` seconds.

    Gateways send a batch (empty when idle) every fraction of a second, so silence means
    the worker died; run this periodically with `silent_for` of several batch intervals.
    """
    return await _settle(
        db,
        "gateway_id IN (SELECT gateway_id FROM gateways WHERE last_seen < $1)",
        now - silent_for,
        now,
    )


async def prune(db: Database, older_than: float) -> int:
    """Deletes finished request rows (and their bodies) started before `older_than` (unix
    seconds); the rollups keep their counts. Open rows wait for their final or settle.
    Returns how many requests went."""
    async with db.transaction() as tx:
        await tx.execute(
            "DELETE FROM request_bodies WHERE request_id IN "
            "(SELECT id FROM requests WHERE started_at < $1)",
            older_than,
        )
        n = await tx.execute("DELETE FROM requests WHERE started_at < $1", older_than)
        await tx.execute(
            "DELETE FROM gateways WHERE last_seen < $1 AND NOT EXISTS (SELECT 1 FROM "
            "open_batches o WHERE o.gateway_id = gateways.gateway_id)",
            older_than,
        )
    # Finals stored by post go a post at a time, once every request in it is past; in
    # transactions of a few posts, so that a first prune after a long retention neither holds
    # the store nor reads every expired post at once.
    while True:
        async with db.transaction() as tx:
            posts, gone = await drop_batches(tx, older_than, PRUNE_POSTS)
        n += gone
        if posts < PRUNE_POSTS:
            return n
