"""Passive ejection and `health.max_ejection_percent`: errors never take more than that share of
a model's replicas out of routing (docs/reliability.md, "Replica keeps failing")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
import pytest

from llmgw.config import Endpoint, HealthChecks
from llmgw.gateway.replicas import ReplicaSet


def _set(n: int, pct: int, extra: list[Endpoint] | None = None) -> Callable[[], ReplicaSet]:
    eps = [Endpoint(id=f"r{i}", url=f"http://127.0.0.1:{9000 + i}", models=["m"]) for i in range(n)]
    return lambda: ReplicaSet(asyncio.get_running_loop(), eps + (extra or []),
                              HealthChecks(max_ejection_percent=pct, eject_base=30, eject_max=30))


def _routable(rs: ReplicaSet) -> list[str]:
    return [r.id for r in rs.replicas if rs.router.is_healthy(r.index)]


@pytest.mark.parametrize(("n", "pct", "out"), [
    (1, 50, 0),   # a model's only replica keeps serving
    (2, 50, 1),
    (3, 50, 1),   # two of three out would be over half
    (4, 50, 2),
    (4, 25, 1),
    (3, 100, 3),  # everything may go: 503 until one returns
    (3, 0, 0),
])
def test_errors_eject_at_most_the_share_of_a_models_replicas(n: int, pct: int, out: int) -> None:
    async def main() -> None:
        rs = _set(n, pct)()
        spared: list[str] = []
        rs.on_spared = spared.append
        for _ in range(3):  # every replica fails, three times over
            for r in rs.replicas:
                rs.failed(r, "answered HTTP 500")
        assert len(_routable(rs)) == n - out
        ejected = [r for r in rs.replicas if r.ejections]
        assert len(ejected) == out
        # An ejected replica that fails again (a request still running on it) is ejected for
        # longer; the spared ones count each failure, and stay at zero ejections.
        assert all(r.ejections == 3 for r in ejected)
        assert len(spared) == 3 * (n - out)
        await rs.close()

    asyncio.run(main())


def test_a_replica_out_for_its_probe_counts_against_the_share() -> None:
    async def main() -> None:
        rs = _set(2, 50)()
        a, b = rs.replicas
        rs.router.set_healthy(a.index, False)  # a's probe fails: as `_probe` does
        a.probe_ok = False
        rs.failed(b, "answered HTTP 502")
        assert _routable(rs) == ["r1"] and b.ejections == 0 and b.spared
        rs.failed(a, "connection refused")  # already out: ejecting it takes nothing more out
        assert a.ejections == 1
        await rs.close()

    asyncio.run(main())


def test_the_share_is_per_model_and_a_success_ends_the_spared_run() -> None:
    async def main() -> None:
        # r0 serves m and also o, whose only replica it is: sparing it for o keeps it in m too.
        both = Endpoint(id="both", url="http://127.0.0.1:9100", models=["m", "o"])
        rs = _set(3, 100, [both])()
        last = rs.replicas[-1]
        rs.failed(last, "answered HTTP 500")
        assert last.ejections == 1  # at 100, o may be left with nothing
        rs.succeeded(last)
        rs.router.set_healthy(last.index, True)
        rs.health = HealthChecks(max_ejection_percent=50)
        rs.failed(last, "answered HTTP 500")
        assert last.spared and rs.router.is_healthy(last.index)
        rs.succeeded(last)
        assert not last.spared
        await rs.close()

    asyncio.run(main())


def test_max_ejection_percent_is_a_percentage() -> None:
    for bad in (-1, 101):
        with pytest.raises(msgspec.ValidationError, match="max_ejection_percent"):
            msgspec.convert({"max_ejection_percent": bad}, HealthChecks)
