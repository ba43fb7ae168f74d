"""Usage ingestion on both backends: counted once, settled, corrected, pruned; bodies kept."""

from __future__ import annotations

import msgspec

from llmgw.protocol import wire
from llmgw.store import Database
from llmgw.store.requests import NotKept, RequestBody, request_body, request_view
from llmgw.store.usage import ingest, prune, settle_gateway, settle_stale, usage_by_scope
from tests.support.store import with_db
from tests.support.usage import T0, as_posted, batch, final, opened, rows_total, totals


def test_open_then_final_counts_once_and_duplicates_are_ignored(store_url: str) -> None:
    async def body(db: Database) -> None:
        await ingest(db, batch(opens=[opened("a"), opened("b")]), T0)
        assert await totals(db) == (0, 0, 0, 0)  # open rows count nothing
        r = await ingest(db, batch(finals=[final("a"), final("a")]), T0 + 1)
        assert (r.counted, r.duplicates) == (1, 0)
        r = await ingest(db, batch(opens=[opened("a")], finals=[final("a", prompt=999)]), T0 + 2)
        assert (r.counted, r.duplicates) == (0, 1)
        assert await totals(db) == (1, 0, 12, 5)
        # a final alone, then its late open: still once
        await ingest(
            db, batch(finals=[final("c", status="upstream_error", prompt=3, completion=0)]), T0
        )
        await ingest(db, batch(opens=[opened("c")]), T0)
        assert await totals(db) == (2, 1, 15, 5) == await rows_total(db)
        view = await request_view(db, "a")
        assert view is not None
        assert (view.state, view.prompt_tokens, view.total_tokens, view.replica) == (
            "final",
            12,
            17,
            "r1",
        )
        assert bytes(view.route or b"") == b'{"policy":"prefix","matched":12}'
        b = await request_view(db, "b")
        assert b is not None and b.state == "open"
        assert await request_view(db, "zzz") is None

    with_db(store_url, body)


def test_a_post_read_natively_counts_new_corrects_interrupted_and_skips_final(store_url: str) -> None:
    async def body(db: Database) -> None:
        assert (await ingest(db, as_posted(batch(finals=[final("a"), final("b")])), T0)).counted == 2
        await ingest(db, batch(opens=[opened("c")]), T0)
        assert await settle_gateway(db, "gw1", T0 + 5) == 1
        post = as_posted(batch(finals=[final("a", prompt=999), final("c"), final("d"), final("d", prompt=7)]))
        assert post.ids == ["a", "c", "d"] and post.groups  # read natively: summed by group
        r = await ingest(db, post, T0 + 6)
        assert (r.counted, r.corrected, r.duplicates) == (2, 1, 1)
        assert await totals(db) == (4, 0, 48, 20) == await rows_total(db)
        view = await request_view(db, "c")
        assert view is not None and view.state == "final"
        # The same post again changes nothing.
        assert (await ingest(db, post, T0 + 7)).counted == 0
        assert await totals(db) == (4, 0, 48, 20) == await rows_total(db)

    with_db(store_url, body)


def test_rows_and_objects_are_the_same_records(store_url: str) -> None:
    # Gateways send finals as rows (JSON arrays); a batch of objects, from a gateway before
    # rows, is still taken, and one request in both forms is one request.
    def row(rec: wire.UsageRecord) -> wire.UsageRow:
        return wire.UsageRow(*msgspec.structs.astuple(rec))

    sent = wire.UsageBatch(gateway_id="gw1", finals=[final("a")],
                           rows=[row(final("a", prompt=999)), row(final("b", body=True, completion=7))])
    raw = msgspec.json.encode(sent)
    assert raw.count(b'"request_id"') == 1 and b'["b","m","up-m","r1","ok",200,false,12,7,' in raw
    got = msgspec.json.decode(raw, type=wire.UsageBatch)
    assert [type(r).__name__ for r in got.ended()] == ["UsageRecord", "UsageRow", "UsageRow"]

    async def body(db: Database) -> None:
        r = await ingest(db, got, T0)
        assert (r.counted, r.duplicates) == (2, 0)
        assert await totals(db) == (2, 0, 24, 12) == await rows_total(db)
        kept = await request_body(db, "b")
        assert isinstance(kept, RequestBody) and kept.response == '{"choices":[]}'

    with_db(store_url, body)


