"""How each engine is launched and probed: argv, environment and readiness URL from a replica's profile.

One table (`ENGINES`) names every engine the agent can run; adding one is a row
and a builder. The engine key (derived from the cluster secret by the control
plane, see `engine_key`) reaches the engine through the environment where the
engine reads one (vLLM, the simulator: VLLM_API_KEY; llmgw's llama.cpp engine:
LLMGW_ENGINE_KEY), so it is not in the process list, and on the command line
where it does not (SGLang).
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable, Mapping

import msgspec

from llmgw.config import url_host
from llmgw.engines.llamacpp.config import KEY_ENV as LLAMACPP_KEY_ENV
from llmgw.secrets.keys import derive

ENGINE_KEY_LABEL = "llmgw engine key v1"
"""The derivation label of the engine key; never used for another purpose, so that a
leaked engine key says nothing about any other secret."""


def engine_key(cluster_secret: bytes) -> str:
    """The key every engine requires and every gateway sends: HMAC-SHA256 of the label, hex.

    The control plane calls this and sends the result in StartReplica; the agent
    never holds the cluster secret. Same construction as the other derived keys
    (one label per purpose), so a leaked engine key says nothing about the others.
    """
    return derive(cluster_secret, ENGINE_KEY_LABEL).hex()


class LaunchRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One replica to run: what StartReplica carries, with the port already chosen."""

    replica_id: str
    model: str
    engine: str
    port: int
    host: str = "0.0.0.0"
    """The address the engine binds; the supervisor sets its --engine-host when empty."""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = msgspec.field(default_factory=dict)
    gpu_uuids: tuple[str, ...] = ()
    simulated_gpus: bool = False
    engine_key: str = ""
    source: str = ""
    """Weights: a path or a repository id; empty means `model`."""
    kv_events_port: int = 0
    """Where the engine publishes KV-cache events (ZMQ PUB); 0: none. Set by the supervisor
    for the engines in `KV_EVENTS`."""
    kv_replay_port: int = 0
    """Where it answers replay requests for missed event batches (ZMQ ROUTER)."""

    def __repr__(self) -> str:  # the key must not reach a log through a repr
        return (f"LaunchRequest(replica_id={self.replica_id!r}, model={self.model!r}, "
                f"engine={self.engine!r}, port={self.port})")


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """How to start one engine process and how to tell that it is ready."""

    argv: list[str]
    env: dict[str, str]
    """Added to the agent's environment (the engine inherits the rest)."""
    probe_url: str
    probe_headers: dict[str, str] = msgspec.field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Launch(argv={self.argv[:3]!r}..., probe_url={self.probe_url!r})"


class UnknownEngineError(ValueError):
    """StartReplica named an engine this agent has no launcher for."""


def _probe_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return url_host(host)


def _base_env(req: LaunchRequest) -> dict[str, str]:
    env = dict(req.env)
    if req.simulated_gpus or not req.gpu_uuids:
        # Simulated GPUs have no device behind them: hide every real one so an engine
        # started for a simulated GPU can never grab a real GPU by accident.
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(req.gpu_uuids)  # CUDA accepts GPU-/MIG- uuids
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["LLMGW_REPLICA_ID"] = req.replica_id
    return env


def _given(req: LaunchRequest, flag: str) -> bool:
    """The profile's own arguments already set `flag` (theirs win over the agent's)."""
    return any(a.startswith(flag) for a in req.args)


def _tp(req: LaunchRequest, flag: str) -> list[str]:
    """Tensor parallelism over the replica's GPUs, unless the profile sets it itself."""
    n = len(req.gpu_uuids)
    return [flag, str(n)] if n > 1 and not _given(req, flag) else []


def _zmq(host: str, port: int) -> str:
    if host in ("0.0.0.0", "", "::"):
        return f"tcp://*:{port}"
    return f"tcp://{url_host(host)}:{port}"


