"""300 concurrent calls make exactly 300 usage rows (docs/reliability.md, LiteLLM #1849).

300 clients released together through a 4-worker gateway; afterwards the control plane
has one final request record per request id, and its rollup counts 300 requests and
exactly the tokens the 300 answers reported, on both store backends.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster
from tests.support.pg import drop_pg_database, fresh_pg_database

N = 300


@pytest.fixture(params=["sqlite", "postgres"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    url = fresh_pg_database() if request.param == "postgres" else None
    c = Cluster(tmp_path, store=url)
    try:
        yield c
    finally:
        c.stop()
        if url is not None:
            drop_pg_database(url)


def test_300_concurrent_calls_make_exactly_300_records(cluster: Cluster) -> None:
    sim = cluster.sim("--max-num-seqs", str(N), "--itl-ms", "5", "--output-tokens", "7")
    key = cluster.key()["key"]
    gw = cluster.gateway(sim, workers=4)
    start = threading.Barrier(N)

    def call(i: int | str, wait: bool = True) -> tuple[int, dict[str, Any], str]:
        body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": f"hi {i}"}],
                           "max_tokens": 7}).encode()
        req = urllib.request.Request(gw.url + "/v1/chat/completions", data=body, method="POST", headers={
            "authorization": f"Bearer {key}", "content-type": "application/json"})
        if wait:
            start.wait(30)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return int(r.status), json.loads(r.read()), r.headers["x-request-id"]
        except urllib.error.HTTPError as e:
            with e:  # closes its connection: a collected one warns
                return int(e.code), json.loads(e.read()), e.headers["x-request-id"]

    # Each worker has its own snapshot of keys, and answers 503 not_ready until it came:
    # warm up until a run of requests (spread over the workers) all pass.
    warmed: list[str] = []
    in_a_row, deadline = 0, time.monotonic() + 20
    while in_a_row < 16:
        assert time.monotonic() < deadline, "the gateway's workers never all had their keys"
        status, _, rid = call("warm", wait=False)
        if status == 200:
            warmed.append(rid)
        in_a_row = in_a_row + 1 if status == 200 else 0
    warm = len(warmed)

    with ThreadPoolExecutor(N) as pool:
        answers = list(pool.map(call, range(N)))
    statuses = [s for s, _, _ in answers]
    assert statuses == [200] * N, ({s: statuses.count(s) for s in set(statuses)},
                                   [a for s, a, _ in answers if s != 200][:2])
    assert len({rid for _, _, rid in answers} | set(warmed)) == N + warm, "every request has its own id"
    prompt = sum(a["usage"]["prompt_tokens"] for _, a, _ in answers)
    completion = sum(a["usage"]["completion_tokens"] for _, a, _ in answers)

    deadline = time.monotonic() + 30
    while True:
        rows = cluster.call("GET", "/api/v1/usage?by=project&since=1h")
        if sum(r["requests"] for r in rows) >= N + warm or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(rows) == 1
    assert (rows[0]["requests"], rows[0]["errors"]) == (N + warm, 0), rows
    warm_prompt = sum(cluster.call("GET", f"/api/v1/requests/{rid}")["prompt_tokens"] for rid in warmed)
    assert (rows[0]["prompt_tokens"], rows[0]["completion_tokens"]) == (prompt + warm_prompt,
                                                                        completion + 7 * warm), rows
    for _, _, rid in answers[::7]:  # a sample of the records: each final, once
        record = cluster.call("GET", f"/api/v1/requests/{rid}")
        assert record["state"] == "final", record
    time.sleep(1.5)  # two more shipping rounds: nothing is counted twice later
    rows = cluster.call("GET", "/api/v1/usage?by=project&since=1h")
    assert rows[0]["requests"] == N + warm, rows
