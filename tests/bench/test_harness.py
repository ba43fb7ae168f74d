"""The result format, the void rule, round interleaving and the SSE counting of bench/."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from bench.load import LoadResult, LoadSpec, build_request, content_events, target_path
from bench.procs import TICK, Sampler
from bench.report import DIRECT, Machine, Result, Round, Row, Target, summary_table, void_check
from bench.runner import Stack, fold, paired_added, paired_rps_ratio, rps_pairs, schedule
from bench.stats import spread

from bench import report


def _res(rps: float, p50: float = 1.0, p99: float = 2.0, gap: float = math.nan) -> LoadResult:
    return LoadResult(
        ok=int(rps),
        cut=0,
        errors={},
        duration_s=1.0,
        rps=rps,
        latency_ms={"p50": p50, "p90": p50, "p99": p99, "mean": p50},
        ttft_ms={},
        gap_ms={},
        gap_mean_ms=gap,
        chunks=0,
        chunks_per_s=0.0,
        client_cpu=0.5,
    )


def _row(target: str, c: int, rps: float) -> Row:
    s = spread([rps])
    return Row(
        target=target,
        concurrency=c,
        rounds=1,
        rps=s,
        p50_ms=s,
        p99_ms=s,
        ttft_p50_ms=spread([]),
        gap_mean_ms=spread([]),
        server_cpu=spread([]),
        rss_mb_max=math.nan,
        errors=0,
        cut=0,
        client_cpu=0.5,
    )


def test_schedule_interleaves_targets_within_each_round() -> None:
    plan = schedule(["direct", "a", "b"], [1, 32], 2)
    assert plan == [
        (1, 1, "direct"),
        (1, 1, "a"),
        (1, 1, "b"),
        (1, 2, "direct"),
        (1, 2, "a"),
        (1, 2, "b"),
        (32, 1, "direct"),
        (32, 1, "a"),
        (32, 1, "b"),
        (32, 2, "direct"),
        (32, 2, "a"),
        (32, 2, "b"),
    ]


def test_void_rule() -> None:
    ok = [_row(DIRECT, 32, 3000), _row("llmgw", 32, 1000), _row("vllm-router", 32, 900)]
    assert void_check(ok) == (False, "")
    bad = [_row(DIRECT, 32, 2999), _row("llmgw", 32, 1000)]
    void, why = void_check(bad)
    assert void and "c=32" in why
    # one valid level does not rescue another
    void, why = void_check([*ok, _row(DIRECT, 1, 100), _row("llmgw", 1, 50)])
    assert void and "c=1" in why and "c=32" not in why
    assert void_check([_row("llmgw", 1, 50)])[0]  # no direct figure: cannot be valid
    # a target that answered nothing but errors (a broken build) voids its level
    broken = msgspec.structs.replace(_row("llmgw-keys", 32, 0), errors=9_915)
    void, why = void_check([*ok, broken])
    assert void and why == "c=32: llmgw-keys answered only errors (9,915)"


def test_fold_and_paired_added() -> None:
    rounds = [
        Round(
            round=r,
            target=t,
            concurrency=1,
            stream=False,
            result=_res(100, p50=base + r * 0.1),
            server_cpu=None if t == DIRECT else 0.5,
            server_rss_mb=None if t == DIRECT else 70.0,
            upstream_cpu=0.3,
        )
        for r in (1, 2, 3)
        for t, base in ((DIRECT, 0.1), ("llmgw", 0.25))
    ]
    rows = fold(rounds, [DIRECT, "llmgw"])
    assert [(r.target, r.rounds) for r in rows] == [(DIRECT, 3), ("llmgw", 3)]
    assert rows[1].p50_ms["median"] == pytest.approx(0.45)
    assert rows[1].rss_mb_max == 70.0 and math.isnan(rows[0].rss_mb_max)
    assert paired_added(rounds, "llmgw", "latency_p50", 1) == pytest.approx(150.0)  # µs


def test_paired_rps_ratio_divides_within_each_round_and_reports_the_spread() -> None:
    # Round 2 is slow for both (the machine was busy): its pair still says 0.9, which a
    # ratio of the two medians would not show.
    rps = {("llmgw", 1): 100, ("llmgw-keys", 1): 95, ("llmgw", 2): 50, ("llmgw-keys", 2): 45,
           ("llmgw", 3): 110, ("llmgw-keys", 3): 88}
    rounds = [
        Round(round=r, target=t, concurrency=32, stream=False, result=_res(n),
              server_cpu=None, server_rss_mb=None, upstream_cpu=None)
        for (t, r), n in rps.items()
    ]
    # A round where only one side ran is left out.
    rounds.append(Round(round=4, target="llmgw", concurrency=32, stream=False, result=_res(999),
                        server_cpu=None, server_rss_mb=None, upstream_cpu=None))
    got = paired_rps_ratio(rps_pairs(rounds, "llmgw-keys", "llmgw", 32))
    assert got is not None
    assert got["median"] == pytest.approx(0.9)
    assert (got["min"], got["max"]) == (pytest.approx(0.8), pytest.approx(0.95))
    assert paired_rps_ratio(rps_pairs(rounds, "llmgw-keys", "llmgw", 256)) is None


def _result() -> Result:
    rounds = [
        Round(
            round=1,
            target=t,
            concurrency=32,
            stream=False,
            result=_res(r),
            server_cpu=None,
            server_rss_mb=None,
            upstream_cpu=None,
        )
        for t, r in ((DIRECT, 3000.0), ("llmgw", 1100.0))
    ]
    summary = fold(rounds, [DIRECT, "llmgw"])
    void, why = void_check(summary)
    return Result(
        scenario="throughput",
        date="2026-01-01",
        started_at="x",
        finished_at="y",
        command="python -m bench run throughput",
        machine=Machine(
            nproc=2, cpu_model="cpu", python="3.11", platform="linux", loadavg_start=[0, 0, 0]
        ),
        versions={"llmgw": "0.1.0"},
        settings={"rounds": 1, "concurrency": [32], "stream": False},
        targets=[
            Target(name=DIRECT, kind="upstream", version="0.1.0", command=["llmgw"]),
            Target(
                name="litellm",
                kind="gateway",
                version="1.110.2",
                command=[],
                status="install failed: no",
            ),
        ],
        rounds=rounds,
        summary=summary,
        void=void,
        void_reason=why,
        figures={"x": None},
    )


REQUIRED = {
    "scenario": str,
    "date": str,
    "started_at": str,
    "finished_at": str,
    "command": str,
    "machine": dict,
    "versions": dict,
    "settings": dict,
    "targets": list,
    "rounds": list,
    "summary": list,
    "void": bool,
    "void_reason": str,
    "figures": dict,
}


def test_result_json_schema_round_trips() -> None:
    raw = msgspec.json.encode(_result())
    doc = msgspec.json.decode(raw)
    for key, typ in REQUIRED.items():
        assert isinstance(doc[key], typ), key
    assert {"nproc", "cpu_model", "python", "loadavg_start"} <= doc["machine"].keys()
    rnd = doc["rounds"][0]
    assert {"round", "target", "concurrency", "result", "server_cpu", "server_rss_mb"} <= rnd.keys()
    assert {"ok", "cut", "errors", "rps", "latency_ms", "ttft_ms", "gap_ms", "client_cpu"} <= rnd[
        "result"
    ].keys()
    assert {"median", "min", "max"} == doc["summary"][0]["rps"].keys()
    assert {"name", "version", "command", "status"} <= doc["targets"][0].keys()
    assert msgspec.json.decode(raw, type=Result) == msgspec.json.decode(
        raw, type=Result
    )  # typed decode


def test_summary_table_says_void_and_failed_peers() -> None:
    text = summary_table(_result())
    assert "VOID" in text and "litellm: install failed" in text and "llmgw" in text


def test_committed_results_decode() -> None:
    from pathlib import Path

    from bench.scenarios import SCENARIOS, load

    results = Path(__file__).parents[2] / "bench" / "results"
    for name, sc in SCENARIOS.items():  # other harnesses may keep their own files in bench/results
        kind = Result if sc.own is None else load(sc.own.result)
        for path in sorted(results.glob(f"{name}-????-??-??*.json")):
            res = msgspec.json.decode(path.read_bytes(), type=kind)
            assert res.scenario == name
            if name == "keyed-cost":  # windows with both gateways loaded at once, not rounds
                assert res.windows
            else:  # index, usage and auth run in-process: their figures, no load rounds
                assert res.rounds or name in ("index", "usage", "auth")


def test_target_path_and_request() -> None:
    assert target_path("http://127.0.0.1:8080") == ("127.0.0.1", 8080, "/v1/chat/completions")
    assert target_path("http://h:1/v1/") == ("h", 1, "/v1/chat/completions")
    assert target_path("h:2/x/chat") == ("h", 2, "/x/chat")
    head, body = build_request(LoadSpec(url="http://h:1", stream=True))
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"content-length: {len(body)}".encode() in head
    assert msgspec.json.decode(body)["stream"] is True


def test_content_events_counts_only_content_and_keeps_partial_events() -> None:
    buf = bytearray(
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":" a"}}]}\r\n\r\n'
        b'data: {"choices":[],"usage":{"total_tokens":3}}\n\n'
        b'data: {"choices":[{"delta": {"content": " b"}}]}\n\ndata: [DO'
    )
    assert content_events(buf) == (2, False)
    assert buf == b"data: [DO"
    buf += b"NE]\n\n"
    assert content_events(buf) == (0, True)


@contextlib.contextmanager
def _spinning() -> Iterator[None]:
    """A thread that spins (never waits) for as long as the block runs."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def test_sampler_measures_the_busiest_thread() -> None:
    """A thread spinning through the round reads as most of a core; the group's CPU includes it."""
    with _spinning(), Sampler(os.getpgid(0)) as s:
        time.sleep(0.4)
    assert 0.3 <= s.busiest <= 1.05
    assert s.cpu >= s.busiest - 0.1
    assert s.busiest_delta is None  # read only when asked for