def _vllm_kv_events(req: LaunchRequest) -> list[str]:
    """vLLM's KV-event publisher on the replica's two KV ports, unless the profile configures
    one itself."""
    if not req.kv_events_port or _given(req, "--kv-events-config"):
        return []
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": _zmq(req.host, req.kv_events_port),
              "replay_endpoint": _zmq(req.host, req.kv_replay_port), "topic": "kv-events"}
    return ["--kv-events-config", msgspec.json.encode(config).decode()]


def _vllm(req: LaunchRequest) -> Launch:
    env = _base_env(req)
    if req.engine_key:
        env["VLLM_API_KEY"] = req.engine_key  # vLLM reads it like --api-key
    argv = ["vllm", "serve", req.source or req.model, "--served-model-name", req.model,
            "--host", req.host, "--port", str(req.port), *_tp(req, "--tensor-parallel-size"),
            *_vllm_kv_events(req), *req.args]  # fmt: skip
    return Launch(argv=argv, env=env, probe_url=f"http://{_probe_host(req.host)}:{req.port}/health")


def _sglang(req: LaunchRequest) -> Launch:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", req.source or req.model,
            "--served-model-name", req.model, "--host", req.host, "--port", str(req.port),
            *_tp(req, "--tp-size"), *req.args]  # fmt: skip
    if req.engine_key:
        argv += ["--api-key", req.engine_key]
    return Launch(argv=argv, env=_base_env(req), probe_url=f"http://{_probe_host(req.host)}:{req.port}/health")


def _llamacpp(req: LaunchRequest) -> Launch:
    # llmgw's own adapter over llama-cpp-python (llmgw/engines/llamacpp/app.py says why not
    # llama_cpp.server): it answers /health, streams usage, and takes its key from the env.
    env = _base_env(req)
    if req.engine_key:
        env[LLAMACPP_KEY_ENV] = req.engine_key
    argv = [sys.executable, "-m", "llmgw.engines.llamacpp", "--model", req.source or req.model,
            "--served-model-name", req.model, "--host", req.host, "--port", str(req.port), *req.args]  # fmt: skip
    return Launch(argv=argv, env=env, probe_url=f"http://{_probe_host(req.host)}:{req.port}/health")


def _sim(req: LaunchRequest) -> Launch:
    env = _base_env(req)
    if req.engine_key:
        env["VLLM_API_KEY"] = req.engine_key
    argv = [sys.executable, "-m", "llmgw.engines.sim", "--host", req.host, "--port", str(req.port),
            "--model", req.model]  # fmt: skip
    if req.kv_events_port and not _given(req, "--kv-events-endpoint"):
        argv += ["--kv-events-endpoint", _zmq(req.host, req.kv_events_port),
                 "--kv-replay-endpoint", _zmq(req.host, req.kv_replay_port)]
    argv += req.args
    return Launch(argv=argv, env=env, probe_url=f"http://{_probe_host(req.host)}:{req.port}/health")


# name -> (launcher, the distribution whose version is the engine's version)
ENGINES: dict[str, tuple[Callable[[LaunchRequest], Launch], str]] = {
    "vllm": (_vllm, "vllm"),
    "sglang": (_sglang, "sglang"),
    "llamacpp": (_llamacpp, "llama-cpp-python"),
    "sim": (_sim, "llmgw"),
}


KV_EVENTS = frozenset({"vllm", "sim"})
"""Engines that publish KV-cache events in vLLM's wire format when given two ports."""


def build_launch(req: LaunchRequest) -> Launch:
    """The argv, environment and readiness probe of `req`'s engine."""
    try:
        builder, _ = ENGINES[req.engine]
    except KeyError:
        known = ", ".join(sorted(ENGINES))
        raise UnknownEngineError(f"engine {req.engine!r} is not one this agent runs ({known})") from None
    return builder(req)


def available_engines() -> list[tuple[str, str]]:
    """(name, version) of each engine installed here; the simulator is always there."""
    out = []
    for name, (_, dist) in ENGINES.items():
        try:
            out.append((name, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            if name == "sim":
                out.append((name, "dev"))
    return out
