"""`python -m bench table`: bench/RESULTS.md from bench/results/, the newest result per scenario."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.__main__ import main
from bench.table import NOT_RECORDED, PAGE, RESULTS, collect, render, shown_command


def _result(folder: Path, name: str, scenario: str, date: str, started: str, **extra: Any) -> None:
    doc: dict[str, Any] = {
        "scenario": scenario,
        "date": date,
        "started_at": started,
        "command": f"python -m bench run {scenario}",
        "machine": {"nproc": 2, "cpu_model": "AMD EPYC", "clocksource": "tsc"},
        "versions": {"llmgw_git": "abc123def456"},
        "settings": {"quick": False},
        "summary": [],
        "figures": {"llmgw_added_p50_us": 12.5},
        **extra,
    }
    (folder / name).write_text(json.dumps(doc))


def test_the_committed_page_is_what_the_committed_results_give(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    assert main(["table", "--out", str(out)]) == 0
    assert out.read_bytes() == PAGE.read_bytes(), "run `python -m bench table` and commit"
    assert render(RESULTS) == render(RESULTS)  # nothing of its own: no clock, no host


def test_the_newest_result_of_each_scenario_leads(tmp_path: Path) -> None:
    _result(tmp_path, "overhead-2026-01-02-amd.json", "overhead", "2026-01-02", "2026-01-02T10:00")
    _result(tmp_path, "overhead-2026-01-03-amd.json", "overhead", "2026-01-03", "2026-01-03T08:00")
    _result(tmp_path, "overhead-2026-01-03-amd-2.json", "overhead", "2026-01-03",
            "2026-01-03T09:00:00", machine={"nproc": 2, "cpu_model": "Intel(R) Xeon(R)"})
    _result(tmp_path, "soak-2026-01-01-amd.json", "soak", "2026-01-01", "", command="",
            versions={})
    by = collect(tmp_path)
    assert [e.name for e in by["overhead"]] == [
        "overhead-2026-01-03-amd-2.json", "overhead-2026-01-03-amd.json",
        "overhead-2026-01-02-amd.json"]
    assert by["overhead"][0].host.startswith("intel (")
    soak = by["soak"][0]
    assert (soak.commit, soak.command) == (NOT_RECORDED, NOT_RECORDED)

    pooled = {"kind": "pooled-throughput-keys", "date": "2026-01-04", "code": ["abc", "abc"],
              "machines": ["AMD EPYC", "AMD EPYC"], "levels": []}
    (tmp_path / "pooled-2026-01-04-amd.json").write_text(json.dumps(pooled))
    assert collect(tmp_path)["pooled-throughput-keys"][0].host == "amd (2 runs: AMD EPYC)"

    page = render(tmp_path)
    assert page == render(tmp_path)
    section = page.split("## overhead", 1)[1].split("## soak", 1)[0]
    assert section.index("overhead-2026-01-03-amd-2.json") < section.index("Other kept results")
    assert "`llmgw_added_p50_us` | 12.50" in section
    assert f"- commit: {NOT_RECORDED}" in page.split("## soak", 1)[1]


def test_commands_name_files_as_they_are_kept(tmp_path: Path) -> None:
    (tmp_path / "kept.json").write_text("{}")
    cmd = ("python -m bench pool bench/results/gone-1.json bench/results/gone-2.json "
           "bench/results/kept.json --out bench/results/old-name.json")
    assert shown_command(cmd, "pooled-2026-01-01-amd.json", tmp_path) == (
        "python -m bench pool [2 result files, since renamed or removed] bench/results/kept.json"
        " --out bench/results/pooled-2026-01-01-amd.json")
    free_text = "python -m bench run index (cargo bench; release profile)"
    assert shown_command(free_text, "x.json", tmp_path) == free_text
