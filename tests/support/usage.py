"""Builders of usage records for the usage tests."""

from __future__ import annotations

from typing import Any

import msgspec

from llmgw.protocol import wire
from llmgw.store import Database
from llmgw.store.usage_post import Post, from_batch, from_json

T0 = 1_793_491_200.0
"""2026-11-01T00:00:00Z: the start of a month, so that hour, day and month buckets line up."""


def opened(
    rid: str,
    *,
    at: float = T0,
    estimate: int = 10,
    model: str = "m",
    project: str = "proj_a",
    key: str = "key_a",
) -> wire.UsageOpen:
    """An open record of request `rid` under org_a/team_a/`project`."""
    return wire.UsageOpen(
        request_id=rid,
        model=model,
        started_at=at,
        prompt_estimate=estimate,
        key_id=key,
        user_id="user_a",
        project_id=project,
        team_id="team_a",
        org_id="org_a",
    )


def final(
    rid: str,
    *,
    at: float = T0,
    prompt: int = 12,
    completion: int = 5,
    status: str = "ok",
    model: str = "m",
    project: str = "proj_a",
    key: str = "key_a",
    body: bool = False,
    **kw: Any,
) -> wire.UsageRecord:
    """A final record matching `opened(rid)`."""
    return wire.UsageRecord(
        request_id=rid,
        model=model,
        upstream_model="up-" + model,
        replica="r1",
        status=status,
        http_status=200 if status == "ok" else 502,
        stream=False,
        prompt_tokens=prompt,
        completion_tokens=completion,
        usage_estimated=False,
        ttft_ms=3.5,
        duration_ms=20.0,
        finish_reason="stop",
        retries=0,
        started_at=at,
        route=msgspec.Raw(b'{"policy":"prefix","matched":12}'),
        key_id=key,
        user_id="user_a",
        project_id=project,
        team_id="team_a",
        org_id="org_a",
        request_body=msgspec.Raw(b'{"model":"' + model.encode() + b'","messages":[]}')
        if body
        else wire.NULL,
        response_body=b'{"choices":[]}' if body else None,
        **kw,
    )


def batch(
    gateway: str = "gw1",
    opens: list[wire.UsageOpen] | None = None,
    finals: list[wire.UsageRecord] | None = None,
) -> wire.UsageBatch:
    """A batch from `gateway`."""
    return wire.UsageBatch(gateway_id=gateway, opens=opens or [], finals=finals or [])


async def totals(db: Database) -> tuple[int, int, int, int]:
    """(requests, errors, prompt, completion) summed over the whole rollup."""
    r = await db.fetchrow(
        "SELECT CAST(SUM(requests) AS BIGINT), CAST(SUM(errors) AS BIGINT), "
        "CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT) "
        "FROM usage_hourly"
    )
    assert r is not None
    return (int(r[0] or 0), int(r[1] or 0), int(r[2] or 0), int(r[3] or 0))


_rows_decoder = msgspec.json.Decoder(list[wire.UsageRow])


async def stored_finals(db: Database) -> list[tuple[str, wire.UsageRow]]:
    """(gateway id, record) of every final stored by batch: a full read, for the oracles here.
    A request's record is the first row of its id in the batch its id row names."""
    owner = {r["id"]: r["batch"] for r in await db.fetch("SELECT id, batch FROM request_ids")}
    out = []
    for b in await db.fetch("SELECT id, gateway_id, rows FROM request_batches ORDER BY id"):
        for rec in _rows_decoder.decode(b["rows"]):
            if owner.get(rec.request_id) == b["id"]:
                del owner[rec.request_id]  # a repeat later in the post is not the record
                out.append((b["gateway_id"], rec))
    return out


async def rows_total(db: Database) -> tuple[int, int, int, int]:
    """The same sums computed from the request records (open ones count nothing): the
    `requests` rows (interrupted) and the finals stored by batch."""
    r = await db.fetchrow(
        "SELECT COUNT(*), CAST(SUM(CASE WHEN status <> 'ok' THEN 1 ELSE 0 END) AS BIGINT), "
        "CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT) "
        "FROM requests"
    )
    assert r is not None
    finals = [rec for _, rec in await stored_finals(db)]
    return (
        int(r[0] or 0) + len(finals),
        int(r[1] or 0) + sum(rec.status != "ok" for rec in finals),
        int(r[2] or 0) + sum(rec.prompt_tokens for rec in finals),
        int(r[3] or 0) + sum(rec.completion_tokens for rec in finals),
    )


async def daily_matches_hourly(db: Database) -> bool:
    """usage_daily holds exactly usage_hourly summed by day (zero rows aside)."""

    def nonzero(rows: list[Any]) -> dict[tuple[Any, ...], tuple[int, ...]]:
        return {
            tuple(r[:7]): tuple(int(x) for x in r[7:]) for r in rows if any(int(x) for x in r[7:])
        }

    dims = "org_id, team_id, project_id, user_id, key_id, model"
    sums = (
        "CAST(SUM(requests) AS BIGINT), CAST(SUM(errors) AS BIGINT), "
        "CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT)"
    )
    hourly = await db.fetch(
        f"SELECT hour - hour % 86400, {dims}, {sums} FROM usage_hourly GROUP BY 1, {dims}"
    )
    daily = await db.fetch(
        f"SELECT day, {dims}, requests, errors, prompt_tokens, completion_tokens FROM usage_daily"
    )
    return nonzero(hourly) == nonzero(daily)


def as_posted(batch: wire.UsageBatch) -> Post:
    """The batch as a control plane takes it off the wire: sent as a gateway sends it (finals
    as rows), read natively where the scan takes it, else decoded by msgspec."""
    rows = [wire.UsageRow(*msgspec.structs.astuple(r)) for r in batch.ended()]
    data = msgspec.json.encode(wire.UsageBatch(gateway_id=batch.gateway_id, opens=batch.opens, rows=rows,
                                               key_last_used=batch.key_last_used))
    return from_json(data) or from_batch(msgspec.json.decode(data, type=wire.UsageBatch))
