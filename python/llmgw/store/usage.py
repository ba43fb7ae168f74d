"""Exact usage: one row per request, the hourly rollup, and settling what dead gateways left open.

The counting rule. A request row is `open`, `final` or `interrupted`, and what it
adds to `usage_hourly` is a function of the row alone:

- open: nothing (the request has not finished; its tokens are unknown);
- final: 1 request, 1 error unless its status is `ok`, its prompt and completion
  tokens, in the hour it started, under its org, team, project, user, key, model;
- interrupted: the same with status `interrupted` (an error), the open's prompt
  estimate and 0 completion tokens.

Every change of a row's state adds (new contribution - old contribution) to the
rollup in the same transaction, so the rollup is always the sum over the rows.
The states only move forward: open -> interrupted -> final, or open -> final;
a row that is final never changes again (the first final wins, later copies of it
are ignored), and an open never overwrites anything. So, whatever the order,
repetition or interleaving of opens, finals and settles:

- open then final, or final alone, or final then a late open: counted once, as final;
- open, settle, then the final after all: counted as interrupted, then corrected
  (minus the interrupted contribution, plus the final one): once, as final;
- open, settle, no final: counted once, as interrupted.

Races between control planes sharing one PostgreSQL: ingests hold a shared advisory
lock and settles an exclusive one, so a row cannot turn interrupted between the
moment an ingest reads it and the moment it writes it; two ingests of the same
final both try `UPDATE ... WHERE state <> 'final'`, and only the one whose write
happened reports the row back and counts it. SQLite has a single writer.

One corner is accepted: a final arriving after retention deleted its row counts
again; retention is days, a gateway holds records for seconds.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from llmgw import wire

from .db import Database, Row

# Shared by every control plane on one PostgreSQL: ingests take it shared, settles exclusive.
_SETTLE_LOCK = 7_366_621_120_234

HOUR = 3600
DAY = 86_400

Period = Literal["hour", "day", "month"]
ScopeKind = Literal["org", "team", "project"]

DIMENSIONS: dict[str, str] = {
    "org": "org_id",
    "team": "team_id",
    "project": "project_id",
    "user": "user_id",
    "key": "key_id",
    "model": "model",
}
"""Export dimension -> its column in usage_hourly (and its field in ExportRow)."""


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


class ScopeUsage(msgspec.Struct, kw_only=True):
    """Usage of one org, team or project since a time."""

    scope_id: str
    """The org, team or project id; '' for requests made without a key."""
    path: str | None = None
    """`acme/ml/chat`, filled by the admin API when the scope still exists."""
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ExportRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One period and one group of the chosen dimensions; a dimension not chosen is absent."""

    period_start: float
    """Unix seconds (UTC) the hour, day or month starts at."""
    org_id: str | None = None
    team_id: str | None = None
    project_id: str | None = None
    user_id: str | None = None
    key_id: str | None = None
    model: str | None = None
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int


# (hour, org, team, project, user, key, model) -> [requests, errors, prompt, completion]
_Key = tuple[int, str, str, str, str, str, str]
_Delta = dict[_Key, list[int]]


