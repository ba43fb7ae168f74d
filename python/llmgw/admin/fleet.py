"""Admin routes of the fleet: nodes, models, replicas, placement questions and restarts.

Handlers read and change the fleet through `req.state.fleet`
(`llmgw.control.fleet.Fleet`); the answers are the views below, built from its
memory, which is what the reconciler acts on.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Struct

from llmgw.control.catalog import Model, Name
from llmgw.control.inventory import LIVE, Node, Replica
from llmgw.control.placement import NodeVerdict
from llmgw.store import audit

from .route import ApiError, Param, Request, Route
from .store_errors import flag, mapped

Origin = Literal["config", "api"]


class GpuView(Struct, kw_only=True):
    """One GPU of a node."""

    uuid: str
    index: int
    model: str
    gpu_class: str
    memory_total: int
    memory_free: int
    simulated: bool
    nvlink_peers: list[int]


class NodeView(Struct, kw_only=True):
    """One node: what its agent reported and the state the control plane gave it."""

    id: str
    hostname: str
    state: str
    admin_state: str
    reason: str
    connected: bool
    """Whether its agent holds a stream to this control plane now."""
    last_heartbeat: float
    registered_at: float
    address: str
    labels: dict[str, str]
    simulated: bool
    """Its GPUs were declared with --fake-gpus: no device behind them."""
    gpus: list[GpuView]
    gpu_summary: str
    gpu_note: str
    cpu_cores: float
    memory_bytes: int
    engines: list[str]
    agent_version: str
    replicas: int
    """Replicas on it that are not stopped."""


class ReplicaView(Struct, kw_only=True):
    """One replica: where it runs and how it is doing."""

    id: str
    model: str
    profile: str
    node: str
    gpus: list[str]
    state: str
    port: int | None
    url: str | None
    pid: int | None
    restarts: int
    reason: str
    routed: bool
    """Gateways route to it now."""
    created_at: float
    updated_at: float


class ModelView(Struct, kw_only=True):
    """One model of the catalog and how its replicas are doing."""

    name: str
    aliases: list[str]
    origin: Origin
    """config: declared in server.yaml; api: added through the admin API."""
    profiles: list[str]
    min_replicas: int
    max_replicas: int
    scale: int | None
    """What an operator set with `scale`; null: min_replicas."""
    wanted: int
    ready: int
    starting: int
    parked: int
    unplaced: int
    """Replicas the last pass could not place anywhere."""
    reason: str
    """What needs an operator's attention, a sentence; empty when nothing does."""


class ModelDetail(ModelView, kw_only=True):
    """One model with its definition and its replicas."""

    definition: Model
    replicas: list[ReplicaView]


class LogView(Struct, kw_only=True):
    """The last output lines of one replica's engine, oldest first."""

    replica: str
    lines: list[str]


class PlacementView(Struct, kw_only=True):
    """Where one more replica would go."""

    node: str
    profile: str
    gpus: list[str]


class HeadroomView(Struct, kw_only=True):
    """How many more replicas of a model fit now, and where."""

    model: str
    count: int
    by_node: dict[str, int]
    placements: list[PlacementView]


class ExplainView(Struct, kw_only=True):
    """Why a model's replicas go where they go, node by node."""

    model: str
    wanted: int
    placed: int
    """Replicas that hold GPUs (pending, starting, ready, parked)."""
    nodes: list[NodeVerdict]


class RestartItem(Struct, kw_only=True):
    """One replica restarted, and how."""

    replica: str
    how: str


class NodeState(Struct, forbid_unknown_fields=True, kw_only=True):
    """What to do with a node."""

    state: Literal["cordon", "drain", "ready"]
    """cordon: no new replicas; drain: move its replicas elsewhere; ready: take replicas."""


class Scale(Struct, forbid_unknown_fields=True, kw_only=True):
    """How many replicas a model should have."""

    replicas: Annotated[int, msgspec.Meta(ge=0, le=10_000)]


class Restart(Struct, forbid_unknown_fields=True, kw_only=True):
    """What to restart: replicas by id, every replica of some models, or both."""

    replicas: list[Annotated[str, msgspec.Meta(min_length=1, max_length=200)]] = msgspec.field(
        default_factory=list)
    models: list[Name] = msgspec.field(default_factory=list)


# -- building views ----------------------------------------------------------------------


