"""TLS for the views: the scheduler's serving certificate and the CA the CLI trusts.

The views carry the caller's bearer token, so they are served over HTTPS only. The
certificate comes from files (``explain.tls.certFile`` and ``keyFile``: a cert-manager
Certificate's Secret mounted in the pod, read again when the files change), or, when none
is given, from a CA the scheduler makes at start: its key never leaves the process's
memory, and a new one is made at each start.

The CA is published on the leader's Lease (annotation :data:`CA_ANNOTATION`), next to the
address of its views. Each replica makes its own CA, and the Lease names the holder, its
address and its CA in one object, written in one update: a reader never pairs one
replica's address with another's CA, and needs no more access than the Lease it already
reads (a ConfigMap would be written apart from the Lease, and need a grant of its own for
the scheduler and for every viewer). :func:`client_context` is the only way the CLI
connects: it verifies the certificate and the host name against that CA, never skips it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_ANNOTATION",
    "SERVER_NAME_ANNOTATION",
    "CertificateError",
    "SelfSigned",
    "ServingTls",
    "client_context",
    "make_self_signed",
    "serving_names",
]

#: the Lease annotation holding the PEM of the CA that signed the leader's views certificate
CA_ANNOTATION = "batchsched.io/views-ca"
#: the Lease annotation naming the host the certificate is checked against, when it names
#: none of the pods' addresses (``explain.tls.serverName``)
SERVER_NAME_ANNOTATION = "batchsched.io/views-server-name"
#: how long a certificate the scheduler makes is valid (a new one at every start)
VALID_DAYS = 825


class CertificateError(RuntimeError):
    """The views' certificate cannot be made or read: the message says which file and why."""


@dataclass(slots=True, frozen=True)
class SelfSigned:
    """A CA and the serving certificate it signed, as PEM."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def serving_names(*, bind_host: str, advertise: str = "", extra: Iterable[str] = ()) -> list[str]:
    """The names a client may reach the views by, for the certificate's SANs: loopback
    (``kubectl port-forward``), this host's name, the pod's IP (env ``POD_IP``), the
    address bound when it is a specific one, and the advertised address's host."""
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), os.environ.get("POD_IP", "")]
    if bind_host.strip("[]") not in ("", "0.0.0.0", "::"):
        names.append(bind_host.strip("[]"))
    if advertise:
        names.append(urlsplit(advertise).hostname or "")
    names.extend(extra)
    return list(dict.fromkeys(n for n in names if n))


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_self_signed(names: list[str], *, now: dt.datetime | None = None, days: int = VALID_DAYS) -> SelfSigned:
    """A fresh CA (``batchsched views CA``) and a serving certificate for ``names`` it
    signed (EC P-256, SHA-256; server authentication only)."""
    if not names:
        raise CertificateError("the views' certificate needs at least one name")
    now = now or dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "batchsched views CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "batchsched views")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return SelfSigned(ca_pem=ca.public_bytes(serialization.Encoding.PEM),
                      cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class ServingTls:
    """The views' server-side TLS: the context the listener serves with, and the CA PEM to
    publish. From files (:meth:`from_files`, read again by :meth:`reload` when they
    change, as cert-manager renews the Secret) or made at start (:meth:`self_signed`)."""

    def __init__(self, context: ssl.SSLContext, ca_pem: str, *, files: tuple[Path, Path, Path | None] | None = None) -> None:
        self.context = context
        #: what the CLI is to trust, as written on the Lease
        self.ca_pem = ca_pem
        self._files = files
        self._stamp = self._stamps()

    @classmethod
    def self_signed(cls, names: list[str]) -> ServingTls:
        made = make_self_signed(names)
        context = _server_context()
        # ssl loads a key from a file only: written 0600 to a folder of our own, removed at once
        with tempfile.TemporaryDirectory(prefix="batchsched-views-") as folder:
            cert, key = Path(folder) / "tls.crt", Path(folder) / "tls.key"
            # the chain presented: the certificate and its CA (a client pinning the CA's key finds it)
            cert.write_bytes(made.cert_pem + made.ca_pem)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(made.key_pem)
            context.load_cert_chain(cert, key)
        return cls(context, made.ca_pem.decode())

    @classmethod
    def from_files(cls, cert_file: str, key_file: str, ca_file: str = "") -> ServingTls:
        files = (Path(cert_file), Path(key_file), Path(ca_file) if ca_file else None)
        context = _server_context()
        ca_pem = _load(context, *files)
        return cls(context, ca_pem, files=files)

    def _stamps(self) -> tuple[float, ...]:
        if self._files is None:
            return ()
        return tuple(p.stat().st_mtime if p.exists() else -1.0 for p in self._files if p is not None)

    def reload(self) -> bool:
        """Read the files again when one changed since they were read; True when the
        certificate was replaced (new connections get it). A broken update is refused with
        :class:`CertificateError` and the certificate in use kept."""
        if self._files is None:
            return False
        stamp = self._stamps()
        if stamp == self._stamp:
            return False
        context = _server_context()
        ca_pem = _load(context, *self._files)
        self._stamp = stamp
        self.context.load_cert_chain(self._files[0], self._files[1])
        self.ca_pem = ca_pem
        return True


def _load(context: ssl.SSLContext, cert: Path, key: Path, ca: Path | None) -> str:
    """Load ``cert`` and ``key`` into ``context``; the PEM to publish (``ca``'s, else the
    certificates of ``cert``)."""
    for path in (cert, key, ca):
        if path is not None and not path.is_file():
            raise CertificateError(f"explain.tls: {path} does not exist")
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise CertificateError(f"explain.tls: cannot load {cert} with {key}: {exc}") from None
    source = ca or cert
    try:
        text = source.read_text()
    except OSError as exc:
        raise CertificateError(f"explain.tls: cannot read {source}: {exc.strerror}") from None
    try:
        found = x509.load_pem_x509_certificates(text.encode())
    except ValueError:
        found = []
    if not found:
        raise CertificateError(f"explain.tls: {source} holds no PEM certificate")
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in found)


def client_context(ca_pem: str) -> ssl.SSLContext:
    """A client context that trusts ``ca_pem`` alone and checks the host name. A published
    certificate below a root (a cert-manager issuer's, or the serving certificate itself)
    anchors the chain too."""
    try:
        context = ssl.create_default_context(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as exc:
        raise CertificateError(f"the views' CA is not a PEM certificate: {exc}") from None
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context
