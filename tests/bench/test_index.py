"""The index scenario: reading the Rust bench's output, the verdicts, the result format."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from bench.index import IndexResult, figures_and_checks, markdown, parse_output, table
from bench.report import Machine, Target

KV_INDEX = Path(__file__).resolve().parents[2] / "bench" / "results" / "kv_index.json"

RAW = {
    "bench": "kv_index",
    "ingest_blocks_per_s_map": 2_100_000,
    "ingest_blocks_per_s_array": 1_900_000,
    "bytes_per_block_full": 52,
    "bytes_per_block_mid": 49,
    "lookup_index_bytes_per_block": 50,
    "lookups_per_s_hit_all_replicas": 79_000,
    "lookups_per_s_hit_all_replicas_streamed": 60_000,
    "lookups_per_s_hit_one_replica": 600_000,
    "lookups_per_s_miss": 1_177_211,
    "cpu_share": 0.62,
}


def test_the_json_line_is_found_among_cargo_noise() -> None:
    out = "   Compiling x\nrunning 0 tests\n" + json.dumps(RAW) + "\n\n"
    assert parse_output(out) == RAW
    with pytest.raises(ValueError, match="no JSON"):
        parse_output("Finished\n")


def test_verdicts_against_the_issue_targets() -> None:
    figs, checks = figures_and_checks(RAW)
    assert figs["ingest_blocks_per_s"] == 1_900_000  # the slower encoding
    assert figs["bytes_per_block"] == 52  # the worst fill
    met = {c.name: c.met for c in checks}
    assert met == {
        "ingest_blocks_per_s": False,
        "lookups_per_s_8k_hit_all_replicas": False,
        "lookups_per_s_8k_hit_one_replica": True,
        "lookups_per_s_8k_miss": True,
        "bytes_per_block": True,
    }
    _, missing = figures_and_checks({})
    assert all(c.met is None and c.value is None for c in missing)


def test_the_committed_bench_output_is_readable() -> None:
    raw = json.loads(KV_INDEX.read_text())
    figs, checks = figures_and_checks(raw)
    assert figs["ingest_blocks_per_s"] is not None and figs["bytes_per_block"] is not None
    assert len(checks) == 5


def test_result_round_trips_and_prints() -> None:
    figs, checks = figures_and_checks(RAW)
    res = IndexResult(
        scenario="index", date="2026-01-01", started_at="s", finished_at="f",
        command="python -m bench run index",
        machine=Machine(nproc=2, cpu_model="x", python="3", platform="p", loadavg_start=[1.0]),
        versions={}, settings={"bench_command": "cargo bench --bench index"},
        targets=[Target(name="kv_index", kind="in-process", version="v", command=[])],
        rounds=[], summary=[], void=False, void_reason="", figures=figs, raw=RAW, checks=checks,
    )  # fmt: skip
    back = msgspec.json.decode(msgspec.json.encode(res), type=IndexResult)
    assert back.raw == RAW and back.checks == checks
    assert "ingest_blocks_per_s" in table(back)
    md = markdown(back)
    assert "| `bytes_per_block` | 52 | <= 64 | met |" in md
