"""The gateway's usage sink: what each post to the control plane carries."""

from __future__ import annotations

import asyncio

import msgspec

from llmgw.gateway.usage import MAX_BATCH_RECORDS, UsageSink
from llmgw.protocol.wire import UsageBatch, UsageOpen, UsageRecord, UsageRow


def _open(rid: str) -> UsageOpen:
    return UsageOpen(request_id=rid, model="m", started_at=1.0, prompt_estimate=5, key_id="key_a")


def _final(rid: str) -> UsageRecord:
    return UsageRecord(request_id=rid, model="m", upstream_model="m", replica="r1", status="ok",
                       http_status=200, stream=False, prompt_tokens=5, completion_tokens=2,
                       usage_estimated=False, ttft_ms=1.0, duration_ms=2.0, finish_reason="stop",
                       retries=0, started_at=1.0, key_id="key_a")


def test_an_open_whose_request_ended_before_the_post_is_not_sent() -> None:
    posted: list[UsageBatch] = []

    async def ship(body: bytes) -> None:
        posted.append(msgspec.json.decode(body, type=UsageBatch))

    async def main() -> None:
        sink = UsageSink(None, ship=ship, gateway_id="gw")
        sink.open("done", _open("done"))
        sink.open("running", _open("running"))
        sink.record(_final("done"))
        assert await sink.send()
        sink.record(_final("running"))
        assert await sink.send()
        await sink.close()

    asyncio.run(main())
    assert [([o.request_id for o in b.opens], [f.request_id for f in b.ended()]) for b in posted] == [
        (["running"], ["done"]),
        ([], ["running"]),
    ]


def test_records_queued_during_a_post_wait_for_the_next_tick_and_close_drains_them() -> None:
    posted: list[UsageBatch] = []

    async def main() -> None:
        sink: UsageSink

        async def ship(body: bytes) -> None:
            posted.append(msgspec.json.decode(body, type=UsageBatch))
            # Requests keep ending while a post is under way, as on a busy worker.
            if len(posted) <= 2:
                sink.record(_final(f"late{len(posted)}"))

        sink = UsageSink(None, ship=ship, gateway_id="gw")
        sink.record(_final("a"))
        sink.record(_final("b"))
        assert await sink.send()
        # One post for what was pending: the late record waits, no back-to-back posts.
        assert len(posted) == 1 and sink.waiting() == ["late1"]
        await sink.close()  # a clean shutdown posts until nothing is left
        assert not sink.waiting() and not sink.opens

    asyncio.run(asyncio.wait_for(main(), 30))
    assert [f.request_id for f in posted[0].ended()] == ["a", "b"]
    assert [[f.request_id for f in b.ended()] for b in posted[1:]] == [["late1"], ["late2"]]


def test_an_open_queued_during_a_post_is_kept_for_the_next_one() -> None:
    posted: list[UsageBatch] = []
    sink = UsageSink(None, ship=None, gateway_id="gw")

    async def ship(body: bytes) -> None:
        posted.append(msgspec.json.decode(body, type=UsageBatch))
        if len(posted) == 1:  # while the first post is in flight: a ends, d starts
            sink.record(_final("a"))
            sink.open("d", _open("d"))

    async def main() -> None:
        sink.ship = ship
        for rid in ("a", "b", "c"):
            sink.open(rid, _open(rid))
        assert await sink.send()
        assert await sink.send()

    asyncio.run(main())
    assert [([o.request_id for o in b.opens], [f.request_id for f in b.ended()]) for b in posted] == [
        (["a", "b", "c"], []),
        (["d"], ["a"]),
    ]


