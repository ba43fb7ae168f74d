"""The peers: installed pinned into throwaway venvs outside the repository, started on demand.

Each peer gets its own venv under ~/.cache/llmgw-bench/peers/<name> (or
$LLMGW_BENCH_CACHE/peers): their dependency trees conflict with each other and
must never touch the project's venv. A venv whose installed version matches
the pin is reused; anything else is reinstalled.

Each is started with its documented defaults plus only what points it at the
upstream, and what lets three of them run side by side (a free port each, and
for the two Rust routers a free Prometheus port: both default to 29000).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import Server, free_port

# litellm[proxy]==1.110.2 asks for litellm-proxy==1.110.2 and
# litellm-enterprise==0.1.83.post1, which the package index does not serve (the
# proxy's code ships inside the litellm wheel itself). When the pinned extra
# fails, litellm==1.110.2 is installed with the extra's other requirements.
LITELLM_PROXY_DEPS = [
    "apscheduler>=3.11.2,<4.0",
    "azure-identity>=1.25.2,<2.0",
    "azure-storage-blob>=12.28.0,<13.0",
    "backoff>=2.2.1,<3.0",
    "backports-zstd>=1.0.0,<2.0",
    "boto3>=1.43.117,<2.0",
    "cryptography>=49.0.0,<51.0",
    "expression>=5.6.0,<6.0",
    "fastapi-sso>=0.19.0,<1.0",
    "fastapi>=0.136.3,<1.0",
    "granian>=2.7.4,<3.0",
    "gunicorn>=23.0.0,<24.0",
    "hiredis>=3.0.0,<4.0",
    "httpx2>=2.10.0,<3",
    "inquirerpy>=0.3.4,<1.0",
    "litellm-enterprise",
    "litellm-proxy-extras",
    "mcp>=2.3.0,<3",
    "orjson>=3.11.6,<4.0",
    "polars>=1.38.1,<2.0",
    "pydantic>=2.12.0,<3",
    "pyjwt>=2.13.0,<3.0",
    "pynacl>=1.6.2,<2.0",
    "pyroscope-io>=0.8.16,<1.0",
    "python-multipart>=0.0.27,<1.0",
    "pyyaml>=6.0.3,<7.0",
    "restrictedpython>=8.5,<9.0",
    "rich>=13.9.4,<14.0",
    "rq>=2.7.0,<3.0",
    "semver>=3.0.4,<4",
    "soundfile>=0.12.1,<1.0",
    "starlette>=1.0.1,<2.0",
    "tomlkit>=0.13.3,<1.0",
    "uvicorn>=0.33.0,<1.0",
    "uvloop>=0.22.1,<1.0",
    "websockets>=15.0.1,<16.0",
]


@dataclass
class Peer:
    """One peer: what to install, and how to check the install."""

    name: str
    dist: str
    version: str
    pip: list[str]
    fallback: list[str] = field(default_factory=list)


PEERS: dict[str, Peer] = {
    "vllm-router": Peer("vllm-router", "vllm-router", "0.1.17", ["vllm-router==0.1.17"]),
    "sglang-router": Peer("sglang-router", "sglang-router", "0.3.2", ["sglang-router==0.3.2"]),
    "litellm": Peer(
        "litellm",
        "litellm",
        "1.110.2",
        ["litellm[proxy]==1.110.2"],
        ["litellm==1.110.2", *LITELLM_PROXY_DEPS],
    ),
}


def cache_root() -> Path:
    """Where peer venvs live: outside the repository, reused between runs."""
    base = os.environ.get("LLMGW_BENCH_CACHE") or str(Path.home() / ".cache" / "llmgw-bench")
    return Path(base) / "peers"


def _installed_version(venv: Path, dist: str) -> str | None:
    py = venv / "bin" / "python"
    if not py.exists():
        return None
    r = subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def ensure(peer: Peer, log: list[str]) -> tuple[Path | None, str]:
    """The peer's venv, installing it if missing or at another version; (None, why) on failure."""
    venv = cache_root() / peer.name
    if _installed_version(venv, peer.dist) == peer.version:
        return venv, ""
    print(f"bench: installing {peer.name} {peer.version} into {venv} ...", file=sys.stderr)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    notes = ""
    for reqs in (peer.pip, peer.fallback):
        if not reqs:
            continue
        r = subprocess.run(
            check=False, args=[*pip, *reqs], capture_output=True, text=True, timeout=1200
        )
        if r.returncode == 0:
            break
        err = (r.stderr.strip().splitlines() or ["?"])[-1]
        log.append(f"{peer.name}: pip install {' '.join(reqs[:1])} failed: {err}")
        notes = (
            f"`pip install {peer.pip[0]}` failed ({err}); installed {peer.fallback[:1]} "
            "with the proxy extra's other requirements instead"
        )
    got = _installed_version(venv, peer.dist)
    if got != peer.version:
        return None, f"install failed: {log[-1] if log else f'found {got}'}"
    return venv, notes