def test_sampler_detail_reads_the_busiest_threads_kernel_counters() -> None:
    """With `detail`, the spinning thread's counters: it ran most of the span, in user space,
    and its clock ticks agree with its run time."""
    with _spinning(), Sampler(os.getpgid(0), detail=True) as s:
        time.sleep(0.5)
    d = s.busiest_delta
    assert d is not None
    assert d.run_ns >= 0.3e9
    assert d.user_ticks > d.sys_ticks
    ticked = (d.user_ticks + d.sys_ticks) * 1e9 / TICK
    assert abs(ticked - d.run_ns) <= 0.3 * d.run_ns + 2e9 / TICK
    assert min(d.wait_ns, d.voluntary, d.involuntary) >= 0


def test_keyed_cost_window_shares_the_rest_of_the_machine_and_charges_the_control_plane_to_keyed() -> None:
    from bench.keyed_cost import _void, figures, window

    # 1,000 requests each; plain's gateway 200 ms, keyed's 220 ms and its control plane 10 ms;
    # the machine 630 ms busy, so 200 ms of it (loader, upstream, kernel) is shared: 100 µs each.
    w = window(200_000_000, 220_000_000, 10_000_000, 630_000_000, _res(1000), _res(1000))
    assert (w.plain_us, w.keyed_us, w.cp_us, w.shared_us) == (200.0, 220.0, 10.0, 100.0)
    assert w.cost_ratio == pytest.approx(300 / 330)
    # /proc/stat's ticks can read less than the groups' nanoseconds: nothing is shared then.
    assert window(100, 100, 0, 50, _res(1), _res(1)).shared_us == 0.0
    other = window(200_000_000, 200_000_000, 0, 400_000_000, _res(1000), _res(1000))
    figs = figures([w, other, w])
    assert figs["keyed_cost_ratio"] == pytest.approx(300 / 330, abs=1e-3)
    assert figs["keyed_cost_ratio_max"] == 1.0
    assert figs["keyed_added_gateway_us"] == 20.0
    # A window that did not hold the rate (or saw errors) voids the run, saying what to do.
    assert _void(w, rate=1000.0, seconds=1.0) == ""
    assert "--rate" in _void(w, rate=2000.0, seconds=1.0)