def test_the_proxy_builds_records_in_field_order_and_opens_only_when_sent() -> None:
    """The gateway builds UsageRecord positionally: its fields must stay in this order."""
    from llmgw.gateway.proxy import Call
    from llmgw.protocol.wire import KeyEntry, Limits

    assert UsageRecord.__struct_fields__[:21] == (
        "request_id", "model", "upstream_model", "replica", "status", "http_status", "stream",
        "prompt_tokens", "completion_tokens", "usage_estimated", "ttft_ms", "duration_ms",
        "finish_reason", "retries", "started_at", "route", "key_id", "user_id", "project_id",
        "team_id", "org_id")
    assert UsageRecord.__struct_fields__[21:] == ("request_body", "response_body")
    e = KeyEntry(key_id="key_a", hash="h", org_id="o", team_id="t", project_id="p", user_id="u",
                 expires_at=None, limits=Limits())
    call = Call("rid1", "m", "m-up", False, e)
    call.estimate = 7
    assert call.usage_open() == UsageOpen(request_id="rid1", model="m", started_at=call.started_at,
                                          prompt_estimate=7, key_id="key_a", user_id="u",
                                          project_id="p", team_id="t", org_id="o")


def test_records_only_for_the_control_plane_are_rows_and_a_usage_log_keeps_objects(tmp_path: object) -> None:
    posted: list[bytes] = []

    async def ship(body: bytes) -> None:
        posted.append(body)

    assert UsageSink(None).record_type is UsageRecord
    assert UsageSink(None, ship=ship).record_type is UsageRow
    assert UsageSink("usage.jsonl", ship=ship).record_type is UsageRecord
    sink = UsageSink(None)

    async def main() -> None:
        sink.ship = ship  # as the gateway sets it once it has a control plane, then starts it
        sink.start(asyncio.get_running_loop())
        assert sink.record_type is UsageRow
        sink.record(UsageRow(*msgspec.structs.astuple(_final("row"))))
        sink.record(_final("object"))
        assert await sink.send()

    asyncio.run(main())
    got = msgspec.json.decode(posted[0], type=UsageBatch)
    # An object recorded in rows mode (a request whose bodies are kept) is sent as a row too.
    assert not got.finals and [r.request_id for r in got.rows] == ["row", "object"]
    assert got.rows[0] == UsageRow(*msgspec.structs.astuple(_final("row")))
    assert b'"rows":[["row","m","m","r1","ok",200,false,5,2,false,1.0,2.0,"stop",0,1.0,null,"key_a",' in posted[0]


def test_a_backlog_leaves_in_posts_of_at_most_max_batch_records() -> None:
    posted: list[UsageBatch] = []

    async def ship(body: bytes) -> None:
        posted.append(msgspec.json.decode(body, type=UsageBatch))

    async def main() -> None:
        sink = UsageSink(None, ship=ship, gateway_id="gw")
        for i in range(MAX_BATCH_RECORDS + 5):
            sink.record(_final(f"r{i}"))
        assert await sink.send(drain=True)

    asyncio.run(main())
    assert [len(b.rows) for b in posted] == [MAX_BATCH_RECORDS, 5]
    assert [r.request_id for b in posted for r in b.rows] == [f"r{i}" for i in range(MAX_BATCH_RECORDS + 5)]


def test_a_sink_that_follows_the_lease_loop_posts_on_its_ticks_and_alone_when_they_stop() -> None:
    posted: list[list[str]] = []

    async def ship(body: bytes) -> None:
        posted.append([r.request_id for r in msgspec.json.decode(body, type=UsageBatch).ended()])

    async def settle() -> None:
        for _ in range(20):  # loop turns only: no timer is involved
            await asyncio.sleep(0)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        sink = UsageSink(None, interval=0.1, ship=ship, gateway_id="gw")
        # A shorter interval than the ticks' keeps its own timer: it would post less often.
        assert sink.follow(0.5)() is None and sink._ticks is None
        tick = sink.follow(0.05)  # a post every second tick: 0.1 s
        sink.start(loop)
        sink.record(_final("a"))
        tick()
        await settle()
        assert posted == []
        tick()
        await settle()
        assert posted == [["a"]]  # with the tick, not on a timer of its own
        # No more ticks (every lease pass called early): a post still leaves, one
        # interval and one tick after the last.
        sink.record(_final("b"))
        t0 = loop.time()
        while len(posted) < 2 and loop.time() < t0 + 5:
            await asyncio.sleep(0.005)
        waited = loop.time() - t0
        assert posted == [["a"], ["b"]]
        await sink.close()
        return waited

    waited = asyncio.run(main())
    assert 0.14 <= waited < 2.0
