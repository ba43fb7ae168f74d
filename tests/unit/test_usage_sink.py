"""The gateway's usage sink: what each post to the control plane carries."""

from __future__ import annotations

import asyncio

import msgspec

from llmgw.gateway.usage import UsageSink
from llmgw.wire import UsageBatch, UsageOpen, UsageRecord


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
        sink.open(_open("done"))
        sink.open(_open("running"))
        sink.record(_final("done"))
        assert await sink.send()
        sink.record(_final("running"))
        assert await sink.send()

    asyncio.run(main())
    assert [([o.request_id for o in b.opens], [f.request_id for f in b.finals]) for b in posted] == [
        (["running"], ["done"]),
        ([], ["running"]),
    ]
