"""The control plane's gauges read from live state: the fleet's and the limits authority's."""

from __future__ import annotations

from types import SimpleNamespace

from llmgw.control.limits import LimitsAuthority
from llmgw.control.metrics import _fleet, _limits
from llmgw.protocol.wire import LeaseAsk, LeaseRequest, Limits


def _samples(families: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in families for s in fam.samples}  # type: ignore[attr-defined]


def test_the_fleets_gauges_count_nodes_and_replicas_by_their_labels() -> None:
    node = SimpleNamespace
    fleet = SimpleNamespace(
        nodes={"a": node(state="ready", admin_state="ready"), "b": node(state="ready", admin_state="ready"),
               "c": node(state="unreachable", admin_state="cordoned")},
        replicas={"r1": node(model="m", state="ready"), "r2": node(model="m", state="starting")},
        unplaced={"m": 2}, passes=7)
    got = _samples(_fleet(fleet))
    assert got[("llmgw_nodes", (("admin_state", "ready"), ("state", "ready")))] == 2
    assert got[("llmgw_nodes", (("admin_state", "cordoned"), ("state", "unreachable")))] == 1
    assert got[("llmgw_replicas", (("model", "m"), ("state", "starting")))] == 1
    assert got[("llmgw_replicas_unplaced", (("model", "m"),))] == 2
    assert got[("llmgw_reconcile_passes_total", ())] == 7


def test_the_limits_gauges_follow_the_authority() -> None:
    auth = LimitsAuthority(clock=lambda: 0.0)
    auth.lease_now(LeaseRequest(gateway_id="g", asks=[LeaseAsk(scope="key:k", limits=Limits(tpm=100),
                                                                tokens=40)]), 0.0)
    got = _samples(_limits(auth))
    assert got[("llmgw_limit_granted_total", (("kind", "tokens"),))] == 40
    assert got[("llmgw_limit_refusals_total", (("limit", "tpm"),))] == 0
    assert (got[("llmgw_limit_scopes", ())], got[("llmgw_limit_gateways", ())]) == (1, 1)
    assert got[("llmgw_limit_slots_held", ())] == 0