def _fleet(req: Request) -> Any:
    fleet = getattr(req.state, "fleet", None)
    if fleet is None:
        raise ApiError(503, "fleet.not_ready", "the fleet has not started yet; try again shortly")
    return fleet


def _gpu_summary(n: Node) -> str:
    classes: dict[str, int] = {}
    for g in n.gpus:
        classes[g.gpu_class] = classes.get(g.gpu_class, 0) + 1
    text = ", ".join(f"{c} x {k}" for k, c in sorted(classes.items())) or "no GPU"
    return f"{text} (simulated)" if n.simulated else text


def node_view(fleet: Any, n: Node) -> NodeView:
    """The view of one node."""
    facts = fleet.facts.get(n.id)
    return NodeView(
        id=n.id, hostname=n.hostname, state=n.state, admin_state=n.admin_state,
        reason=fleet.node_reason.get(n.id, ""), connected=n.id in fleet.links,
        last_heartbeat=n.last_heartbeat, registered_at=fleet.registered_at.get(n.id, 0.0),
        address=facts.address if facts else "", labels=dict(n.labels), simulated=n.simulated,
        gpus=[GpuView(uuid=g.uuid, index=g.index, model=g.model, gpu_class=g.gpu_class,
                      memory_total=g.memory_total, memory_free=g.memory_free,
                      simulated=g.simulated, nvlink_peers=list(g.nvlink_peers)) for g in n.gpus],
        gpu_summary=_gpu_summary(n), gpu_note=facts.gpu_note if facts else "",
        cpu_cores=n.cpu_cores, memory_bytes=n.memory_bytes, engines=list(n.engines),
        agent_version=facts.agent_version if facts else "",
        replicas=sum(1 for r in fleet.replicas.values() if r.node == n.id and r.state != "stopped"))


def replica_view(fleet: Any, r: Replica) -> ReplicaView:
    """The view of one replica."""
    return ReplicaView(
        id=r.id, model=r.model, profile=r.profile, node=r.node, gpus=list(r.gpus), state=r.state,
        port=r.port, url=fleet.url(r), pid=fleet.pids.get(r.id), restarts=r.restarts,
        reason=r.reason, routed=r.id in fleet.published, created_at=r.created_at,
        updated_at=fleet.updated_at.get(r.id, r.created_at))


def model_view(fleet: Any, m: Model, cls: type[ModelView] = ModelView, **extra: Any) -> Any:
    """The view of one model (or its detail, with `extra`)."""
    mine = [r for r in fleet.replicas.values() if r.model == m.name]
    count = {s: sum(1 for r in mine if r.state == s) for s in ("ready", "pending", "starting",
                                                              "parked")}
    wanted = fleet.wanted_of(m)
    unplaced = fleet.unplaced.get(m.name, 0)
    reasons = [f"replica {r.id} is parked: {r.reason}" for r in mine if r.state == "parked"]
    if unplaced:
        reasons.append(f"{unplaced} replica(s) cannot be placed; `llmgw ctl explain-placement "
                       f"{m.name}` says why on each node")
    return cls(name=m.name, aliases=list(m.aliases),
               origin="config" if m.name in fleet.config_models else "api",
               profiles=[p.name for p in m.profiles], min_replicas=m.min_replicas,
               max_replicas=m.ceiling, scale=fleet.scale.get(m.name), wanted=wanted,
               ready=count["ready"], starting=count["pending"] + count["starting"],
               parked=count["parked"], unplaced=unplaced, reason=" ".join(reasons), **extra)


# -- handlers --------------------------------------------------------------------------


@mapped
async def list_nodes(req: Request) -> list[NodeView]:
    """GET /api/v1/nodes."""
    fleet = _fleet(req)
    return [node_view(fleet, n) for _, n in sorted(fleet.nodes.items())]


@mapped
async def set_node_state(req: Request) -> NodeView:
    """POST /api/v1/nodes/{id}/state."""
    fleet = _fleet(req)
    body: NodeState = req.body
    before = node_view(fleet, fleet.node(req.path_params["id"]))
    after = node_view(fleet, await fleet.set_admin_state(req.path_params["id"], body.state))
    await _audit(req, f"node.{body.state}", f"node:{after.id}", before, after)
    return after


@mapped
async def remove_node(req: Request) -> NodeView:
    """DELETE /api/v1/nodes/{id}."""
    fleet = _fleet(req)
    n = fleet.node(req.path_params["id"])
    view = node_view(fleet, n)
    await fleet.remove_node(n.id)
    await _audit(req, "node.remove", f"node:{n.id}", view, None)
    return view


