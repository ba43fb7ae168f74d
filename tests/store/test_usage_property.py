"""Any interleaving, repetition and batching of opens, finals and settles counts each request once.

The expectation is declarative, not a second copy of the code: a request that got a
final counts as its final; one that only got an open counts as interrupted if a settle
of its gateway came after its open, else nothing. The rollup must equal that, group
by group, and equal the sum over the request rows.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.store import Database, connect, migrate
from llmgw.store.usage import hour_of, ingest, settle_gateway, settle_stale
from tests.support.usage import (
    T0,
    as_posted,
    daily_matches_hourly,
    final,
    opened,
    rows_total,
    totals,
)

N = 6  # requests; request i belongs to gateway gw{i % 2}


def _started(i: int) -> float:
    return T0 + i * 1800.0  # two requests per hour: several rollup groups


def _open(i: int) -> Any:
    return opened(f"r{i}", at=_started(i), estimate=10 + i, model=f"m{i % 3}")


def _final(i: int) -> Any:
    return final(
        f"r{i}",
        at=_started(i),
        prompt=100 + i,
        completion=i + 1,
        model=f"m{i % 3}",
        status="ok" if i % 3 else "upstream_error",
    )


_item = st.tuples(st.sampled_from(["open", "final"]), st.integers(0, N - 1))
_event = st.one_of(
    st.tuples(st.just("batch"), st.integers(0, 1), st.lists(_item, max_size=6)),
    st.tuples(st.just("settle"), st.integers(0, 1), st.just([])),
    st.tuples(st.just("stale"), st.integers(1, 3), st.just([])),
)


def _expected(
    events: list[tuple[str, int, list[tuple[str, int]]]],
) -> dict[tuple[Any, ...], list[int]]:
    opened_at: dict[int, int] = {}
    finaled: set[int] = set()
    settled_after_open: set[int] = set()
    last_seen: dict[int, int] = {}
    for step, (kind, arg, items) in enumerate(events):
        if kind == "batch":
            last_seen[arg] = step
            for what, i in items:
                if i % 2 != arg:
                    continue
                if what == "final":
                    finaled.add(i)
                else:
                    opened_at.setdefault(i, step)
        else:
            # settle: gateway `arg`; stale: gateways whose last batch is more than `arg` steps ago
            dead = {arg} if kind == "settle" else {g for g, t in last_seen.items() if step - t > arg}
            settled_after_open |= {i for i in opened_at if i % 2 in dead}
    out: dict[tuple[Any, ...], list[int]] = {}
    for i in range(N):
        if i in finaled:
            rec = _final(i)
            add = [1, int(rec.status != "ok"), rec.prompt_tokens, rec.completion_tokens]
        elif i in settled_after_open:
            add = [1, 1, 10 + i, 0]
        else:
            continue
        acc = out.setdefault((hour_of(_started(i)), f"m{i % 3}"), [0, 0, 0, 0])
        for j in range(4):
            acc[j] += add[j]
    return out


async def _play(db: Database, events: list[tuple[str, int, list[tuple[str, int]]]]) -> None:
    for t in ("requests", "request_ids", "request_batches", "open_batches", "request_bodies", "usage_hourly",
              "usage_daily", "gateways"):
        await db.execute(f"DELETE FROM {t}")
    for step, (kind, arg, items) in enumerate(events):
        now = T0 + step  # one second per event
        if kind == "batch":
            mine = [(w, i) for w, i in items if i % 2 == arg]
            await ingest(db, as_posted(_batch(arg, mine)), now)
        elif kind == "settle":
            await settle_gateway(db, f"gw{arg}", now)
        else:
            # silent for more than `arg` events; the 0.5 keeps clear of float ties
            await settle_stale(db, arg + 0.5, now)


def _batch(g: int, items: list[tuple[str, int]]) -> Any:
    from llmgw.protocol import wire

    return wire.UsageBatch(
        gateway_id=f"gw{g}",
        opens=[_open(i) for w, i in items if w == "open"],
        finals=[_final(i) for w, i in items if w == "final"],
    )


def test_every_request_is_counted_exactly_once(store_url: str) -> None:
    with asyncio.Runner() as runner:
        db = runner.run(connect(store_url))
        try:
            runner.run(migrate(db))

            @settings(
                max_examples=60,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            )
            @given(st.lists(_event, max_size=14))
            def check(events: list[tuple[str, int, list[tuple[str, int]]]]) -> None:
                runner.run(_play(db, events))
                got = runner.run(
                    db.fetch(
                        "SELECT hour, model, requests, errors, prompt_tokens, completion_tokens "
                        "FROM usage_hourly"
                    )
                )
                rollup = {
                    (int(r[0]), r[1]): [int(r[2]), int(r[3]), int(r[4]), int(r[5])]
                    for r in got
                    if any(int(r[j]) for j in range(2, 6))
                }
                assert rollup == _expected(events)
                assert runner.run(totals(db)) == runner.run(rows_total(db))
                assert runner.run(daily_matches_hourly(db))

            check()
        finally:
            runner.run(db.close())


def test_concurrent_ingests_and_settles_count_once(store_url: str) -> None:
    """Control planes sharing one PostgreSQL ingest the same finals at once: the pool runs
    these transactions side by side, and only one of them may count each request."""

    async def main() -> None:
        db = await connect(store_url)
        try:
            await migrate(db)
            opens = [_open(i) for i in range(N)]
            finals = [_final(i) for i in range(N) if i % 2 == 0]
            from llmgw.protocol import wire

            await ingest(db, wire.UsageBatch(gateway_id="gw0", opens=opens), T0)
            # distinct gateway ids, or the gateways row lock would serialize the ingests
            jobs = [
                ingest(db, as_posted(wire.UsageBatch(gateway_id=f"gw0-{k}", finals=finals)), T0 + 1)
                for k in range(6)
            ]
            results = await asyncio.gather(
                *jobs, settle_gateway(db, "gw0", T0 + 2), settle_gateway(db, "gw0", T0 + 2)
            )
            counted = sum(r.counted for r in results[:6])  # type: ignore[union-attr]
            assert counted == len(finals)
            got = await totals(db)
            assert got == await rows_total(db)
            assert got[0] == N  # the odd ones settled (or all settled then corrected)
            assert await daily_matches_hourly(db)
        finally:
            await db.close()

    asyncio.run(main())