def hour_of(t: float) -> int:
    """The unix second the UTC hour holding `t` starts at."""
    return int(t // HOUR) * HOUR


def _add(delta: _Delta, key: _Key, sign: int, error: bool, prompt: int, completion: int) -> None:
    acc = delta.setdefault(key, [0, 0, 0, 0])
    acc[0] += sign
    acc[1] += sign if error else 0
    acc[2] += sign * prompt
    acc[3] += sign * completion


def _add_record(delta: _Delta, rec: wire.UsageRecord) -> None:
    key = (
        hour_of(rec.started_at),
        rec.org_id or "",
        rec.team_id or "",
        rec.project_id or "",
        rec.user_id or "",
        rec.key_id or "",
        rec.model,
    )
    _add(delta, key, 1, rec.status != "ok", rec.prompt_tokens, rec.completion_tokens)


def _add_row(delta: _Delta, row: Row, sign: int) -> None:
    """Adds (sign=1) or takes back (sign=-1) what a settled or final row contributes."""
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


# --- bulk writes -------------------------------------------------------------------------------
# SQLite: executemany of one VALUES statement (one C loop, no round trips: it is in-process).
# PostgreSQL: one statement over unnest() of one array per column, because asyncpg's
# executemany sends a statement per row and measured several times slower at 2,000 rows.


async def _bulk(
    tx: Database,
    head: str,
    cols: Sequence[tuple[str, str]],
    rows: list[tuple[Any, ...]],
    tail: str,
    returning: str = "",
) -> list[Row] | None:
    """`INSERT INTO t (cols) <rows> tail [RETURNING]`; on PostgreSQL the returned rows, else None."""
    names = ", ".join(c for c, _ in cols)
    if tx.dialect == "postgres":
        arrays = ", ".join(f"${i}::{t}[]" for i, (_, t) in enumerate(cols, 1))
        sql = f"{head} ({names}) SELECT * FROM unnest({arrays}) {tail} {returning}"
        columns = [list(c) for c in zip(*rows, strict=True)]
        if returning:
            return await tx.fetch(sql, *columns)
        await tx.execute(sql, *columns)
        return None
    marks = ", ".join(f"${i}" for i in range(1, len(cols) + 1))
    await tx.executemany(f"{head} ({names}) VALUES ({marks}) {tail}", rows)
    return None


_OPEN_COLS = (
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
    ("prompt_estimate", "int8"),
    ("updated_at", "float8"),
)

_FINAL_COLS = (
    ("id", "text"),
    ("state", "text"),
    ("gateway_id", "text"),
    ("org_id", "text"),
    ("team_id", "text"),
    ("project_id", "text"),
    ("user_id", "text"),
    ("key_id", "text"),
    ("model", "text"),
    ("upstream_model", "text"),
    ("replica", "text"),
    ("route", "text"),
    ("retries", "int8"),
    ("stream", "int4"),
    ("started_at", "float8"),
    ("ttft_ms", "float8"),
    ("duration_ms", "float8"),
    ("status", "text"),
    ("http_status", "int8"),
    ("prompt_tokens", "int8"),
    ("completion_tokens", "int8"),
    ("usage_estimated", "int4"),
    ("finish_reason", "text"),
    ("body_kept", "int4"),
    ("updated_at", "float8"),
)

# Every column but id and prompt_estimate (the open's estimate stays for the record).
_FINAL_SET = ", ".join(f"{c} = excluded.{c}" for c, _ in _FINAL_COLS[1:])
# The WHERE is what makes the first final win: a final row is never written again.
_FINAL_TAIL = f"ON CONFLICT (id) DO UPDATE SET {_FINAL_SET} WHERE requests.state <> 'final'"

_ROLLUP_COLS = (
    ("hour", "int8"),
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

_ROW_COLS = (
    "id, state, started_at, org_id, team_id, project_id, user_id, key_id, model, "
    "status, prompt_tokens, completion_tokens"
)


def _text(raw: msgspec.Raw | bytes | None) -> str | None:
    return None if raw is None else bytes(raw).decode("utf-8", "replace")


def _final_row(rec: wire.UsageRecord, gateway_id: str, now: float) -> tuple[Any, ...]:
    return (
        rec.request_id,
        "final",
        gateway_id,
        rec.org_id,
        rec.team_id,
        rec.project_id,
        rec.user_id,
        rec.key_id,
        rec.model,
        rec.upstream_model,
        rec.replica,
        _text(rec.route),
        rec.retries,
        int(rec.stream),
        rec.started_at,
        rec.ttft_ms,
        rec.duration_ms,
        rec.status,
        rec.http_status,
        rec.prompt_tokens,
        rec.completion_tokens,
        int(rec.usage_estimated),
        rec.finish_reason,
        int(rec.request_body is not None),
        now,
    )


async def _existing(tx: Database, ids: list[str]) -> dict[str, Row]:
    """The rows already stored for these ids."""
    if tx.dialect == "postgres":
        rows = await tx.fetch(f"SELECT {_ROW_COLS} FROM requests WHERE id = ANY($1::text[])", ids)
    else:
        rows = await tx.fetch(
            f"SELECT {_ROW_COLS} FROM requests WHERE id IN (SELECT value FROM json_each($1))",
            msgspec.json.encode(ids).decode(),
        )
    return {r["id"]: r for r in rows}


async def _apply(tx: Database, delta: _Delta) -> None:
    """Adds the deltas to usage_hourly and usage_daily, in key order so that concurrent
    ingests lock rows in the same order (no deadlock)."""
    daily: _Delta = {}
    for k, v in delta.items():
        acc = daily.setdefault(
            (k[0] - k[0] % DAY, k[1], k[2], k[3], k[4], k[5], k[6]), [0, 0, 0, 0]
        )
        for i in range(4):
            acc[i] += v[i]
    for table, first, d in (("usage_hourly", "hour", delta), ("usage_daily", "day", daily)):
        rows = [(*k, *v) for k, v in sorted(d.items()) if any(v)]
        if rows:
            await _bulk(
                tx,
                f"INSERT INTO {table}",
                ((first, "int8"), *_ROLLUP_COLS[1:]),
                rows,
                _ROLLUP_TAIL.format(table=table, first=first),
            )


async def ingest(db: Database, batch: wire.UsageBatch, now: float) -> IngestResult:
    """Stores one gateway batch and updates the rollup, all in one transaction.

    Opens are inserted unless their request exists; finals are upserted unless their
    request is final already; the rollup moves only for the finals written (see the
    module's counting rule). Bodies are kept only where the record carries them. The
    gateway's `last_seen` becomes `now`. `batch.key_last_used` is not handled here: the
    keys belong to the tenancy store (`store.snapshot.touch_keys`).
    """
    finals: dict[str, wire.UsageRecord] = {}
    for rec in batch.finals:
        finals.setdefault(rec.request_id, rec)
    opens: dict[str, wire.UsageOpen] = {}
    for o in batch.opens:
        if o.request_id not in finals:
            opens.setdefault(o.request_id, o)
    delta: _Delta = {}
    counted = corrected = 0
    async with db.transaction() as tx:
        if tx.dialect == "postgres":
            await tx.execute("SELECT pg_advisory_xact_lock_shared($1)", _SETTLE_LOCK)
        await tx.execute(
            "INSERT INTO gateways (gateway_id, first_seen, last_seen) VALUES ($1, $2, $2) "
            "ON CONFLICT (gateway_id) DO UPDATE SET last_seen = "
            "CASE WHEN gateways.last_seen > excluded.last_seen THEN gateways.last_seen "
            "ELSE excluded.last_seen END",
            batch.gateway_id,
            now,
        )
        if opens:
            rows = [
                (
                    o.request_id,
                    "open",
                    batch.gateway_id,
                    o.org_id,
                    o.team_id,
                    o.project_id,
                    o.user_id,
                    o.key_id,
                    o.model,
                    o.started_at,
                    o.prompt_estimate,
                    now,
                )
                for o in sorted(opens.values(), key=lambda o: o.request_id)
            ]
            await _bulk(tx, "INSERT INTO requests", _OPEN_COLS, rows, "ON CONFLICT (id) DO NOTHING")
        if finals:
            prior = await _existing(tx, sorted(finals))
            todo = [
                r
                for i, r in sorted(finals.items())
                if i not in prior or prior[i]["state"] != "final"
            ]
            written: set[str] = {r.request_id for r in todo}
            if todo:
                back = await _bulk(
                    tx,
                    "INSERT INTO requests",
                    _FINAL_COLS,
                    [_final_row(r, batch.gateway_id, now) for r in todo],
                    _FINAL_TAIL,
                    "RETURNING id",
                )
                if back is not None:  # PostgreSQL: what this transaction really wrote
                    written = {r["id"] for r in back}
            for rec in todo:
                if rec.request_id not in written:
                    continue
                counted += 1
                _add_record(delta, rec)
                old = prior.get(rec.request_id)
                if old is not None and old["state"] == "interrupted":
                    corrected += 1
                    _add_row(delta, old, -1)
            bodies = [
                (r.request_id, _text(r.request_body), _text(r.response_body))
                for r in todo
                if r.request_id in written
                and (r.request_body is not None or r.response_body is not None)
            ]
            if bodies:
                await _bulk(
                    tx,
                    "INSERT INTO request_bodies",
                    (("request_id", "text"), ("request", "text"), ("response", "text")),
                    bodies,
                    "ON CONFLICT (request_id) DO NOTHING",
                )
        await _apply(tx, delta)
    return IngestResult(
        counted=counted, corrected=corrected, duplicates=len(finals) - counted, opens=len(opens)
    )


async def _settle(db: Database, where: str, arg: Any, now: float) -> int:
    async with db.transaction() as tx:
        if tx.dialect == "postgres":
            await tx.execute("SELECT pg_advisory_xact_lock($1)", _SETTLE_LOCK)
        rows = await tx.fetch(
            "UPDATE requests SET state = 'interrupted', status = 'interrupted', "
            "prompt_tokens = prompt_estimate, completion_tokens = 0, usage_estimated = 1, "
            f"updated_at = $2 WHERE state = 'open' AND {where} RETURNING {_ROW_COLS}",
            arg,
            now,
        )
        delta: _Delta = {}
        for r in rows:
            _add_row(delta, r, 1)
        await _apply(tx, delta)
    return len(rows)


async def settle_gateway(db: Database, gateway_id: str, now: float) -> int:
    """Marks the open requests of one gateway `interrupted` and counts them once; returns how many.

    For a gateway known to be gone (it said goodbye, or an operator says so). A final
    arriving afterwards still corrects the row and the rollup.
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
    """Deletes request rows (and their bodies) started before `older_than` (unix seconds),
    except open ones; the rollup keeps their counts. Returns how many requests went."""
    async with db.transaction() as tx:
        await tx.execute(
            "DELETE FROM request_bodies WHERE request_id IN "
            "(SELECT id FROM requests WHERE started_at < $1 AND state <> 'open')",
            older_than,
        )
        n = await tx.execute(
            "DELETE FROM requests WHERE started_at < $1 AND state <> 'open'", older_than
        )
        await tx.execute(
            "DELETE FROM gateways WHERE last_seen < $1 AND NOT EXISTS (SELECT 1 FROM requests r "
            "WHERE r.gateway_id = gateways.gateway_id AND r.state = 'open')",
            older_than,
        )
    return n


_SUMS = (
    "CAST(SUM(requests) AS BIGINT), CAST(SUM(errors) AS BIGINT), "
    "CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT)"
)


async def _grouped(
    db: Database, start: float, end: float, cols: list[str], width: int | None
) -> list[Row]:
    """(bucket, *cols, requests, errors, prompt, completion) over the hours from the one holding
    `start` to `end` (exclusive), grouped by `width`-second buckets (HOUR or DAY; None: one
    bucket, 0), ordered. Whole days are read from usage_daily, the hours at either edge from
    usage_hourly: a month is then 30 rows per group, not 720."""
    lo, hi = hour_of(start), math.ceil(end)  # hour < ceil(end) is hour < end for whole hours
    day_lo, day_hi = -(-lo // DAY) * DAY, hi - hi % DAY
    names = "".join(f", {c}" for c in cols)  # fixed column names, never the caller's text
    sums = "requests, errors, prompt_tokens, completion_tokens"
    if width == DAY or (width is None and day_lo < day_hi):
        bucket = "0" if width is None else "t - t % 86400"
        parts = (
            f"SELECT hour AS t{names}, {sums} FROM usage_hourly WHERE hour >= $1 AND hour < $2 "
            f"UNION ALL SELECT day{names}, {sums} FROM usage_daily WHERE day >= $2 AND day < $3 "
            f"UNION ALL SELECT hour{names}, {sums} FROM usage_hourly WHERE hour >= $3 AND hour < $4"
        )
        # no whole day in range: the first two parts are empty, the last one reads it all
        args: tuple[int, ...] = (lo, day_lo, day_hi, hi) if day_lo < day_hi else (lo, lo, lo, hi)
    else:
        bucket = "0" if width is None else "t"
        parts = f"SELECT hour AS t{names}, {sums} FROM usage_hourly WHERE hour >= $1 AND hour < $2"
        args = (lo, hi)
    group = "".join(f", {i}" for i in range(2, len(cols) + 2))
    return await db.fetch(
        f"SELECT {bucket}{names}, {_SUMS} FROM ({parts}) u GROUP BY 1{group} ORDER BY 1{group}",
        *args,
    )


async def usage_by_scope(
    db: Database, by: ScopeKind, since: float, until: float | None = None
) -> list[ScopeUsage]:
    """Usage per org, team or project from the hour holding `since` to `until` (default: all
    recorded), most tokens first."""
    col = DIMENSIONS[by]
    end = float(2**53) if until is None else until
    rows = await _grouped(db, since, end, [col], None)
    out = [
        ScopeUsage(
            scope_id=r[1],
            requests=int(r[2]),
            errors=int(r[3]),
            prompt_tokens=int(r[4]),
            completion_tokens=int(r[5]),
            total_tokens=int(r[4]) + int(r[5]),
        )
        for r in rows
    ]
    out.sort(key=lambda u: (-u.total_tokens, u.scope_id))
    return out


def month_of(t: float) -> float:
    """The unix second the UTC calendar month holding `t` starts at."""
    d = datetime.fromtimestamp(t, UTC)
    return float(calendar.timegm((d.year, d.month, 1, 0, 0, 0)))


async def export(
    db: Database, start: float, end: float, period: Period, by: Iterable[str]
) -> list[ExportRow]:
    """Usage from the hour holding `start` to `end` (exclusive), per period and chosen dimensions.

    Answers from the rollups only (see `_grouped`). Days are bucketed in SQL with integer
    arithmetic that both backends share; months are merged from days here, since
    calendar months are not a fixed number of seconds. Rows come ordered by period then
    dimensions. `by` holds names of DIMENSIONS; unknown ones raise ValueError.
    """
    chosen = list(dict.fromkeys(by))
    unknown = [d for d in chosen if d not in DIMENSIONS]
    if unknown:
        raise ValueError(f"unknown usage dimension {unknown[0]!r}")
    cols = [DIMENSIONS[d] for d in DIMENSIONS if d in chosen]  # the canonical order
    rows = await _grouped(db, start, end, cols, HOUR if period == "hour" else DAY)
    n = len(cols)
    if period != "month":
        return [
            ExportRow(
                period_start=float(r[0]),
                **{c: r[i + 1] for i, c in enumerate(cols)},
                requests=int(r[n + 1]),
                errors=int(r[n + 2]),
                prompt_tokens=int(r[n + 3]),
                completion_tokens=int(r[n + 4]),
            )
            for r in rows
        ]
    merged: dict[tuple[Any, ...], list[int]] = {}
    for r in rows:
        acc = merged.setdefault((month_of(r[0]), *(r[i] for i in range(1, n + 1))), [0, 0, 0, 0])
        for i in range(4):
            acc[i] += int(r[n + 1 + i])
    return [
        ExportRow(
            period_start=k[0],
            **{c: k[i + 1] for i, c in enumerate(cols)},
            requests=v[0],
            errors=v[1],
            prompt_tokens=v[2],
            completion_tokens=v[3],
        )
        for k, v in sorted(merged.items())
    ]
