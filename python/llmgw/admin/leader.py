"""GET /api/v1/leader: which control plane leads, since when, and this one's role.

Answered by every control plane itself, standby included (`app.LOCAL_PATHS`):
it is how an operator, or a test, finds out where a failover went.
"""

from __future__ import annotations

import msgspec

from .route import Request, Route


class LeaderView(msgspec.Struct, kw_only=True):
    """The leader as this control plane knows it."""

    role: str
    """This control plane's role: `leader` or `standby`."""
    id: str
    """This control plane's id (new at each start)."""
    store: str
    """`sqlite` (one control plane, no lease) or `postgres` (a lease elects the leader)."""
    leader_id: str | None = None
    """The leader's id; None when no leader is known (a standby during a failover)."""
    leader_admin_url: str | None = None
    leader_agent_address: str | None = None
    leader_since: float | None = None
    """When the leader took the lease (unix seconds, the store's clock; on SQLite the start)."""
    lease_ttl: float | None = None
    """Seconds the lease lasts (PostgreSQL only)."""


async def leader(req: Request) -> LeaderView:
    """Who leads, seen from this control plane."""
    lead = req.state.leadership
    view = LeaderView(role="leader" if lead.is_leader else "standby", id=lead.id,
                      store="sqlite" if lead.single else "postgres",
                      lease_ttl=None if lead.single else lead.ttl)
    if lead.is_leader:
        view.leader_id, view.leader_admin_url = lead.id, lead.admin_url
        view.leader_agent_address = lead.agent_address
        view.leader_since = lead.since if lead.single or lead.leader is None else lead.leader.since
    elif (other := lead.other_leader()) is not None:
        view.leader_id, view.leader_admin_url = other.holder, other.admin_url
        view.leader_agent_address, view.leader_since = other.agent_address, other.since
    return view


ROUTES: list[Route] = [
    Route("GET", "/api/v1/leader", "Which control plane leads", leader,
          description="This control plane's role (leader or standby) and the leader it knows: "
                      "its id, admin URL, agent address and since when it leads. Answered by "
                      "standbys themselves, not forwarded.",
          response=LeaderView),
]
