"""`python -m bench pool`: pooling throughput runs of one code, and refusing the rest."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import msgspec
import pytest
from bench.__main__ import main
from bench.load import LoadResult
from bench.pool import PoolError, check_code, pool
from bench.report import Machine, Result, Round

from bench import pool as pool_mod


def _round(n: int, target: str, c: int, rps: float) -> Round:
    res = LoadResult(ok=int(rps), cut=0, errors={}, duration_s=1.0, rps=rps,
                     latency_ms={"p50": 1.0, "p90": 1.0, "p99": 2.0, "mean": 1.0}, ttft_ms={}, gap_ms={},
                     gap_mean_ms=math.nan, chunks=0, chunks_per_s=0.0, client_cpu=0.5)
    return Round(round=n, target=target, concurrency=c, stream=False, result=res,
                 server_cpu=None, server_rss_mb=None, upstream_cpu=None)


def _result(pairs: dict[int, list[tuple[float, float]]], commit: str = "abc123",
            scenario: str = "throughput") -> Result:
    """A throughput result whose rounds at each concurrency are (keyed, plain) req/s pairs."""
    rounds = [r for c, ps in pairs.items() for n, (k, p) in enumerate(ps, 1)
              for r in (_round(n, "llmgw", c, p), _round(n, "llmgw-keys", c, k))]
    return Result(scenario=scenario, date="2026-12-02", started_at="", finished_at="", command="",
                  machine=Machine(nproc=2, cpu_model="", python="", platform="", loadavg_start=[]),
                  versions={"llmgw_git": commit}, settings={}, targets=[], rounds=rounds, summary=[],
                  void=False, void_reason="", figures={})


def test_pool_puts_every_runs_rounds_together_and_keeps_each_runs_own_ratio() -> None:
    a = _result({32: [(90.0, 100.0), (95.0, 100.0), (80.0, 100.0)], 1: [(10.0, 10.0)]})
    b = _result({32: [(180.0, 200.0), (170.0, 200.0), (160.0, 200.0)], 1: [(9.0, 10.0)]})
    levels = pool([a, b])
    assert [lv.concurrency for lv in levels] == [1, 32]
    c32 = levels[1]
    assert c32.rounds == 6
    assert c32.plain_rps == pytest.approx(150.0) and c32.keyed_rps == pytest.approx(127.5)
    assert c32.ratio_of_medians == pytest.approx(127.5 / 150.0)
    assert c32.paired_median == pytest.approx(0.875)  # of 0.9, 0.95, 0.8, 0.9, 0.85, 0.8
    assert c32.per_run == [pytest.approx(0.9), pytest.approx(0.85)]
    assert c32.runs_meeting == 1
    assert c32.ci95[0] <= c32.ratio_of_medians <= c32.ci95[1]
    assert pool([a, b], [32]) == [c32]


def test_pool_refuses_what_it_cannot_pool() -> None:
    a = _result({32: [(90.0, 100.0)]})
    with pytest.raises(PoolError, match="only throughput results pool"):
        pool([a, _result({32: [(1.0, 1.0)]}, scenario="overhead")])
    with pytest.raises(PoolError, match="no concurrency has rounds of both"):
        pool([a, _result({256: [(1.0, 1.0)]})])
    with pytest.raises(PoolError, match="concurrency 1 is not in every result"):
        pool([a], [1])


def test_code_check_pools_one_code_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_code(["abc", "abc"]) == "one commit, abc"
    with pytest.raises(PoolError, match="uncommitted or unknown code"):
        check_code(["abc", "abc+dirty"])
    with pytest.raises(PoolError, match="uncommitted or unknown code"):
        check_code(["abc", ""])
    monkeypatch.setattr(pool_mod, "_same_code", lambda a, b: b == "def")
    assert "git says are the same" in check_code(["abc", "def", "abc"])
    with pytest.raises(PoolError, match="python/ or rust/ differ between abc and xyz"):
        check_code(["abc", "def", "xyz"])


def test_same_code_asks_git() -> None:
    # This checkout's own commit against itself; a name git does not know is not the same.
    assert pool_mod._same_code("HEAD", "HEAD")
    assert not pool_mod._same_code("HEAD", "no-such-commit-anywhere")


def test_the_command_prints_the_table_writes_json_and_says_why_it_refuses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for n, pairs in enumerate(([(95.0, 100.0), (93.0, 100.0)], [(97.0, 100.0), (91.0, 100.0)])):
        f = tmp_path / f"run{n}.json"
        f.write_bytes(msgspec.json.encode(_result({32: pairs})))
        files.append(str(f))
    out = tmp_path / "pooled.json"
    assert main(["pool", *files, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pooled over 2 runs (one commit, abc123)" in text
    assert "| 32 | 4 | 100 | 94 | 0.940 |" in text
    doc = json.loads(out.read_text())
    assert doc["files"] == files and doc["target"] == 0.9
    # The arguments given to `main`, not the test runner's own command line.
    assert doc["command"].endswith(shlex.join(["-m", "bench", "pool", *files, "--out", str(out)]))
    assert doc["levels"][0]["runs_meeting"] == 2

    dirty = tmp_path / "dirty.json"
    dirty.write_bytes(msgspec.json.encode(_result({32: [(1.0, 1.0)]}, commit="abc123+dirty")))
    assert main(["pool", files[0], str(dirty)]) == 2
    assert "uncommitted or unknown code" in capsys.readouterr().err
    assert main(["pool", files[0], str(dirty), "--any-code"]) == 0
    assert "code not checked (--any-code)" in capsys.readouterr().out

    (tmp_path / "bad.json").write_text("{}")
    assert main(["pool", str(tmp_path / "bad.json")]) == 2
    assert "cannot read it as a bench result" in capsys.readouterr().err


def test_committed_pools_decode_and_name_their_runs() -> None:
    results = Path(__file__).parents[2] / "bench" / "results"
    whole = 0
    for path in sorted(results.glob("pooled-*.json")):
        p = msgspec.json.decode(path.read_bytes(), type=pool_mod.Pooled)
        assert p.kind == "pooled-throughput-keys" and p.levels, path
        assert len(p.code) == len(p.files), path
        # A pool over many runs keeps its figures while most of its runs leave the tree (git
        # has them); a run it names that is here measured the commit the pool says.
        kept = [(results.parent.parent / f, c) for f, c in zip(p.files, p.code, strict=True)
                if (results.parent.parent / f).is_file()]
        whole += len(kept) == len(p.files)
        for f, code in kept:
            assert msgspec.json.decode(f.read_bytes(), type=Result).versions["llmgw_git"] == code
        for lv in p.levels:
            assert len(lv.per_run) == len(p.files)
            assert lv.ci95[0] <= lv.ratio_of_medians <= lv.ci95[1]
    assert whole, "no committed pool has all its runs beside it"