def test_pin_layout_keeps_the_gateways_off_the_load_generators_cpu(tmp_path: Path) -> None:
    """`--pin`: this process (the load generator) on the first CPU, every thread of every
    server on the others; on one CPU nothing is pinned."""
    cpus = sorted(os.sched_getaffinity(0))
    server = subprocess.Popen(
        [sys.executable, "-c", ("import threading, time\n"
                                "threading.Thread(target=time.sleep, args=(20,)).start()\ntime.sleep(20)")],
        start_new_session=True)
    try:
        while len(os.listdir(f"/proc/{server.pid}/task")) < 2:  # its second thread started
            time.sleep(0.01)
        stack = Stack(workdir=tmp_path)
        stack.servers["llmgw"] = SimpleNamespace(pid=server.pid)  # type: ignore[assignment]
        said = stack.pin_layout()
        if len(cpus) < 2:
            assert said == ""
            return
        assert os.sched_getaffinity(0) == {cpus[0]}
        threads = [int(t) for t in os.listdir(f"/proc/{server.pid}/task")]
        assert len(threads) == 2
        assert all(os.sched_getaffinity(t) == set(cpus[1:]) for t in threads)
        assert said.startswith(f"load generator and llmgw-keys' control plane on CPU {cpus[0]};")
    finally:
        os.sched_setaffinity(0, set(cpus))
        server.kill()
        server.wait()