def test_dead_gateway_is_settled_once_and_a_late_final_corrects_it(store_url: str) -> None:
    async def body(db: Database) -> None:
        await ingest(
            db, batch("gw1", opens=[opened("a", estimate=40), opened("b", estimate=7)]), T0
        )
        await ingest(db, batch("gw2", opens=[opened("c")]), T0 + 50)
        # gw1 silent for 60 s, gw2 for 10 s: only gw1's requests settle
        assert await settle_stale(db, 30.0, T0 + 60) == 2
        assert await settle_stale(db, 30.0, T0 + 61) == 0  # nothing left open: counted once
        assert await totals(db) == (2, 2, 47, 0)
        a = await request_view(db, "a")
        assert a is not None and (a.state, a.status, a.prompt_tokens, a.usage_estimated) == (
            "interrupted",
            "interrupted",
            40,
            True,
        )
        # gw1 was only slow: its final for a arrives and replaces the estimate, exactly once
        r = await ingest(db, batch("gw1", finals=[final("a", prompt=30, completion=9)]), T0 + 70)
        assert (r.counted, r.corrected) == (1, 1)
        await ingest(db, batch("gw1", finals=[final("a", prompt=30, completion=9)]), T0 + 71)
        assert await totals(db) == (2, 1, 37, 9) == await rows_total(db)
        assert await settle_gateway(db, "gw2", T0 + 72) == 1
        assert await totals(db) == (3, 2, 47, 9) == await rows_total(db)

    with_db(store_url, body)


def test_bodies_kept_only_when_sent(store_url: str) -> None:
    async def body(db: Database) -> None:
        await ingest(db, batch(opens=[opened("o")], finals=[final("k", body=True), final("n")]), T0)
        kept = await request_body(db, "k")
        assert isinstance(kept, RequestBody)
        assert bytes(kept.request) == b'{"model":"m","messages":[]}'
        assert kept.response == '{"choices":[]}'
        view = await request_view(db, "k")
        assert view is not None and view.body_kept
        missing = await request_body(db, "n")
        assert isinstance(missing, NotKept) and "no_store" in missing.reason
        still = await request_body(db, "o")
        assert isinstance(still, NotKept) and "not finished" in still.reason
        assert await request_body(db, "nope") is None

    with_db(store_url, body)


def test_retention_deletes_rows_not_rollups(store_url: str) -> None:
    async def body(db: Database) -> None:
        await ingest(
            db, batch(finals=[final("old", at=T0, body=True)], opens=[opened("open", at=T0)]), T0
        )
        await ingest(db, batch(finals=[final("new", at=T0 + 86_400)]), T0 + 86_400)
        assert await prune(db, T0 + 3600) == 1
        assert await request_view(db, "old") is None
        assert await db.fetchval("SELECT COUNT(*) FROM request_bodies") == 0
        assert (
            await request_view(db, "open") is not None
        )  # open rows wait for their final or settle
        assert await request_view(db, "new") is not None
        assert await totals(db) == (2, 0, 24, 10)

    with_db(store_url, body)


def test_retention_deletes_each_post_with_the_ids_it_stored(store_url: str) -> None:
    # A final posted again lands in a later post's text, but its id row names the post that
    # stored it first: retention of that post deletes it, and retention of a post holding only
    # a copy (here the fourth, past before the second) leaves the row alone.
    async def body(db: Database) -> None:
        await ingest(db, as_posted(batch(finals=[final("a", at=T0), final("b", at=T0)])), T0)
        await ingest(db, as_posted(batch(finals=[final("a", at=T0), final("c", at=T0 + 86_400)])), T0 + 1)
        await ingest(db, as_posted(batch(finals=[final("d", at=T0 + 10, body=True)])), T0 + 2)
        await ingest(db, as_posted(batch(finals=[final("c", at=T0)])), T0 + 3)
        assert await prune(db, T0 + 3600) == 3  # a, b and d; the second post is not all past
        assert await request_view(db, "a") is None and await request_view(db, "d") is None
        assert await request_view(db, "c") is not None
        assert await db.fetchval("SELECT COUNT(*) FROM request_bodies") == 0
        assert await db.fetchval("SELECT COUNT(*) FROM request_batches") == 1
        assert await prune(db, T0 + 2 * 86_400) == 1  # c only: a's row went with the first post
        assert await db.fetchval("SELECT COUNT(*) FROM request_ids") == 0
        assert await db.fetchval("SELECT COUNT(*) FROM request_batches") == 0
        assert await totals(db) == (4, 0, 48, 20)

    with_db(store_url, body)


