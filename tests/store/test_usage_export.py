"""Export from the hourly rollup: period bucketing (UTC), dimensions, and a month in well under a second."""

from __future__ import annotations

import time

import pytest

from llmgw.store import Database
from llmgw.store.usage import ExportRow, export, ingest, month_of
from tests.support.store import with_db
from tests.support.usage import T0, batch, final

H, D = 3600.0, 86_400.0


def _flat(rows: list[ExportRow]) -> list[tuple[object, ...]]:
    return [
        (
            r.period_start,
            r.project_id,
            r.model,
            r.requests,
            r.errors,
            r.prompt_tokens,
            r.completion_tokens,
        )
        for r in rows
    ]


def test_periods_and_dimensions(store_url: str) -> None:
    async def body(db: Database) -> None:
        await ingest(
            db,
            batch(
                finals=[
                    final("1", at=T0 + 10, project="proj_a"),
                    final("2", at=T0 + 20, project="proj_b", model="x", status="timeout"),
                    final("3", at=T0 + H + 5, project="proj_a"),
                    final("4", at=T0 + D + 5, project="proj_a"),
                    final("5", at=T0 - 5, project="proj_a"),  # October 31st, 23:59:55
                    final("6", at=T0 + 30 * D + 1, project="proj_a"),  # December 1st
                ]
            ),
            T0,
        )
        hours = await export(db, T0, T0 + 2 * D, "hour", ["project"])
        assert _flat(hours) == [
            (T0, "proj_a", None, 1, 0, 12, 5),
            (T0, "proj_b", None, 1, 1, 12, 5),
            (T0 + H, "proj_a", None, 1, 0, 12, 5),
            (T0 + D, "proj_a", None, 1, 0, 12, 5),
        ]
        days = await export(db, T0 - D, T0 + 40 * D, "day", [])
        assert [(r.period_start, r.requests) for r in days] == [
            (T0 - D, 1),
            (T0, 3),
            (T0 + D, 1),
            (T0 + 30 * D, 1),
        ]
        months = await export(db, T0 - 40 * D, T0 + 40 * D, "month", ["model", "project"])
        assert _flat(months) == [
            (month_of(T0 - 5), "proj_a", "m", 1, 0, 12, 5),
            (T0, "proj_a", "m", 3, 0, 36, 15),
            (T0, "proj_b", "x", 1, 1, 12, 5),
            (T0 + 30 * D, "proj_a", "m", 1, 0, 12, 5),
        ]
        assert month_of(T0 - 5) == T0 - 31 * D  # October has 31 days
        # partial days at either edge come from the hourly rollup, whole days from the daily one
        edges = await export(db, T0 + H + 1, T0 + 30 * D + 2, "day", [])
        assert [(r.period_start, r.requests) for r in edges] == [
            (T0, 1),
            (T0 + D, 1),
            (T0 + 30 * D, 1),
        ]
        inside = await export(db, T0 + H + 1, T0 + D + 1, "day", [])
        assert [(r.period_start, r.requests) for r in inside] == [(T0, 1), (T0 + D, 1)]
        # `end` is exclusive; `start` is taken from the start of its hour
        assert [r.requests for r in await export(db, T0 + 30, T0 + H, "hour", [])] == [2]
        # dimensions not chosen are absent from the JSON, chosen ones present even when empty
        import msgspec

        doc = msgspec.json.decode(msgspec.json.encode(hours[0]))
        assert list(doc) == [
            "period_start",
            "project_id",
            "requests",
            "errors",
            "prompt_tokens",
            "completion_tokens",
        ]
        with pytest.raises(ValueError, match="unknown usage dimension 'region'"):
            await export(db, T0, T0 + D, "day", ["region"])

    with_db(store_url, body)


def test_a_month_of_hourly_rollups_exports_fast(store_url: str) -> None:
    """30 days x 24 hours x 200 groups (144,000 hourly rows, 6,000 daily), written straight
    into the rollups."""

    async def body(db: Database) -> None:
        rows = [
            (
                int(T0) + h * 3600,
                "org_a",
                f"team_{g % 10}",
                f"proj_{g % 50}",
                f"user_{g}",
                f"key_{g}",
                f"m{g % 4}",
                3,
                1,
                300,
                50,
            )
            for h in range(30 * 24)
            for g in range(200)
        ]
        cols = (
            "org_id, team_id, project_id, user_id, key_id, model, requests, errors, "
            "prompt_tokens, completion_tokens"
        )
        await db.executemany(
            f"INSERT INTO usage_hourly (hour, {cols}) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            rows,
        )
        await db.execute(
            f"INSERT INTO usage_daily (day, {cols}) SELECT hour - hour % 86400, "
            "org_id, team_id, project_id, user_id, key_id, model, SUM(requests), "
            "SUM(errors), SUM(prompt_tokens), SUM(completion_tokens) FROM usage_hourly "
            "GROUP BY 1, 2, 3, 4, 5, 6, 7"
        )
        timings = []
        for period, by in (
            ("month", ["project"]),
            ("day", ["team", "model"]),
            ("month", ["org", "team", "project", "user", "key", "model"]),
            ("hour", ["org"]),
            ("day", ["project"]),
        ):
            t = time.perf_counter()
            out = await export(db, T0, T0 + 30 * D, period, by)  # type: ignore[arg-type]
            timings.append(
                f"{period} by {','.join(by)}: {len(out)} rows in "
                f"{(time.perf_counter() - t) * 1000:.0f} ms"
            )
            assert sum(r.requests for r in out) == 30 * 24 * 200 * 3
        print(f"\n[{db.dialect}] month export: " + "; ".join(timings))

    with_db(store_url, body)


def test_sqlite_migration_differs_only_by_without_rowid() -> None:
    from importlib import resources

    files = resources.files("llmgw.store.migrations")
    common = files.joinpath("0002_usage.sql").read_text()
    sqlite = files.joinpath("0002_usage.sqlite.sql").read_text()
    # its own header comment, then the common file with the two rollups WITHOUT ROWID
    assert sqlite.count(") WITHOUT ROWID;") == 2
    assert sqlite.replace(") WITHOUT ROWID;", ");").endswith(common)


def test_sqlite_request_batches_migration_differs_only_by_its_ids() -> None:
    from importlib import resources

    files = resources.files("llmgw.store.migrations")
    common = files.joinpath("0007_request_batches.sql").read_text()
    sqlite = files.joinpath("0007_request_batches.sqlite.sql").read_text()
    # its own header comment, then the common file with the batch id as the rowid and
    # the id rows WITHOUT ROWID
    same = sqlite.replace(") WITHOUT ROWID;", ");").replace(
        "id INTEGER PRIMARY KEY,", "id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
    )
    assert same.endswith(common) and sqlite.count(") WITHOUT ROWID;") == 1
