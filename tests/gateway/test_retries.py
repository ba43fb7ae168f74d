"""Slow first bytes and retry storms (docs/reliability.md): `timeouts.first_byte` is the per-try
deadline, after which the request goes to another replica (the slow try is cancelled);
`retries` bounds the tries and `timeouts.total` the whole request, retries included;
`retry_budget` bounds retries across requests."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai
import pytest

from tests.support.gateway import Gateway, http_get, metric_value, start_sim
from tests.support.procs import wait_for

MSG = [{"role": "user", "content": "hi"}]


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)


def test_a_slow_first_byte_is_retried_on_another_replica_and_the_slow_try_cancelled(
        gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m", "--ttft-ms", "5000") as slow, start_sim("--model", "m") as fast:
        gw = gateway_factory([f"slow={slow.url}=m", f"fast={fast.url}=m"],
                             {"timeouts": {"first_byte": 0.5}, "routing": {"m": {"policy": "round_robin"}},
                              "health": {"eject_base": 0.1, "eject_max": 0.1}})
        with _client(gw) as c:
            for _ in range(4):
                t0 = time.monotonic()
                assert c.chat.completions.create(model="m", messages=MSG, max_tokens=2).choices
                assert time.monotonic() - t0 < 2.5
        recs = gw.usage(4)
        assert {r["replica"] for r in recs} == {"fast"} and all(r["status"] == "ok" for r in recs)
        retried = sum(r["retries"] for r in recs)
        assert retried >= 1, "round robin sent some requests to the slow replica first"
        deadline = time.monotonic() + 5
        while metric_value(http_get(slow.url + "/metrics"), "llmgw_sim_requests_aborted_total") < retried:
            assert time.monotonic() < deadline, "the slow tries were not cancelled"
            time.sleep(0.05)


def test_when_every_replica_is_slow_tries_and_time_stay_bounded(
        gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m", "--ttft-ms", "5000") as a, start_sim("--model", "m", "--ttft-ms", "5000") as b:
        gw = gateway_factory([f"a={a.url}=m", f"b={b.url}=m"],
                             {"retries": 1, "timeouts": {"first_byte": 0.6, "total": 1.0}})
        t0 = time.monotonic()
        try:
            with _client(gw) as c:
                c.chat.completions.create(model="m", messages=MSG, max_tokens=2)
            raise AssertionError("a request to slow replicas only succeeded")
        except openai.APIStatusError as e:
            assert e.status_code == 504, e
        waited = time.monotonic() - t0
        assert waited < 1.8, f"the total deadline of 1 s (retries included) held the client {waited:.1f}s"
        [rec] = gw.usage(1)
        assert rec["retries"] <= 1 and rec["status"] == "timeout", rec


def test_a_replica_that_keeps_failing_is_ejected_for_longer_each_time(
        gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m") as sim:
        # 100: the model's only replica may be ejected (at the default it is spared, below).
        gw = gateway_factory([f"r1={sim.url}=m"],
                             {"health": {"eject_base": 0.4, "eject_max": 0.8, "probe_interval": 60,
                                         "max_ejection_percent": 100}})
        c = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=10)

        def fail() -> None:
            try:
                c.chat.completions.create(model="m", messages=MSG, max_tokens=1,
                                          extra_headers={"x-sim-fault": "fail=500"})
            except openai.APIStatusError as e:
                assert e.status_code == 502, e
            else:
                raise AssertionError("a failing replica answered")

        fail()
        with pytest.raises(openai.APIStatusError) as ejected:
            c.chat.completions.create(model="m", messages=MSG, max_tokens=1)
        assert ejected.value.status_code == 503  # ejected: nothing to route to
        for wait in (0.5, 0.9, 0.9):  # back after 0.4 s, then 0.8, then still 0.8 (the cap)
            time.sleep(wait)
            fail()
        time.sleep(0.9)  # the ejection's own clock: a request meanwhile would count
        assert c.chat.completions.create(model="m", messages=MSG, max_tokens=1).choices  # a success ends the run
        fail()
        c.close()
        # The gateway logs an ejection before it answers, but the test reads its output on
        # another thread: wait (bounded) for the fifth line rather than read it at once.
        lines = wait_for("five ejection lines in the gateway's log",
                         lambda: (found := [ln for ln in gw.proc.lines if "ejected for" in ln])[4:] and found,
                         timeout=5.0)
        got = [(ln.split("ejected for ")[1].split("s ")[0], ln.split("(ejection ")[1].split()[0]) for ln in lines]
        assert got == [("0.4", "1"), ("0.8", "2"), ("0.8", "3"), ("0.8", "4"), ("0.4", "1")], lines


def test_a_models_only_replica_is_spared_and_keeps_serving(gateway_factory: Callable[..., Gateway]) -> None:
    # At the default max_ejection_percent (50) errors never leave a model without a replica:
    # its only one answering 500 gives that client a 502, and the next request is served
    # (it was a 503 for eject_base seconds before, 60 s after a few failures in a row).
    with start_sim("--model", "m") as sim:
        gw = gateway_factory([f"r1={sim.url}=m"], {"health": {"eject_base": 30, "probe_interval": 60}})
        def spared_lines() -> list[str]:
            return [ln for ln in gw.proc.lines if "is not ejected" in ln]

        with _client(gw) as c:
            for run in (3, 1):  # a run of three failures, a success, then one more
                for _ in range(run):
                    with pytest.raises(openai.APIStatusError) as failed:
                        c.chat.completions.create(model="m", messages=MSG, max_tokens=1,
                                                  extra_headers={"x-sim-fault": "fail=500"})
                    assert failed.value.status_code == 502
                assert c.chat.completions.create(model="m", messages=MSG, max_tokens=1).choices
        assert gw.metric("llmgw_replica_ejections_spared_total", replica="r1") == 4
        assert gw.metric("llmgw_replica_ejections_total", replica="r1") == 0
        # Logged once a run of failures, not once a failure (the output is read on another thread).
        lines = wait_for("the spared replica's log lines", lambda: spared_lines()[1:] and spared_lines(), timeout=5.0)
        time.sleep(0.2)  # time for a third line, if any, to be read
        assert len(spared_lines()) == 2, spared_lines()
        assert "model 'm'" in lines[0] and "max_ejection_percent 50" in lines[0], lines


def test_errors_on_every_replica_eject_at_most_half(gateway_factory: Callable[..., Gateway]) -> None:
    # Both replicas fail the same request: the first is ejected, the retry's failure spares the
    # second, and the model keeps one replica to serve the next requests.
    with start_sim("--model", "m") as a, start_sim("--model", "m") as b:
        gw = gateway_factory([f"a={a.url}=m", f"b={b.url}=m"],
                             {"retries": 1, "health": {"eject_base": 30, "probe_interval": 60}})
        with _client(gw) as c:
            with pytest.raises(openai.APIStatusError) as failed:
                c.chat.completions.create(model="m", messages=MSG, max_tokens=1,
                                          extra_headers={"x-sim-fault": "fail=500"})
            assert failed.value.status_code == 502
            for _ in range(4):
                assert c.chat.completions.create(model="m", messages=MSG, max_tokens=1).choices
        recs = gw.usage(5)
        assert recs[0]["retries"] == 1 and recs[0]["status"] == "upstream_error", recs[0]
        ejected = {r: gw.metric("llmgw_replica_ejections_total", replica=r) for r in ("a", "b")}
        spared = {r: gw.metric("llmgw_replica_ejections_spared_total", replica=r) for r in ("a", "b")}
        assert sorted(ejected.values()) == [0, 1] and sorted(spared.values()) == [0, 1], (ejected, spared)
        kept = next(r for r, n in spared.items() if n == 1)
        assert {r["replica"] for r in recs[1:]} == {kept}, recs


def test_retries_across_requests_stay_within_the_retry_budget(
        gateway_factory: Callable[..., Gateway]) -> None:
    # Both replicas answer 429 to every request (busy, never ejected): without a budget each
    # request would be tried twice. With ratio 0.2 and no floor, retries add at most a fifth.
    with start_sim("--model", "m") as a, start_sim("--model", "m") as b:
        gw = gateway_factory([f"a={a.url}=m", f"b={b.url}=m"],
                             {"retries": 1, "retry_budget": {"ratio": 0.2, "min_per_second": 0}})
        n = 40
        with _client(gw) as c:
            for _ in range(n):
                with pytest.raises(openai.APIStatusError) as busy:
                    c.chat.completions.create(model="m", messages=MSG, max_tokens=1,
                                              extra_headers={"x-sim-fault": "fail=429"})
                assert busy.value.status_code == 429
        recs = gw.usage(n)
        retried = sum(r["retries"] for r in recs)
        assert 5 <= retried <= n * 0.2, retried
        assert all(r["status"] == "busy" for r in recs)
        assert gw.metric("llmgw_upstream_retries_total", model="m") == retried
        assert gw.metric("llmgw_upstream_retries_refused_total", model="m") == n - retried
