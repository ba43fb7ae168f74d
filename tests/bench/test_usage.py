"""The usage ingestion bench: its batch shapes, checks and committed result (no run here)."""

from __future__ import annotations

from pathlib import Path

import msgspec
from bench.usage import Run, UsageResult, _batches, _checks, markdown

from llmgw.protocol.wire import UsageBatch
from llmgw.store.usage_post import from_json


def _decoded(posts: list[bytes]) -> list[UsageBatch]:
    return [msgspec.json.decode(p, type=UsageBatch) for p in posts]


def test_shapes_send_each_request_once() -> None:
    finals = _decoded(_batches(2500, 1000, "final", "gw"))
    assert [(len(b.opens), len(b.rows)) for b in finals] == [(0, 1000), (0, 1000), (0, 500)]
    both = _decoded(_batches(2500, 1000, "open+final", "gw"))
    # each batch carries the next chunk's opens with the previous chunk's finals
    assert [(len(b.opens), len(b.rows)) for b in both] == [
        (1000, 0),
        (1000, 1000),
        (500, 1000),
        (0, 500),
    ]
    assert [o.request_id for o in both[1].opens] == [f.request_id for f in both[2].rows]
    # Posted as gateways post them: the control plane reads them natively.
    assert all(from_json(p) is not None for p in _batches(2500, 1000, "open+final", "gw"))


def test_checks_use_the_worst_shape_with_two_in_flight() -> None:
    runs = [
        Run(
            backend=b,
            shape=s,
            in_flight=c,
            batch=1000,
            requests=40_000,
            wall_s=1.0,
            cpu_s=1.0,
            records_per_s=r,
            records_per_cpu_s=r,
        )
        for b, r in (("sqlite", 25_000.0), ("postgres", 15_000.0))
        for s in ("final", "open+final")
        for c in (1, 2)
    ]
    figs, checks = _checks(runs)
    assert figs["postgres_open_final_c2_per_s"] == 15_000.0
    assert [(c.name, c.met) for c in checks] == [
        ("sqlite_open_final_c2_per_s", True),
        ("postgres_open_final_c2_per_s", False),
    ]


def test_committed_result_decodes_and_prints() -> None:
    results = Path(__file__).parents[2] / "bench" / "results"
    for path in sorted(results.glob("usage-????-??-??.json")):
        res = msgspec.json.decode(path.read_bytes(), type=UsageResult)
        assert len(res.runs) == 8 and len(res.checks) == 2
        assert "| postgres | open+final | 2 |" in markdown(res)