@mapped
async def node_logs(req: Request) -> list[LogView]:
    """GET /api/v1/nodes/{id}/logs."""
    fleet = _fleet(req)
    lines = int(req.query.get("lines") or 100)
    if not 0 <= lines <= 100_000:
        raise ApiError(400, "nodes.bad_lines", f"lines must be 0 (all kept) to 100000, not "
                       f"{lines}", "lines")
    try:
        got = await fleet.logs(req.path_params["id"], req.query.get("source") or None, lines)
    except TimeoutError as e:
        raise ApiError(503, "nodes.logs_unavailable", f"{e}; try again once it is connected "
                       "(`llmgw ctl nodes list` shows CONNECTED)") from None
    return [LogView(replica=rid, lines=ls) for rid, ls in got.items()]


@mapped
async def list_models(req: Request) -> list[ModelView]:
    """GET /api/v1/models."""
    fleet = _fleet(req)
    return [model_view(fleet, m) for m in fleet.catalog]


@mapped
async def add_model(req: Request) -> ModelView:
    """POST /api/v1/models."""
    fleet = _fleet(req)
    m: Model = req.body
    await fleet.add_model(m, msgspec.to_builtins(m))
    view: ModelView = model_view(fleet, m)
    await _audit(req, "model.add", f"model:{m.name}", None, view)
    return view


@mapped
async def get_model(req: Request) -> ModelDetail:
    """GET /api/v1/models/{name}."""
    fleet = _fleet(req)
    m = fleet.model(req.path_params["name"])
    reps = sorted((r for r in fleet.replicas.values() if r.model == m.name),
                  key=lambda r: (r.created_at, r.id))
    return model_view(fleet, m, ModelDetail, definition=m,  # type: ignore[no-any-return]
                      replicas=[replica_view(fleet, r) for r in reps])


@mapped
async def remove_model(req: Request) -> ModelView:
    """DELETE /api/v1/models/{name}."""
    fleet = _fleet(req)
    m = fleet.model(req.path_params["name"])
    view: ModelView = model_view(fleet, m)
    await fleet.remove_model(m.name)
    await _audit(req, "model.remove", f"model:{m.name}", view, None)
    return view


@mapped
async def scale_model(req: Request) -> ModelView:
    """POST /api/v1/models/{name}/scale."""
    fleet = _fleet(req)
    body: Scale = req.body
    before: ModelView = model_view(fleet, fleet.model(req.path_params["name"]))
    m = await fleet.set_scale(req.path_params["name"], body.replicas)
    after: ModelView = model_view(fleet, m)
    await _audit(req, "model.scale", f"model:{m.name}", before, after)
    return after


@mapped
async def list_replicas(req: Request) -> list[ReplicaView]:
    """GET /api/v1/replicas."""
    fleet = _fleet(req)
    model = req.query.get("model") or None
    if model is not None:
        model = fleet.model(model).name
    every = flag(req, "all")
    reps = sorted(fleet.replicas.values(), key=lambda r: (r.model, r.created_at, r.id))
    return [replica_view(fleet, r) for r in reps
            if (model is None or r.model == model) and (every or r.state != "stopped")]


@mapped
async def explain_placement(req: Request) -> ExplainView:
    """GET /api/v1/explain-placement."""
    fleet = _fleet(req)
    m = fleet.model(req.query["model"])
    placed = sum(1 for r in fleet.replicas.values()
                 if r.model == m.name and r.state in LIVE)
    return ExplainView(model=m.name, wanted=fleet.wanted_of(m),
                       placed=placed, nodes=fleet.explain(m.name))


@mapped
async def headroom(req: Request) -> HeadroomView:
    """GET /api/v1/models/{name}/headroom."""
    fleet = _fleet(req)
    limit = int(req.query.get("limit") or 100)
    if not 1 <= limit <= 10_000:
        raise ApiError(400, "models.bad_limit", f"limit must be 1 to 10000, not {limit}", "limit")
    h = fleet.headroom(req.path_params["name"], limit)
    return HeadroomView(model=h.model, count=h.count, by_node=h.by_node,
                        placements=[PlacementView(node=p.node, profile=p.profile, gpus=list(p.gpus))
                                    for p in h.placements])