def installed_note(peer: Peer) -> str:
    """What was installed in place of the pinned spec, if anything (read from the venv)."""
    venv = cache_root() / peer.name
    if peer.name != "litellm":
        return ""
    r = subprocess.run(
        [str(venv / "bin" / "pip"), "show", "litellm-proxy"],
        check=False,
        capture_output=True,
        text=True,
    )
    if r.returncode == 0:
        return ""
    return (
        "litellm[proxy]==1.110.2 needs litellm-proxy==1.110.2, which the index lacks; "
        "installed litellm==1.110.2 with the proxy extra's other requirements"
    )


def command(
    peer: Peer, venv: Path, upstream: str, model: str, port: int, workdir: Path
) -> tuple[list[str], dict[str, str]]:
    """The peer's command line and extra environment, pointed at `upstream` (http://host:port)."""
    bin_ = venv / "bin"
    if peer.name == "vllm-router":
        return [
            str(bin_ / "vllm-router"),
            "--worker-urls",
            upstream,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-port",
            str(free_port()),
        ], {}
    if peer.name == "sglang-router":
        return [
            str(bin_ / "python"),
            "-m",
            "sglang_router.launch_router",
            "--worker-urls",
            upstream,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-port",
            str(free_port()),
        ], {}
    if peer.name == "litellm":
        cfg = workdir / "litellm-config.yaml"
        cfg.write_text(
            "model_list:\n"
            f"  - model_name: {model}\n"
            "    litellm_params:\n"
            f"      model: openai/{model}\n"
            f"      api_base: {upstream}/v1\n"
            "      api_key: none\n"
        )
        # The cost map is fetched from GitHub at start unless told to use the bundled copy
        # (this machine has no network; it changes nothing on the request path). Since
        # 1.110 the proxy refuses to start without a master key; its docs say to set one.
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": LITELLM_KEY}
        args = [
            str(bin_ / "litellm"),
            "--config",
            str(cfg),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        return args, env
    raise ValueError(peer.name)


LITELLM_KEY = "sk-llmgw-bench-0123456789abcdef0123456789abcdef"
API_KEYS = {"litellm": LITELLM_KEY}  # the bearer token each peer wants; others take anything

HEALTH = {"vllm-router": "/health", "sglang-router": "/health", "litellm": "/health/liveliness"}


def start(peer: Peer, venv: Path, upstream: str, model: str, workdir: Path) -> Server:
    """Starts the peer and waits until it answers its health path (60 s at most)."""
    port = free_port()
    args, extra = command(peer, venv, upstream, model, port, workdir)
    env = {**os.environ, **extra}
    env.pop("VIRTUAL_ENV", None)
    srv = Server(peer.name, args, port, env=env, cwd=str(workdir))
    try:
        srv.wait_ready(90, HEALTH[peer.name])
    except RuntimeError:
        srv.stop()
        raise
    return srv
