"""Every `llmgw ctl` command, as one table: noun, verb, the admin API route it calls,
its arguments (and where each goes: path, query or body) and the columns of its table.

The argparse tree and the calls are built from this table by a loop
(`llmgw.cli.ctl`); a test checks that every route a command names is in the
admin API's route table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .paths import EXAMPLE, FORM

Where = Literal["path", "query", "body"]
Kind = Literal["text", "org", "team", "project", "scope", "new-org", "new-team", "new-project",
               "int", "bool", "flag", "list", "model"]
Output = Literal["table", "object", "key", "token", "csv", "json", "routes", "done"]
ColumnKind = Literal["text", "time", "duration", "limits", "bool", "scope"]


@dataclass(frozen=True)
class Arg:
    """One argument: positional when `flag` has no leading `--`."""

    flag: str
    to: Where
    field: str
    """The path parameter, query parameter or body field; dotted for a nested body field."""
    help: str
    kind: Kind = "text"
    """org, team, project: an existing one, by its ID or its path (acme, acme/ml,
    acme/ml/chat), checked here and sent with ':' for '/' in a URL path; scope: the path of
    an org, team or project (its depth says which) or an ID, sent as `team:acme/ml`;
    new-org, new-team, new-project: the path of one to create, its last name sent as `field`
    and its parent's path as `org` (a team's) or `team` (a project's); flag: an on/off
    option sent as true when given; bool: --x / --no-x; list: comma-separated values, sent
    as a JSON list; model: a YAML or JSON file holding one model, as in server.yaml's
    `models:`, sent (validated, sizes in bytes) as the whole body."""
    required: bool = False
    choices: tuple[str, ...] | None = None
    default: str | None = None
    replaces: str = ""
    """An option this one takes the place of (`--org` for `--in`): given, it is refused with
    a sentence showing this one, before anything is sent."""


@dataclass(frozen=True)
class Column:
    """One column of a human table: its header, the answer's field, how to show it."""

    header: str
    field: str
    kind: ColumnKind = "text"
    """scope: the API's `team:acme/ml` shown as the path a scope argument takes, acme/ml."""


@dataclass(frozen=True)
class Command:
    """One `llmgw ctl NOUN [VERB]` command; verb "" is the noun's own command (`ctl usage`)."""

    noun: str
    verb: str
    method: str
    path: str
    help: str
    args: tuple[Arg, ...] = ()
    columns: tuple[Column, ...] = ()
    output: Output = "table"
    done: str = ""
    """For output "done": what is printed, formatted with the arguments."""


def _limits(what: str) -> tuple[Arg, ...]:
    return (
        Arg("--rpm", "body", "limits.rpm", f"requests per minute for the {what}", "int"),
        Arg("--tpm", "body", "limits.tpm", f"tokens per minute for the {what}", "int"),
        Arg("--concurrency", "body", "limits.concurrency", f"requests in flight at once for the {what}", "int"),
        Arg("--budget-tokens", "body", "limits.budget_tokens", f"tokens per budget period for the {what}", "int"),
        Arg("--budget-period", "body", "limits.budget_period", "the budget's period",
            choices=("day", "week", "month")),
    )


def _ttl(what: str) -> Arg:
    return Arg("--max-key-ttl", "body", "max_key_ttl",
               f"the longest lifetime of a key in this {what}, like 90d", "text")


_CREATED = Column("CREATED", "created_at", "time")
_ORG = (Column("ID", "id"), Column("NAME", "name"), Column("TEAMS", "teams"),
        Column("MAX KEY TTL", "max_key_ttl", "duration"), Column("LIMITS", "limits", "limits"), _CREATED)
_TEAM = (Column("ID", "id"), Column("PATH", "path"), Column("MAX KEY TTL", "max_key_ttl", "duration"),
         Column("LIMITS", "limits", "limits"), _CREATED)
_PROJECT = (Column("ID", "id"), Column("PATH", "path"), Column("KEEP BODIES", "keep_bodies", "bool"),
            Column("MAX KEY TTL", "max_key_ttl", "duration"), Column("LIMITS", "limits", "limits"), _CREATED)
_USER = (Column("ID", "id"), Column("NAME", "name"), Column("EMAIL", "email"), _CREATED)
_MEMBER = (Column("USER", "user"), Column("SCOPE", "scope", "scope"), Column("ROLE", "role"))
_KEY = (Column("ID", "id"), Column("NAME", "name"), Column("PREFIX", "prefix"), Column("PROJECT", "path"),
        Column("USER", "user"), Column("EXPIRES", "expires_at", "time"),
        Column("LAST USED", "last_used_at", "time"), Column("REVOKED", "revoked_at", "time"))
_USAGE = (Column("SCOPE", "path"), Column("REQUESTS", "requests"), Column("ERRORS", "errors"),
          Column("PROMPT", "prompt_tokens"), Column("COMPLETION", "completion_tokens"),
          Column("TOTAL", "total_tokens"))
_NODE = (Column("ID", "id"), Column("HOSTNAME", "hostname"), Column("STATE", "state"),
         Column("CONNECTED", "connected", "bool"), Column("GPUS", "gpu_summary"),
         Column("REPLICAS", "replicas"), Column("HEARTBEAT", "last_heartbeat", "time"),
         Column("REASON", "reason"))
_MODEL = (Column("NAME", "name"), Column("ORIGIN", "origin"), Column("WANTED", "wanted"),
          Column("READY", "ready"), Column("STARTING", "starting"), Column("PARKED", "parked"),
          Column("UNPLACED", "unplaced"), Column("REASON", "reason"))
_REPLICA = (Column("ID", "id"), Column("MODEL", "model"), Column("NODE", "node"),
            Column("STATE", "state"), Column("URL", "url"), Column("RESTARTS", "restarts"),
            Column("ROUTED", "routed", "bool"), Column("REASON", "reason"))
_AUDIT = (Column("AT", "at", "time"), Column("ACTOR", "actor"), Column("ACTION", "action"),
          Column("TARGET", "target"))


def _tree(noun: str, one: str, base: str, param: str, columns: tuple[Column, ...],
          list_args: tuple[Arg, ...], create_args: tuple[Arg, ...],
          change_args: tuple[Arg, ...], move: Arg | None, ref: Kind) -> list[Command]:
    """list, create, get, rename, [move], set, delete of one kind of tenancy object; `ref` is
    how one is named: text (a user's name or ID) or org, team, project (an ID or a path)."""
    if ref == "text":
        target = Arg(param.upper(), "path", param, f"the {one}: its ID or name")
    else:
        target = Arg(FORM[ref], "path", param,
                     f"the {one}: its path, like {EXAMPLE[ref]}, or its ID", ref)
    path = f"{base}/{{{param}}}"
    cmds = [
        Command(noun, "list", "GET", base, f"list the {noun}", list_args, columns),
        Command(noun, "create", "POST", base, f"create a {one}", create_args, columns, "object"),
        Command(noun, "get", "GET", path, f"show one {one}", (target,), columns, "object"),
        Command(noun, "rename", "PATCH", path, f"rename a {one}",
                (target, Arg("NEW_NAME", "body", "name", "its new name")), columns, "object"),
    ]
    if move is not None:
        cmds.append(Command(noun, "move", "PATCH", path, f"move a {one} elsewhere", (target, move),
                            columns, "object"))
    if change_args:
        cmds.append(Command(noun, "set", "PATCH", path, f"change a {one}'s settings",
                            (target, *change_args), columns, "object"))
    cmds.append(Command(noun, "delete", "DELETE", path, f"delete a {one}", (target,), columns,
                        "done", f"deleted {one} {{{param}}}"))
    return cmds


COMMANDS: list[Command] = [
    *_tree("orgs", "organization", "/api/v1/orgs", "org", _ORG, (),
           (Arg("ORG", "body", "name", "the new organization's name, like acme", "new-org"),
            _ttl("organization"), *_limits("organization")),
           (_ttl("organization"), *_limits("organization")), None, "org"),
    *_tree("teams", "team", "/api/v1/teams", "team", _TEAM,
           (Arg("--in", "query", "org", "only this organization's teams (ORG or ID)", "org",
                replaces="--org"),),
           (Arg("ORG/TEAM", "body", "name", "the new team's path, like acme/ml", "new-team"),
            _ttl("team"), *_limits("team")),
           (_ttl("team"), *_limits("team")),
           Arg("ORG", "body", "org", "the organization to move it to (ORG or ID)", "org"), "team"),
    *_tree("projects", "project", "/api/v1/projects", "project", _PROJECT,
           (Arg("--in", "query", "team", "only this team's projects (ORG/TEAM or ID)", "team",
                replaces="--team"),),
           (Arg("ORG/TEAM/PROJECT", "body", "name", "the new project's path, like acme/ml/chat",
                "new-project"), _ttl("project"),
            Arg("--keep-bodies", "body", "keep_bodies", "keep request and response bodies", "bool"),
            *_limits("project")),
           (_ttl("project"),
            Arg("--keep-bodies", "body", "keep_bodies", "keep request and response bodies", "bool"),
            *_limits("project")),
           Arg("ORG/TEAM", "body", "team", "the team to move it to (ORG/TEAM or ID)", "team"),
           "project"),
    *_tree("users", "user", "/api/v1/users", "user", _USER, (),
           (Arg("NAME", "body", "name", "the user's name"), Arg("--email", "body", "email", "their email")),
           (Arg("--email", "body", "email", "their email"),), None, "text"),
    Command("members", "list", "GET", "/api/v1/members", "list memberships",
            (Arg("--in", "query", "scope", "only those at this scope: ORG, ORG/TEAM or "
                 "ORG/TEAM/PROJECT (or an ID)", "scope", replaces="--scope"),),
            _MEMBER),
    Command("members", "add", "POST", "/api/v1/members", "give a user a role in a scope",
            (Arg("USER", "body", "user", "the user: ID or name"),
             Arg("SCOPE", "body", "scope", "where: ORG, ORG/TEAM or ORG/TEAM/PROJECT (or an ID)",
                 "scope"),
             Arg("--role", "body", "role", "the role (default member)",
                 choices=("owner", "admin", "member", "viewer"), default="member")),
            _MEMBER, "object"),
    Command("members", "remove", "DELETE", "/api/v1/members/{user}",
            "take a user out of a scope (revokes their keys there)",
            (Arg("USER", "path", "user", "the user: ID or name"),
             Arg("SCOPE", "query", "scope",
                 "ORG, ORG/TEAM or ORG/TEAM/PROJECT (or an ID), as for add", "scope")),
            _MEMBER, "done", "removed {user} from {scope}"),
    Command("keys", "issue", "POST", "/api/v1/keys", "issue an API key (shown once)",
            (Arg("ORG/TEAM/PROJECT", "body", "project", "the project (ORG/TEAM/PROJECT or ID)",
                 "project"),
             Arg("NAME", "body", "name", "a name to recognise the key by"),
             Arg("--user", "body", "user", "the user it is for (a member covering the project)"),
             Arg("--ttl", "body", "ttl", "its lifetime, like 30d (default: the smallest maximum)"),
             *_limits("key")),
            _KEY, "key"),
    Command("keys", "list", "GET", "/api/v1/keys", "list API keys",
            (Arg("--in", "query", "project", "only this project's keys (ORG/TEAM/PROJECT or ID)",
                 "project", replaces="--project"),
             Arg("--user", "query", "user", "only this user's keys"),
             Arg("--revoked", "query", "revoked", "list revoked keys too", "flag")),
            _KEY),
    Command("keys", "get", "GET", "/api/v1/keys/{id}", "show one API key",
            (Arg("ID", "path", "id", "the key's ID (key_...)"),), _KEY, "object"),
    Command("keys", "revoke", "POST", "/api/v1/keys/{id}/revoke", "revoke an API key",
            (Arg("ID", "path", "id", "the key's ID (key_...)"),), _KEY, "object"),
    Command("keys", "set", "PATCH", "/api/v1/keys/{id}", "rename a key or change its limits",
            (Arg("ID", "path", "id", "the key's ID (key_...)"),
             Arg("--name", "body", "name", "its new name"), *_limits("key")),
            _KEY, "object"),
    Command("usage", "", "GET", "/api/v1/usage", "what each org, team or project used",
            (Arg("--by", "query", "by", "group by (default team)", choices=("org", "team", "project")),
             Arg("--since", "query", "since", "how far back, like 24h or 7d, or from a date (default 24h)")),
            _USAGE),
    Command("usage", "export", "GET", "/api/v1/usage/export",
            "usage totals by period as CSV (JSON with --json)",
            (Arg("--from", "query", "from", "a date (2026-11-01) or RFC 3339 time"),
             Arg("--to", "query", "to", "a date or RFC 3339 time (default now)"),
             Arg("--period", "query", "period", "hour, day or month", choices=("hour", "day", "month")),
             Arg("--by", "query", "by", "dimensions, comma-separated: org,team,project,user,key,model")),
            (), "csv"),
    Command("audit", "", "GET", "/api/v1/audit", "changes made through the admin API, newest first",
            (Arg("--since", "query", "since", "how far back, like 90m or 7d, or from a date (default 7d)"),
             Arg("--limit", "query", "limit", "the most events to show", "int"),
             Arg("--actor", "query", "actor", "only changes by this actor"),
             Arg("--contains", "query", "contains", "only events whose action or target contains this")),
            _AUDIT),
    Command("requests", "get", "GET", "/api/v1/requests/{id}", "what one request went through",
            (Arg("ID", "path", "id", "the request's ID (the x-request-id of its answer)"),), (), "object"),
    Command("requests", "body", "GET", "/api/v1/requests/{id}/body", "a kept request and its answer",
            (Arg("ID", "path", "id", "the request's ID"),), (), "json"),
    Command("requests", "replay", "POST", "/api/v1/requests/{id}/replay",
            "send a kept request again, to any model",
            (Arg("ID", "path", "id", "the request's ID"),
             Arg("--model", "body", "model", "the model to send it to", required=True)), (), "json"),
    Command("nodes", "list", "GET", "/api/v1/nodes", "list the nodes and their GPUs", (), _NODE),
    Command("nodes", "state", "POST", "/api/v1/nodes/{id}/state", "cordon, drain or ready a node",
            (Arg("ID", "path", "id", "the node's id"),
             Arg("STATE", "body", "state", "cordon, drain or ready")), _NODE, "object"),
    Command("nodes", "logs", "GET", "/api/v1/nodes/{id}/logs", "engine output lines from a node",
            (Arg("ID", "path", "id", "the node's id"),
             Arg("--lines", "query", "lines", "the last N lines of each engine (default 100)", "int"),
             Arg("--source", "query", "source", "only this replica's engine")), (), "json"),
    Command("nodes", "remove", "DELETE", "/api/v1/nodes/{id}", "forget a lost or empty node",
            (Arg("ID", "path", "id", "the node's id"),), _NODE, "done", "removed node {id}"),
    Command("nodes", "join-token", "POST", "/api/v1/join-tokens",
            "make a token a new node joins with (`llmgw agent --join-token`)",
            (Arg("--ttl", "body", "ttl", "how long it can be used, like 30m (default 1h, at most 7d)"),),
            (Column("ID", "id"), Column("EXPIRES", "expires_at", "time"),
             Column("CA SHA-256", "ca_sha256")), "token"),
    Command("models", "list", "GET", "/api/v1/models", "list the models and their replicas", (),
            _MODEL),
    Command("models", "add", "POST", "/api/v1/models", "add a model from a YAML or JSON file",
            (Arg("FILE", "body", "", "one model, as an entry of server.yaml's models:", "model"),),
            _MODEL, "object"),
    Command("models", "get", "GET", "/api/v1/models/{name}", "show one model and its replicas",
            (Arg("NAME", "path", "name", "the model's name or alias"),), (), "json"),
    Command("models", "remove", "DELETE", "/api/v1/models/{name}",
            "remove a model added with `models add` (its replicas stop)",
            (Arg("NAME", "path", "name", "the model's name"),), _MODEL, "done", "removed model {name}"),
    Command("models", "scale", "POST", "/api/v1/models/{name}/scale", "set a model's replicas",
            (Arg("NAME", "path", "name", "the model's name or alias"),
             Arg("REPLICAS", "body", "replicas", "how many", "int")), _MODEL, "object"),
    Command("replicas", "", "GET", "/api/v1/replicas", "replicas and where they run",
            (Arg("--model", "query", "model", "only this model's replicas"),
             Arg("--all", "query", "all", "list stopped replicas too", "flag")), _REPLICA),
    Command("explain-placement", "", "GET", "/api/v1/explain-placement",
            "why a model's replicas go where they go, node by node",
            (Arg("--model", "query", "model", "the model", required=True),), (), "json"),
    Command("headroom", "", "GET", "/api/v1/models/{name}/headroom",
            "how many more replicas of a model fit, and where",
            (Arg("NAME", "path", "name", "the model's name or alias"),
             Arg("--limit", "query", "limit", "the most to count (default 100)", "int")), (), "json"),
    Command("restart", "", "POST", "/api/v1/restart", "restart replicas (parked ones in place)",
            (Arg("--replicas", "body", "replicas", "replica ids, comma-separated", "list"),
             Arg("--models", "body", "models", "every replica of these models, comma-separated",
                 "list")), (), "json"),
    Command("leader", "", "GET", "/api/v1/leader",
            "which control plane leads, since when, and this one's role",
            (), (Column("ROLE", "role"), Column("ID", "id"), Column("STORE", "store"),
                 Column("LEADER", "leader_id"), Column("LEADER ADMIN URL", "leader_admin_url"),
                 Column("LEADER AGENTS", "leader_agent_address"),
                 Column("SINCE", "leader_since", "time"), Column("LEASE TTL", "lease_ttl")),
            "object"),
    Command("api", "routes", "GET", "/api/v1/openapi.json", "every route of the admin API",
            (), (Column("METHOD", "method"), Column("PATH", "path"), Column("SUMMARY", "summary")),
            "routes"),
]
