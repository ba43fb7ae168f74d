"""Joining a cluster: a join token buys the node a certificate from the cluster CA.

The token pins the CA by its SHA-256. The agent first reads the certificate chain
the join port presents (without trusting it), keeps the certificate whose SHA-256
is the token's, and only then opens a verified TLS channel to the join port with
that CA as the only root, and sends the token there: a control plane of another
cluster, or anyone in the middle, never sees the token. The node's key is made
here and never leaves the machine; the control plane signs a CSR for it.

The state dir keeps `node.key` (0600), `node.crt`, `ca.crt` and `joined-with` (the
id of the token used), so a restart with the same command line does not join
again, and a new token (a removed node brought back) does.
"""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw.config import url_host
from llmgw.secrets.keys import parse_join_token
from llmgw.v1 import agent_pb2 as pb
from llmgw.v1.agent_pb2_grpc import AgentServiceStub

NODE_CERT = "node.crt"
NODE_KEY = "node.key"
CA_CERT = "ca.crt"
JOINED_WITH = "joined-with"
TIMEOUT_S = 10.0


class JoinError(Exception):
    """The node could not join; the message is a sentence for the operator. `refused`: a
    control plane answered no (another one would too), rather than could not be reached."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def default_state_dir() -> Path:
    """`$XDG_STATE_HOME/llmgw/agent`, or `~/.local/state/llmgw/agent`."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmgw" / "agent"


def credentials(state_dir: Path) -> tuple[str, str, str] | None:
    """(cert, key, CA) files of a node that joined, or None when it has not."""
    files = [state_dir / n for n in (NODE_CERT, NODE_KEY, CA_CERT)]
    if not all(f.exists() for f in files):
        return None
    return str(files[0]), str(files[1]), str(files[2])


def needs_join(state_dir: Path, token: str) -> bool:
    """Whether `token` was not the one the stored certificate came from."""
    token_id = parse_join_token(token)[0]
    try:
        used = (state_dir / JOINED_WITH).read_text().strip()
    except OSError:
        used = ""
    return credentials(state_dir) is None or used != token_id


def split_target(target: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT or [V6]:PORT."""
    host, _, port = target.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise JoinError(f"{target!r} is not HOST:PORT") from None


def discover_ca(host: str, port: int, ca_sha256: str) -> bytes:
    """The CA certificate (PEM) in the chain the join port presents whose SHA-256 is the
    token's; JoinError when it cannot be reached or presents no such certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # nothing is trusted from this connection but the pin
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            # Public from Python 3.13 (DER bytes); before, only on the private SSLObject.
            chain = (tls.get_unverified_chain() if hasattr(tls, "get_unverified_chain")
                     else tls._sslobj.get_unverified_chain())  # type: ignore[attr-defined]
    except OSError as e:
        raise JoinError(f"cannot reach the join port {host}:{port}: {e}; is the control plane "
                        "running with mutual TLS, and is the port (agent_join_port, default "
                        "the agent port + 1) open to this node?") from e
    for c in chain or []:
        der = c if isinstance(c, bytes) else c.public_bytes(ssl._ssl.ENCODING_DER)  # type: ignore[attr-defined]
        if hashlib.sha256(der).hexdigest() == ca_sha256:
            return ssl.DER_cert_to_PEM_cert(der).encode()
    raise JoinError(f"the control plane at {host}:{port} does not present the CA the join token "
                    f"names (SHA-256 {ca_sha256[:16]}...); it is another cluster, or something "
                    "in between; check --control-plane, or make a token on the right cluster",
                    refused=True)


def join(target: str, join_port: int | None, token: str, node_id: str, state_dir: Path) -> None:
    """Joins through the control plane `target` (its agent port; the join port is
    `join_port` or that port + 1) and writes the node's files into `state_dir`."""
    try:
        token_id, _, ca_sha256 = parse_join_token(token)
    except ValueError as e:
        raise JoinError(str(e)) from None
    host, port = split_target(target)
    port = join_port or port + 1
    ca_pem = discover_ca(host, port, ca_sha256)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
           .sign(key, hashes.SHA256()))
    address = f"{url_host(host)}:{port}"
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca_pem)) as ch:
        try:
            answer: pb.JoinResponse = AgentServiceStub(ch).Join(pb.JoinRequest(
                token=token, node_id=node_id,
                csr_pem=csr.public_bytes(serialization.Encoding.PEM)), timeout=TIMEOUT_S)
        except grpc.RpcError as e:
            refused = e.code() != grpc.StatusCode.UNAVAILABLE
            raise JoinError(f"the control plane at {address} refused the join: "
                            f"{e.details()}", refused) from None
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(state_dir / NODE_KEY, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()), 0o600)
    _write(state_dir / NODE_CERT, answer.certificate_pem, 0o644)
    _write(state_dir / CA_CERT, answer.ca_pem, 0o644)
    _write(state_dir / JOINED_WITH, (token_id + "\n").encode(), 0o644)


def _write(path: Path, data: bytes, mode: int) -> None:
    # Into a temporary file, then renamed: a crash mid-join never leaves a key without
    # its certificate, or the certificate of a key that was not written.
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
