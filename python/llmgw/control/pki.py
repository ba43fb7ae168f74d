"""The cluster's certificates: the CA `llmgw server init` makes, the agent port's server
certificate, and the node certificates the CA signs when an agent joins.

Files in the control plane's data dir (keys 0600, written with O_EXCL like the secret):
- `ca.crt`, `ca.key`: the cluster CA (ECDSA P-256, self-signed, 10 years);
- `agent-server.crt`, `agent-server.key`: the agent port's certificate, signed by the CA,
  for the hosts given with `--san` and localhost/127.0.0.1/::1 (2 years). The `.crt`
  holds the CA after the leaf, so that a joining agent, which has only the CA's SHA-256
  from its token, finds the CA in the handshake and checks it against the token before
  trusting it (kubeadm's discovery hash, without an unauthenticated discovery call).

Node certificates: CN = the node id, serial random, 1 year, client-auth only. Which
serials were issued and which are revoked (the node was removed) is kept in the store
(`llmgw.store.joins`), since every control plane on one PostgreSQL must agree on it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "agent-server.crt"
SERVER_KEY = "agent-server.key"
FILES = (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY)

CA_DAYS = 3650
SERVER_DAYS = 730
NODE_DAYS = 365
ALWAYS_SANS = ("localhost", "127.0.0.1", "::1")


class PkiError(Exception):
    """A certificate cannot be made or used; the message says what to do."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def fingerprint(cert_pem: bytes) -> str:
    """The SHA-256 of a certificate's DER, in hex: what a join token pins the CA by."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def _sign(subject_cn: str, public_key: ec.EllipticCurvePublicKey, ca_cert: x509.Certificate,
          ca_key: ec.EllipticCurvePrivateKey, days: int, usage: x509.ObjectIdentifier,
          sans: list[x509.GeneralName] | None = None) -> x509.Certificate:
    now = _now()
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
         .issuer_name(ca_cert.subject).public_key(public_key)
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5))  # clocks of nodes drift a little
         .not_valid_after(now + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                      content_commitment=False, data_encipherment=False,
                                      key_agreement=False, key_cert_sign=False, crl_sign=False,
                                      encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                        critical=False))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(ca_key, hashes.SHA256())


def _write(path: Path, data: bytes, mode: int, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(path, flags, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # O_TRUNC keeps an old file's mode


def existing(data_dir: Path) -> list[str]:
    """The certificate files of `FILES` already in the data dir."""
    return [n for n in FILES if (data_dir / n).exists()]


def _new_ca() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmgw cluster CA")])
    now = _now()
    ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=CA_DAYS))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=True,
                                            crl_sign=True, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                              critical=False)
               .sign(ca_key, hashes.SHA256()))
    return ca_cert, ca_key


def _load_ca(data_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((data_dir / CA_CERT).read_bytes())
    key = serialization.load_pem_private_key((data_dir / CA_KEY).read_bytes(), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{data_dir / CA_KEY} is not an EC private key made by `llmgw server init`")
    return cert, key


def init(data_dir: Path, sans: list[str], force: bool = False) -> tuple[str, bool]:
    """Creates the CA and the agent port's certificate in `data_dir`; returns the CA's
    fingerprint and whether an existing CA was used.

    A data dir holding only `ca.crt` and `ca.key` (copied from the first control plane,
    for a second one on the same PostgreSQL) gets just its own server certificate from
    that CA, so agents that joined through either trust both. Anything else already
    there is refused (PkiError), unless `force`, which makes a new CA.
    """
    found = existing(data_dir)
    reuse = not force and set(found) == {CA_CERT, CA_KEY}
    if found and not force and not reuse:
        raise PkiError(f"{data_dir} already holds {', '.join(found)}; the cluster CA exists. "
                       "Keep it (agents that joined trust it), or pass --force to make a new CA, "
                       "after which every node must join again")
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_cert, ca_key = _load_ca(data_dir) if reuse else _new_ca()
    server_key = ec.generate_private_key(ec.SECP256R1())
    hosts = list(dict.fromkeys([*sans, *ALWAYS_SANS]))
    server = _sign("llmgw control plane", server_key.public_key(), ca_cert, ca_key, SERVER_DAYS,
                   ExtendedKeyUsageOID.SERVER_AUTH, [_san(h) for h in hosts])
    if not reuse:
        _write(data_dir / CA_KEY, _key_pem(ca_key), 0o600, force)
        _write(data_dir / CA_CERT, pem(ca_cert), 0o644, force)
    _write(data_dir / SERVER_KEY, _key_pem(server_key), 0o600, force)
    _write(data_dir / SERVER_CERT, pem(server) + pem(ca_cert), 0o644, force)
    return fingerprint(pem(ca_cert)), reuse


class Authority:
    """The CA as the control plane uses it: the agent port's credentials and node signing."""

    def __init__(self, data_dir: Path) -> None:
        missing = [n for n in FILES if not (data_dir / n).exists()]
        if missing:
            raise PkiError(f"{data_dir} has no {', '.join(missing)}: the agent port serves "
                           f"mutual TLS and needs the cluster CA; run `llmgw server init "
                           f"--data-dir {data_dir} --san HOST` (HOST: the name or IP agents "
                           "dial), or set control_plane.agent_insecure: true for agents on "
                           "this machine only")
        self.ca_pem = (data_dir / CA_CERT).read_bytes()
        self.ca_cert, self.ca_key = _load_ca(data_dir)
        self.server_cert_pem = (data_dir / SERVER_CERT).read_bytes()
        self.server_key_pem = (data_dir / SERVER_KEY).read_bytes()
        self.fingerprint = fingerprint(self.ca_pem)

    def sign_node(self, node_id: str, csr_pem: bytes) -> x509.Certificate:
        """A client certificate with CN = `node_id` for the key of `csr_pem` (whose own
        subject is ignored: the node id is what the join request named)."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as e:
            raise PkiError(f"the certificate request is not a PEM CSR: {e}") from None
        if not csr.is_signature_valid:
            raise PkiError("the certificate request's signature does not match its key")
        key = csr.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise PkiError("the certificate request must be for an EC key (as `llmgw agent` makes)")
        return _sign(node_id, key, self.ca_cert, self.ca_key, NODE_DAYS,
                     ExtendedKeyUsageOID.CLIENT_AUTH)


def serial_hex(cert: x509.Certificate) -> str:
    """How a certificate's serial is stored and shown."""
    return f"{cert.serial_number:x}"


def peer_identity(cert_pem: bytes) -> tuple[str, str]:
    """(CN, serial hex) of a verified peer certificate (gRPC's `x509_pem_cert`)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = cns[0].value if cns else ""
    return (cn if isinstance(cn, str) else cn.decode()), serial_hex(cert)