def test_machine_split_reads_proc_stat_and_says_how_the_machine_spent_a_span() -> None:
    """Ticks from /proc/stat's first line; the span's busy, idle, iowait and steal in cores."""
    from bench.procs import busy_ticks, machine_split, machine_ticks

    before = machine_ticks("cpu  100 5 50 1000 10 3 2 0 0 0\ncpu0 1 2 3\n")
    assert before == (100, 5, 50, 1000, 10, 3, 2, 0)
    assert busy_ticks(before) == 160
    # Two CPUs over one second: 1.2 cores busy, 0.5 idle, 0.1 waiting on I/O, 0.2 stolen.
    after = tuple(a + round(d * TICK) for a, d in zip(before, (0.9, 0.1, 0.1, 0.5, 0.1, 0.06, 0.04, 0.2), strict=True))
    split = machine_split(before, after, 1.0)
    assert split == pytest.approx({"busy": 1.2, "idle": 0.5, "iowait": 0.1, "steal": 0.2})
    # Old kernels write fewer fields: the missing ones read 0.
    assert machine_ticks("cpu 1 2 3 4 5 6 7")[7] == 0
    with pytest.raises(ValueError, match="not a /proc/stat cpu line"):
        machine_ticks("intr 1 2 3")
    live = machine_ticks()
    assert len(live) == 8 and busy_ticks(live) > 0


def test_throughput_figures_give_the_machines_idle_cores_and_the_steal_per_level() -> None:
    """Each gateway's median idle cores while it ran, and the steal over every round of a
    level; rounds from results before `machine` was read are left out, not read as zero."""
    from bench.scenarios import _figures

    def rnd(n: int, target: str, idle: float, steal: float, machine: bool = True) -> Round:
        return Round(round=n, target=target, concurrency=32, stream=False, result=_res(1000.0),
                     server_cpu=None, server_rss_mb=None, upstream_cpu=None,
                     machine={"busy": 2.0 - idle - steal, "idle": idle, "iowait": 0.0, "steal": steal}
                     if machine else None)

    rounds = [rnd(1, DIRECT, 0.0, 0.05), rnd(1, "llmgw", 0.4, 0.0), rnd(1, "llmgw-keys", 0.5, 0.3),
              rnd(2, DIRECT, 0.0, 0.0), rnd(2, "llmgw", 0.2, 0.1), rnd(2, "llmgw-keys", 0.3, 0.0),
              rnd(3, "llmgw", 9.9, 9.9, machine=False)]
    order = [DIRECT, "llmgw", "llmgw-keys"]
    figs = _figures("throughput", rounds, fold(rounds, order), [32])
    assert figs["llmgw_machine_idle_cores_c32"] == pytest.approx(0.3)
    assert figs["llmgw_keys_machine_idle_cores_c32"] == pytest.approx(0.4)
    assert figs["machine_steal_cores_median_c32"] == pytest.approx(0.025)
    assert figs["machine_steal_cores_max_c32"] == pytest.approx(0.3)


def test_machine_facts_say_what_moves_the_keyed_figures() -> None:
    # The clock source and the SMT siblings differ between the hosts the bench runs on, and the
    # keyed path reads the clock more than the plain one: every result records them.
    m = report.machine_facts()
    assert m.nproc >= 1 and m.cpu_model
    assert m.clocksource == Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
    assert m.threads_per_core >= 1
    assert set(m.cpu_flags) <= report._FLAGS_OF_NOTE
    assert [report._cpu_count(x) for x in ("0", "0-1", "0,2", "0-1,4-5", "", "junk")] == [1, 2, 2, 4, 0, 0]


def test_machine_facts_name_a_preloaded_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    # A run under bench/tools/sysclock.c measures another clock than the host's: it says so.
    monkeypatch.setenv("LD_PRELOAD", "/tmp/sysclock.so")
    assert report.machine_facts().preload == "/tmp/sysclock.so"
    monkeypatch.delenv("LD_PRELOAD")
    assert report.machine_facts().preload == ""
