"""Every admin route that changes something names the audit event it records.

Every change through the admin API is recorded. The behaviour of each is tested
where the change is (tests/store, tests/fleet, tests/e2e); this table makes a new route
that changes something fail here until it says what it records, and checks that each
action named is written by the package's code.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.admin.table import ROUTES

ROOT = Path(__file__).resolve().parents[2] / "python" / "llmgw"

AUDITED: dict[tuple[str, str], tuple[str, ...]] = {
    ("POST", "/api/v1/orgs"): ("org.create",),
    ("PATCH", "/api/v1/orgs/{org}"): ("org.update",),
    ("DELETE", "/api/v1/orgs/{org}"): ("org.delete",),
    ("POST", "/api/v1/teams"): ("team.create",),
    ("PATCH", "/api/v1/teams/{team}"): ("team.update",),
    ("DELETE", "/api/v1/teams/{team}"): ("team.delete",),
    ("POST", "/api/v1/projects"): ("project.create",),
    ("PATCH", "/api/v1/projects/{project}"): ("project.update",),
    ("DELETE", "/api/v1/projects/{project}"): ("project.delete",),
    ("POST", "/api/v1/users"): ("user.create",),
    ("PATCH", "/api/v1/users/{user}"): ("user.update",),
    ("DELETE", "/api/v1/users/{user}"): ("user.delete", "key.revoke"),
    ("POST", "/api/v1/members"): ("member.add", "member.update"),
    ("DELETE", "/api/v1/members/{user}"): ("member.remove", "key.revoke"),
    ("POST", "/api/v1/keys"): ("key.create",),
    ("PATCH", "/api/v1/keys/{id}"): ("key.update",),
    ("POST", "/api/v1/keys/{id}/revoke"): ("key.revoke",),
    ("POST", "/api/v1/requests/{id}/replay"): ("request.replay",),
    ("POST", "/api/v1/nodes/{id}/state"): ("node.{body.state}",),
    ("DELETE", "/api/v1/nodes/{id}"): ("node.remove",),
    ("POST", "/api/v1/models"): ("model.add",),
    ("DELETE", "/api/v1/models/{name}"): ("model.remove",),
    ("POST", "/api/v1/models/{name}/scale"): ("model.scale",),
    ("POST", "/api/v1/restart"): ("replica.restart",),
    ("POST", "/api/v1/join-tokens"): ("join_token.create",),
}


def test_every_route_that_changes_something_names_its_audit_event() -> None:
    changing = {(r.method, r.path) for r in ROUTES if r.method != "GET" and not r.internal}
    assert changing == set(AUDITED)


def test_each_named_event_is_written_by_the_code() -> None:
    code = "\n".join(p.read_text() for p in ROOT.rglob("*.py"))
    missing = [a for actions in AUDITED.values() for a in actions if f'"{a}"' not in code and f'f"{a}"' not in code]
    assert missing == []