def test_usage_by_scope(store_url: str) -> None:
    async def body(db: Database) -> None:
        await ingest(
            db,
            batch(
                finals=[
                    final("1", project="proj_a", prompt=10, completion=1),
                    final("2", project="proj_b", prompt=100, completion=1, status="timeout"),
                    final("3", project="proj_b", prompt=100, completion=1, at=T0 + 7200),
                    final("4", project="proj_c", at=T0 - 86_400),
                ]
            ),
            T0,
        )
        rows = await usage_by_scope(db, "project", T0)
        assert [(u.scope_id, u.requests, u.errors, u.total_tokens) for u in rows] == [
            ("proj_b", 2, 1, 202),
            ("proj_a", 1, 0, 11),
        ]
        orgs = await usage_by_scope(db, "org", T0 - 86_400)
        assert [(u.scope_id, u.requests, u.prompt_tokens) for u in orgs] == [("org_a", 4, 222)]
        # since falls mid-hour: the whole hour holding it is counted (hourly rollups)
        later = await usage_by_scope(db, "team", T0 + 7200 + 1800)
        assert [(u.scope_id, u.requests) for u in later] == [("team_a", 1)]

    with_db(store_url, body)


def test_compaction_drops_finished_opens_of_live_gateways(store_url: str) -> None:
    async def body(db: Database) -> None:
        from llmgw.store.usage import compact_opens

        await ingest(db, batch(opens=[opened("a"), opened("b")]), T0)
        await ingest(db, batch(opens=[opened("c")], finals=[final("a")]), T0 + 1)
        assert await compact_opens(db, T0 + 0.5) == 1  # the first row, now holding b only
        assert await db.fetchval("SELECT COUNT(*) FROM open_batches") == 2
        b = await request_view(db, "b")
        assert b is not None and (b.state, b.prompt_tokens) == ("open", 10)
        await ingest(db, batch(finals=[final("b"), final("c")]), T0 + 2)
        assert await compact_opens(db, T0 + 5) == 0
        assert await db.fetchval("SELECT COUNT(*) FROM open_batches") == 0
        assert await settle_gateway(db, "gw1", T0 + 6) == 0
        assert await totals(db) == (3, 0, 36, 15)

    with_db(store_url, body)


def test_the_settle_loop_compacts_a_live_gateways_opens(store_url: str, monkeypatch: object) -> None:
    import asyncio
    import time
    from types import SimpleNamespace

    from llmgw.control import usage as cp_usage

    monkeypatch.setattr(cp_usage, "SETTLE_EVERY", 0.05)  # type: ignore[attr-defined]

    async def body(db: Database) -> None:
        now = time.time()
        # A live gateway (heard from now) whose batch of a minute ago announced a and b.
        await ingest(db, batch(opens=[opened("a"), opened("b")]), now - 60)
        await ingest(db, batch(finals=[final("a")]), now)
        cp = SimpleNamespace(db=db, settings=SimpleNamespace(gateway_silent_for=30.0))
        loop = asyncio.create_task(cp_usage._settle(cp))  # type: ignore[arg-type]
        try:
            for _ in range(200):
                rows = await db.fetch("SELECT opens FROM open_batches")
                if len(rows) == 1 and '"a"' not in rows[0]["opens"]:
                    break
                await asyncio.sleep(0.02)
            assert len(rows) == 1 and '"b"' in rows[0]["opens"] and '"a"' not in rows[0]["opens"]
            await ingest(db, batch(finals=[final("b")]), time.time())
            for _ in range(200):
                if not await db.fetchval("SELECT COUNT(*) FROM open_batches"):
                    break
                await asyncio.sleep(0.02)
            assert await db.fetchval("SELECT COUNT(*) FROM open_batches") == 0
        finally:
            loop.cancel()
        # Compaction changes no count: b was not settled as interrupted, a and b counted once.
        assert (await totals(db))[:2] == (2, 0)

    with_db(store_url, body)
