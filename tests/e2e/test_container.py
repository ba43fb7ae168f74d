"""The container's security defaults (docs/reliability.md): it runs as a non-root user, and
`llmgw up --host 0.0.0.0` (its command) opens the gateway to the network but keeps the
admin API and the agent port on loopback.

The image is not built here; the Dockerfile is read as the build would read it, and the
command it runs is started as it would start in the container.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from tests.support.control_plane import up_ports
from tests.support.procs import start_process

ROOT = Path(__file__).resolve().parents[2]
UP_READY = "llmgw up: ready"


def _final_stage(dockerfile: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of the last stage, continuation lines joined."""
    text = dockerfile.replace("\\\n", " ")
    steps = [[*ln.split(None, 1), ""][:2] for ln in text.splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    last_from = max(i for i, (op, _) in enumerate(steps) if op.upper() == "FROM")
    return [(op.upper(), arg.strip()) for op, arg in steps[last_from:]]


def test_the_image_runs_as_a_non_root_user() -> None:
    stage = _final_stage((ROOT / "Dockerfile").read_text())
    users = [arg for op, arg in stage if op == "USER"]
    assert users, "the runtime stage sets no USER: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users
    # Everything after the last USER runs as that user: no RUN may need root there.
    after = stage[max(i for i, (op, _) in enumerate(stage) if op == "USER"):]
    assert not [arg for op, arg in after if op == "RUN"], after
    entry = [arg for op, arg in stage if op == "ENTRYPOINT"]
    cmd = [arg for op, arg in stage if op == "CMD"]
    assert entry == ['["llmgw"]'] and cmd == ['["up", "--host", "0.0.0.0"]'], (entry, cmd)


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if state == "0A" and int(p, 16) == port:  # 0A: LISTEN
                found.add(addr)
    return found


def test_up_as_the_container_runs_it_keeps_admin_and_agent_ports_on_loopback(tmp_path: Path) -> None:
    # Port 0 each: up and the control plane bind ports the kernel picks and name them.
    args = [sys.executable, "-m", "llmgw.cli.main", "up", "--host", "0.0.0.0", "--engine", "sim",
            "--port", "0", "--admin-port", "0", "--agent-port", "0",
            "--data-dir", str(tmp_path / "data")]
    with start_process(args, UP_READY, timeout=90) as up:
        gateway, (admin, agent) = up.port, up_ports(up.output)
        # 127.0.0.1, ::1, and ::ffff:127.0.0.1 (gRPC's dual-stack sockets)
        loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
        assert _listening(gateway) == {"00000000"}, f"the gateway is open to the network: {shlex.join(args)}"
        assert _listening(admin) and _listening(admin) <= loopback, _listening(admin)
        assert _listening(agent) and _listening(agent) <= loopback, _listening(agent)
        assert up.popen.poll() is None
