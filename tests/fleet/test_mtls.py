"""Mutual TLS on the agent port, with real processes: `llmgw server init`, a join token from
the admin API, `llmgw agent --join-token`, and what the agent port refuses (a certificate
from another CA, a removed node's certificate, spent, expired and wrong tokens)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from llmgw.agent.join import JoinError, join
from llmgw.control import pki
from llmgw.v1 import agent_pb2 as pb
from llmgw.v1.agent_pb2_grpc import AgentServiceStub
from tests.support.control_plane import Server, start_server
from tests.support.fleet import AGENT_READY, FAST
from tests.support.procs import Proc, free_port, start_process, wait_for
from tests.support.sim import sim_env


def llmgw(*args: str) -> subprocess.CompletedProcess[str]:
    """`llmgw ARGS` to its end: (exit status, stdout, stderr)."""
    return subprocess.run([sys.executable, "-m", "llmgw", *args], capture_output=True, text=True,
                          timeout=30, env=sim_env(), check=False)


@dataclass
class Cluster:
    """A control plane serving mutual TLS on its agent port, and the agents started on it."""

    tmp: Path
    server: Server
    agent_port: int
    join_port: int
    agents: list[Proc]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    def token(self, ttl: str | None = None) -> tuple[int, Any]:
        """POST /api/v1/join-tokens: (status, body)."""
        body = json.dumps({"ttl": ttl} if ttl else {}).encode()
        status, _, doc = self.server.call("POST", "/api/v1/join-tokens", body=body,
                                          headers={"content-type": "application/json"})
        return status, doc

    def agent(self, node_id: str, token: str) -> Proc:
        """`llmgw agent --join-token` with a state dir of its own, registered as `node_id`."""
        low = free_port(6)
        proc = start_process(
            [sys.executable, "-m", "llmgw", "agent", "--control-plane", self.target,
             "--join-port", str(self.join_port), "--join-token", token,
             "--state-dir", str(self.tmp / node_id), "--node-id", node_id,
             "--fake-gpus", "1xH100-80GB", "--port-range", f"{low}-{low + 5}",
             "--engine-host", "127.0.0.1", "--heartbeat-interval", "0.25"], AGENT_READY,
            timeout=30, env=sim_env())
        self.agents.append(proc)
        return proc

    def nodes(self) -> dict[str, Any]:
        status, _, body = self.server.call("GET", "/api/v1/nodes")
        assert status == 200, body
        return {n["id"]: n for n in body}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    data = tmp_path / "data"
    done = llmgw("server", "init", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    # Port 0: the server picks both its agent port and its join port, and names them.
    server = start_server(tmp_path, config={"control_plane": {"agent_port": 0, **FAST}},
                          env=sim_env())
    c = Cluster(tmp_path, server, server.agent_port, server.join_port, [])
    yield c
    for a in c.agents:
        a.terminate()
    server.proc.terminate()


def connect(target: str, root: bytes, cert: bytes | None, key: bytes | None,
            node_id: str) -> grpc.RpcError:
    """Opens a Connect stream with these credentials; the error that ends it."""
    creds = grpc.ssl_channel_credentials(root, key, cert)
    with grpc.secure_channel(target, creds) as ch:
        reg = pb.AgentMessage(register=pb.Register(node_id=node_id, hostname="h"))
        stream = AgentServiceStub(ch).Connect(iter([reg]), timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            for _ in stream:
                pass
    return err.value


def test_join_gets_a_certificate_and_registers_over_mutual_tls(cluster: Cluster) -> None:
    status, tok = cluster.token()
    assert status == 201, tok
    assert tok["ca_sha256"] == pki.fingerprint((cluster.server.data_dir / pki.CA_CERT).read_bytes())
    assert 3590 < tok["expires_at"] - time.time() <= 3600  # the default TTL: 1 h
    agent = cluster.agent("n1", tok["token"])
    assert "joined the cluster as node n1" in agent.output
    node = wait_for("n1 registered", lambda: cluster.nodes().get("n1"))
    assert node["connected"] is True
    state = cluster.tmp / "n1"
    assert stat.S_IMODE((state / "node.key").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((state / "node.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((state / "ca.crt").read_bytes())
    assert cert.subject.rfc4514_string() == "CN=n1"
    cert.verify_directly_issued_by(ca)
    assert (state / "ca.crt").read_bytes() == (cluster.server.data_dir / pki.CA_CERT).read_bytes()
    # A restart with the same command line does not spend the token again.
    agent.terminate()
    again = cluster.agent("n1", tok["token"])
    assert "joined the cluster" not in again.output


def test_spent_expired_and_wrong_tokens_are_refused(cluster: Cluster) -> None:
    def refusal(token: str, node: str) -> str:
        with pytest.raises(JoinError) as err:
            join(cluster.target, cluster.join_port, token, node, cluster.tmp / node)
        assert not (cluster.tmp / node / "node.crt").exists()
        return str(err.value)

    _, tok = cluster.token()
    join(cluster.target, cluster.join_port, tok["token"], "a1", cluster.tmp / "a1")
    msg = refusal(tok["token"], "a2")
    assert f"join token {tok['id']} was already used by node a1; a token joins one node" in msg

    _, short = cluster.token("1s")
    time.sleep(1.2)  # the token's own clock: nothing to poll
    assert f"the join token {short['id']} expired" in refusal(short["token"], "a3")

    _, good = cluster.token()
    prefix, tid, _secret, ca = good["token"].split(".")
    forged = f"{prefix}.{tid}.{'x' * 32}.{ca}"
    assert "the join token is not one this cluster issued" in refusal(forged, "a4")

    other, _ = pki.init(cluster.tmp / "other-ca", [])
    msg = refusal(f"{prefix}.{tid}.{_secret}.{other}", "a5")
    assert "does not present the CA the join token names" in msg
    # Neither refusal spent the good token.
    join(cluster.target, cluster.join_port, good["token"], "a6", cluster.tmp / "a6")

    done = llmgw("agent", "--control-plane", cluster.target, "--join-port", str(cluster.join_port),
                 "--join-token", tok["token"], "--state-dir", str(cluster.tmp / "a7"),
                 "--node-id", "a7", "--fake-gpus", "1xH100-80GB")
    assert done.returncode == 2
    assert "llmgw agent: cannot join: the control plane at" in done.stderr
    assert "was already used by node a1" in done.stderr


def test_a_certificate_from_another_ca_fails_the_handshake(cluster: Cluster) -> None:
    other_dir = cluster.tmp / "other-ca"
    pki.init(other_dir, [])
    key_pem, csr_pem = _key_and_csr()
    cert = pki.Authority(other_dir).sign_node("intruder", csr_pem)
    root = (cluster.server.data_dir / pki.CA_CERT).read_bytes()
    err = connect(cluster.target, root, pki.pem(cert), key_pem, "intruder")
    assert err.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake, before any RPC
    # Without a certificate the agent port refuses the handshake too; the join port lets
    # the connection in (it has to, for joins) and Connect there says why it is refused.
    assert connect(cluster.target, root, None, None, "x").code() == grpc.StatusCode.UNAVAILABLE
    err = connect(f"127.0.0.1:{cluster.join_port}", root, None, None, "x")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "no client certificate: this is the join port" in (err.details() or "")
    assert "intruder" not in cluster.nodes()


def test_an_expired_certificate_from_the_clusters_ca_fails_the_handshake(cluster: Cluster) -> None:
    import datetime as dt
    from unittest import mock

    key_pem, csr_pem = _key_and_csr()
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=pki.NODE_DAYS + 30)
    with mock.patch.object(pki, "_now", return_value=long_ago):  # signed a year and a month ago
        cert = pki.Authority(cluster.server.data_dir).sign_node("stale", csr_pem)
    assert cert.not_valid_after_utc < dt.datetime.now(dt.UTC)
    root = (cluster.server.data_dir / pki.CA_CERT).read_bytes()
    err = connect(cluster.target, root, pki.pem(cert), key_pem, "stale")
    assert err.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake, before any RPC
    assert "stale" not in cluster.nodes()


def test_a_removed_nodes_certificate_is_refused(cluster: Cluster) -> None:
    _, tok = cluster.token()
    agent = cluster.agent("n2", tok["token"])
    wait_for("n2 registered", lambda: cluster.nodes().get("n2"))
    status, _, body = cluster.server.call("DELETE", "/api/v1/nodes/n2")
    assert status == 200, body
    # The agent reconnects at once and is refused; it keeps trying, and stays refused.
    wait_for("the agent told why", lambda: "was removed" in agent.output)
    assert "PERMISSION_DENIED" in agent.output
    assert "n2" not in cluster.nodes()
    state = cluster.tmp / "n2"
    err = connect(cluster.target, (state / "ca.crt").read_bytes(),
                  (state / "node.crt").read_bytes(), (state / "node.key").read_bytes(), "n2")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    serial = f"{x509.load_pem_x509_certificate((state / 'node.crt').read_bytes()).serial_number:x}"
    assert err.details() == (
        f"node n2 was removed (`llmgw ctl nodes remove`) and its certificate {serial} is "
        "revoked; to bring it back, run its agent with a new --join-token from "
        "`llmgw ctl nodes join-token`")
    # A certificate may only register the node it names.
    _, tok2 = cluster.token()
    join(cluster.target, cluster.join_port, tok2["token"], "n3", cluster.tmp / "n3")
    s3 = cluster.tmp / "n3"
    err = connect(cluster.target, (s3 / "ca.crt").read_bytes(), (s3 / "node.crt").read_bytes(),
                  (s3 / "node.key").read_bytes(), "n1")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "the client certificate is node 'n3''s" in (err.details() or "")
    # A new token brings the removed node back (the agent joins again with it).
    agent.terminate()
    _, tok3 = cluster.token()
    back = cluster.agent("n2", tok3["token"])
    assert "joined the cluster as node n2" in back.output
    wait_for("n2 back", lambda: cluster.nodes().get("n2"))


def test_server_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = llmgw("server", "init", "--data-dir", str(data), "--san", "cp.example")
    assert first.returncode == 0, first.stderr
    ca = (data / pki.CA_CERT).read_bytes()
    for name in (pki.CA_KEY, pki.SERVER_KEY):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600
    server = x509.load_pem_x509_certificate((data / pki.SERVER_CERT).read_bytes())
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["cp.example", "localhost"]
    again = llmgw("server", "init", "--data-dir", str(data))
    assert (again.returncode, again.stdout) == (2, "")
    assert again.stderr == (
        f"error: {data} already holds ca.crt, ca.key, agent-server.crt, agent-server.key; the "
        "cluster CA exists. Keep it (agents that joined trust it), or pass --force to make a "
        "new CA, after which every node must join again\n")
    assert (data / pki.CA_CERT).read_bytes() == ca
    forced = llmgw("server", "init", "--data-dir", str(data), "--force")
    assert forced.returncode == 0, forced.stderr
    assert (data / pki.CA_CERT).read_bytes() != ca
    # A second control plane: only the CA copied over; init makes its own certificate.
    standby = tmp_path / "standby"
    standby.mkdir(mode=0o700)
    for name in (pki.CA_CERT, pki.CA_KEY):
        (standby / name).write_bytes((data / name).read_bytes())
    second = llmgw("server", "init", "--data-dir", str(standby), "--san", "standby.example")
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith(f"used the cluster CA already in {standby} and made")
    assert (standby / pki.CA_CERT).read_bytes() == (data / pki.CA_CERT).read_bytes()
    leaf = x509.load_pem_x509_certificate((standby / pki.SERVER_CERT).read_bytes())
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate((data / pki.CA_CERT).read_bytes()))


def _key_and_csr() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(
        key, hashes.SHA256())
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
            csr.public_bytes(serialization.Encoding.PEM))
