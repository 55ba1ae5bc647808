"""TLS and token material for the sandbox control plane, made fresh for each cluster.

Two certificate authorities (the cluster CA, which signs the apiserver's serving
certificate, and the front-proxy CA for request-header authentication), a service-account
signing key, and a static token file naming the users the sandbox's own components and
tests act as. Private keys and the token file are written 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Users of the static token file: name -> groups. ``admin`` may do anything; the
#: controller manager and kwok get what their roles need; ``nobody`` has no rights at all.
TOKEN_USERS: dict[str, tuple[str, ...]] = {
    "admin": ("system:masters",),
    "system:kube-controller-manager": (),
    "system:kube-scheduler": (),
    "kwok": ("system:masters",),
    "nobody": (),
}


@dataclass(slots=True, frozen=True)
class Pki:
    """Paths of the files :func:`make_pki` wrote, and the tokens by user."""

    dir: Path
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    front_proxy_ca: Path
    front_proxy_cert: Path
    front_proxy_key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    tokens: dict[str, str]


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
    client: bool = False,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name = issuer[0].subject if issuer else name
    signing_key = issuer[1] if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_pki(directory: Path) -> Pki:
    """Write a complete, fresh set of certificates, keys and tokens into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    p = directory

    ca_key = _key()
    ca = _cert("batchsched-sandbox-ca", ca_key, None, ca=True)
    serving_key = _key()
    sans: list[x509.GeneralName] = [
        x509.DNSName(n)
        for n in (
            "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    ]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "10.0.0.1")]
    serving = _cert("kube-apiserver", serving_key, (ca, ca_key), server=True, sans=sans)

    fp_ca_key = _key()
    fp_ca = _cert("batchsched-sandbox-front-proxy-ca", fp_ca_key, None, ca=True)
    fp_key = _key()
    fp = _cert("front-proxy-client", fp_key, (fp_ca, fp_ca_key), client=True)

    sa_key = _key()

    files = Pki(
        dir=p,
        ca_cert=p / "ca.crt",
        ca_key=p / "ca.key",
        serving_cert=p / "apiserver.crt",
        serving_key=p / "apiserver.key",
        front_proxy_ca=p / "front-proxy-ca.crt",
        front_proxy_cert=p / "front-proxy-client.crt",
        front_proxy_key=p / "front-proxy-client.key",
        sa_key=p / "sa.key",
        sa_pub=p / "sa.pub",
        token_file=p / "tokens.csv",
        tokens={user: secrets.token_hex(24) for user in TOKEN_USERS},
    )
    _write(files.ca_cert, _pem(ca))
    _write(files.ca_key, _key_pem(ca_key), private=True)
    _write(files.serving_cert, _pem(serving))
    _write(files.serving_key, _key_pem(serving_key), private=True)
    _write(files.front_proxy_ca, _pem(fp_ca))
    _write(files.front_proxy_cert, _pem(fp))
    _write(files.front_proxy_key, _key_pem(fp_key), private=True)
    _write(files.sa_key, _key_pem(sa_key), private=True)
    _write(
        files.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    lines = []
    for user, groups in TOKEN_USERS.items():
        group_field = f',"{",".join(groups)}"' if groups else ""
        lines.append(f"{files.tokens[user]},{user},uid-{user.replace(':', '-')}{group_field}")
    _write(files.token_file, ("\n".join(lines) + "\n").encode(), private=True)
    return files


def kubeconfig_yaml(server: str, ca_cert: Path, token: str, user: str) -> str:
    """A kubeconfig for one token user; the token sits in the file, so write it 0600."""
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: sandbox\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {ca_cert}\n"
        f"users:\n- name: {user}\n  user:\n    token: {token}\n"
        f"contexts:\n- name: sandbox\n  context:\n    cluster: sandbox\n    user: {user}\n"
        "current-context: sandbox\n"
    )


def write_kubeconfig(path: Path, server: str, ca_cert: Path, token: str, user: str) -> None:
    _write(path, kubeconfig_yaml(server, ca_cert, token, user).encode(), private=True)