@mapped
async def restart(req: Request) -> list[RestartItem]:
    """POST /api/v1/restart."""
    fleet = _fleet(req)
    body: Restart = req.body
    if not body.replicas and not body.models:
        raise ApiError(400, "restart.nothing", "name what to restart: `replicas` (ids) or "
                       "`models` (names), or both")
    done = await fleet.restart(body.replicas, body.models)
    items = [RestartItem(replica=rid, how=how) for rid, how in done]
    await _audit(req, "replica.restart", ",".join(body.models + body.replicas)[:200], None,
                 {"models": body.models, "replicas": body.replicas, "restarted": items})
    return items


async def _audit(req: Request, action: str, target: str, before: Any, after: Any) -> None:
    """Records a fleet change made through the API, once it is made (the fleet commits its
    own writes, so the event follows in a statement of its own)."""
    await audit.record(req.db, req.actor, action, target, before, after)


_SIZES = ("Sizes (gpu_memory, memory) are bytes here; `llmgw ctl models add FILE` also takes "
          "them written 80GiB or 512MiB.")

ROUTES: list[Route] = [
    Route("GET", "/api/v1/nodes", "Nodes and their GPUs", list_nodes, response=list[NodeView],
          description="Every node an agent registered, with its state (ready, cordoned, "
          "draining, unreachable, lost), what an operator asked of it, and its GPUs; simulated "
          "GPUs are marked so."),
    Route("POST", "/api/v1/nodes/{id}/state", "Cordon, drain or ready a node", set_node_state,
          request=NodeState, response=NodeView,
          description="cordon: it keeps its replicas and takes no new ones; drain: its replicas "
          "are placed elsewhere first and stopped once the others are ready; ready: it takes "
          "replicas again."),
    Route("DELETE", "/api/v1/nodes/{id}", "Remove a node", remove_node, response=NodeView,
          description="Only a lost node or one without replicas; 409 nodes.not_empty otherwise. "
          "Its certificates are revoked: over mutual TLS its agent is refused until it joins "
          "again with a new token; in plaintext (agent_insecure) an agent still running "
          "registers it again."),
    Route("GET", "/api/v1/nodes/{id}/logs", "Engine logs from a node", node_logs,
          query=(Param("lines", "the last N lines of each engine (default 100; 0: all kept)",
                       "integer"),
                 Param("source", "one replica's id (default: every replica on the node)")),
          response=list[LogView],
          description="Asked of the node's agent, which keeps the last lines of each engine; "
          "503 when the agent is not connected or does not answer within 5 s."),
    Route("GET", "/api/v1/models", "Models of the catalog", list_models, response=list[ModelView],
          description="Models declared in server.yaml and added through this API, with their "
          "replicas' states and, in `reason`, what needs attention (a parked replica and why, "
          "replicas that cannot be placed)."),
    Route("POST", "/api/v1/models", "Add a model", add_model, request=Model, response=ModelView,
          status=201, description="Kept in the store; replicas are placed by the next pass. "
          + _SIZES),
    Route("GET", "/api/v1/models/{name}", "One model, its definition and replicas", get_model,
          response=ModelDetail),
    Route("DELETE", "/api/v1/models/{name}", "Remove a model", remove_model, response=ModelView,
          description="Only models added through this API (409 models.in_config for those of "
          "server.yaml); its replicas are drained and stopped."),
    Route("POST", "/api/v1/models/{name}/scale", "Set a model's replicas", scale_model,
          request=Scale, response=ModelView,
          description="Within its min_replicas..max_replicas (400 models.bad_scale otherwise)."),
    Route("GET", "/api/v1/replicas", "Replicas and where they run", list_replicas,
          query=(Param("model", "only this model's replicas"),
                 Param("all", "true to list stopped replicas too", "boolean")),
          response=list[ReplicaView]),
    Route("GET", "/api/v1/explain-placement", "Why a model is placed where it is, or not at all",
          explain_placement, query=(Param("model", "the model", required=True),),
          response=ExplainView,
          description="For every node: whether it could take one more replica of the model "
          "now, and if not, why (its state, GPU class, memory, labels, engines)."),
    Route("GET", "/api/v1/models/{name}/headroom", "How many more replicas fit", headroom,
          query=(Param("limit", "the most to count (default 100)", "integer"),),
          response=HeadroomView),
    Route("POST", "/api/v1/restart", "Restart replicas", restart, request=Restart,
          response=list[RestartItem],
          description="A parked replica starts again in place with its failures forgotten; "
          "any other is drained while the next pass places a fresh one."),
]
