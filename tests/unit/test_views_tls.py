"""The views over TLS, without a cluster: the certificate the scheduler makes (its CA, its
names), the CLI's side (the CA read from the Lease, the certificate verified with it, a
wrong CA refused), a plain-HTTP request to the views' port refused, and a certificate from
files read again when they change."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from batchsched.config import ConfigError, parse_config
from batchsched.kube.auth import RequestAuth
from batchsched.kube.client import Credentials
from batchsched.kube.endpoints import serve_views
from batchsched.kube.fake import FakeKube
from batchsched.kube.leader import ENDPOINT_ANNOTATION
from batchsched.kube.tls import (
    CA_ANNOTATION,
    SERVER_NAME_ANNOTATION,
    CertificateError,
    ServingTls,
    make_self_signed,
    serving_names,
)
from batchsched.kube.viewclient import ViewError, ViewsServer, find_server, read_view
from tests.unit.fake_http import serving

TOKEN = "Bearer secret-token"


class AllowingKube(FakeKube):
    """An apiserver that accepts every token and allows every path (the views' check)."""

    async def create(self, path: str, body: Any) -> Any:
        await self._call("POST", path, body)
        if path.endswith("tokenreviews"):
            return {"status": {"authenticated": True, "user": {"username": "alice"}}}
        return {"status": {"allowed": True}}


class OneQueue:
    """Views that answer with one queue."""

    async def queues(self) -> dict[str, Any]:
        return {"queues": [{"name": "team-a"}]}

    async def jobs(self, *, queue: str | None, namespace: str | None) -> dict[str, Any]:
        return {"jobs": []}

    async def nodes(self) -> dict[str, Any]:
        return {"nodes": []}

    async def explain(self, *, kind: str, name: str, namespace: str, api: str = "") -> dict[str, Any]:
        raise LookupError(f"no {kind} {name}")


@contextlib.asynccontextmanager
async def views_over_tls(tls: ServingTls) -> AsyncIterator[int]:
    runner, port = await serve_views("127.0.0.1:0", tls.context, auth=RequestAuth(AllowingKube()), views=OneQueue())
    assert port
    try:
        yield port
    finally:
        await runner.cleanup()


def test_the_certificate_made_at_start_is_signed_by_its_own_ca_for_the_names_given() -> None:
    made = make_self_signed(["localhost", "127.0.0.1", "::1", "10.1.2.3", "sched-0"])
    ca = x509.load_pem_x509_certificate(made.ca_pem)
    cert = x509.load_pem_x509_certificate(made.cert_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", "sched-0"}
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.1.2.3")}
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == \
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    # a new CA each time: a key never leaves the process that made it
    assert make_self_signed(["localhost"]).ca_pem != made.ca_pem


def test_the_names_cover_loopback_the_pod_ip_and_the_advertised_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", "10.244.1.7")
    names = serving_names(bind_host="0.0.0.0", advertise="https://sched.example:10352", extra=["views.ns.svc"])
    assert {"localhost", "127.0.0.1", "::1", "10.244.1.7", "sched.example", "views.ns.svc"} <= set(names)
    assert "0.0.0.0" not in names
    assert "192.0.2.5" in serving_names(bind_host="192.0.2.5")


def test_the_cli_reads_the_views_with_the_ca_of_the_lease_and_refuses_another() -> None:
    tls = ServingTls.self_signed(["localhost", "127.0.0.1"])
    stranger = ServingTls.self_signed(["localhost", "127.0.0.1"])

    async def main() -> tuple[Any, str, str]:
        async with views_over_tls(tls) as port:
            creds = Credentials(host="https://unused", token=TOKEN)
            right = ViewsServer(f"https://127.0.0.1:{port}", tls.ca_pem, "the Lease")
            body = await read_view(creds, right, "/debug/queues")
            wrong = ViewsServer(f"https://127.0.0.1:{port}", stranger.ca_pem, "Lease ns/sched")
            with pytest.raises(ViewError) as refused:
                await read_view(creds, wrong, "/debug/queues")
            # the certificate names 127.0.0.1, not another name asked for
            misnamed = ViewsServer(f"https://127.0.0.1:{port}", tls.ca_pem, "the Lease", server_name="elsewhere.example")
            with pytest.raises(ViewError) as other_name:
                await read_view(creds, misnamed, "/debug/queues")
            return body, str(refused.value), str(other_name.value)

    body, refused, other_name = asyncio.run(main())
    assert body == {"queues": [{"name": "team-a"}]}
    assert refused.startswith("batchsched at https://127.0.0.1:") and "a certificate that the CA of Lease ns/sched " \
        "does not verify" in refused, refused
    assert "elsewhere.example" in other_name, other_name


def test_a_plain_http_request_to_the_views_port_gets_no_answer() -> None:
    tls = ServingTls.self_signed(["127.0.0.1"])

    async def main() -> str:
        async with views_over_tls(tls) as port, aiohttp.ClientSession() as http:
            try:
                async with http.get(f"http://127.0.0.1:{port}/debug/queues", headers={"Authorization": TOKEN}) as r:
                    return f"answered {r.status}: {await r.text()}"
            except aiohttp.ClientError as exc:
                return f"refused: {type(exc).__name__}"

    outcome = asyncio.run(main())
    assert outcome.startswith("refused"), outcome


@contextlib.asynccontextmanager
async def apiserver(lease: dict[str, Any] | None) -> AsyncIterator[Credentials]:
    """An apiserver answering the Lease (or 404), over plain HTTP on loopback."""

    async def handler(request: web.Request) -> web.Response:
        if lease is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        return web.json_response(lease)

    async with serving(handler) as url:
        yield Credentials(host=url, token=TOKEN)


def lease(**annotations: str) -> dict[str, Any]:
    return {"kind": "Lease", "metadata": {"name": "sched", "namespace": "ns", "annotations": annotations}}


def test_the_address_ca_and_server_name_come_from_the_lease_and_the_flags_replace_them(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text("-----BEGIN CERTIFICATE-----\nfrom a file\n")

    async def main() -> list[Any]:
        out: list[Any] = []
        async with apiserver(lease(**{ENDPOINT_ANNOTATION: "https://10.0.0.5:10352/", CA_ANNOTATION: "PEM",
                                      SERVER_NAME_ANNOTATION: "views.ns.svc"})) as creds:
            out.append(await find_server(creds, namespace="ns", lease="sched"))
            out.append(await find_server(creds, namespace="ns", lease="sched", server="https://localhost:8443"))
        async with apiserver(None) as creds:  # with both flags the Lease is not read
            out.append(await find_server(creds, namespace="ns", lease="sched", server="https://localhost:8443",
                                         ca_file=str(ca_file), server_name="n"))
        return out

    from_lease, forwarded, flags = asyncio.run(main())
    assert from_lease == ViewsServer("https://10.0.0.5:10352", "PEM", f"Lease ns/sched, annotation {CA_ANNOTATION}",
                                     "views.ns.svc")
    assert (forwarded.address, forwarded.ca_pem, forwarded.server_name) == ("https://localhost:8443", "PEM",
                                                                          "views.ns.svc")
    assert (flags.address, flags.ca_pem, flags.server_name) == ("https://localhost:8443", ca_file.read_text(), "n")


@pytest.mark.parametrize(("annotations", "server", "said"), [
    ({ENDPOINT_ANNOTATION: "http://10.0.0.5:10351"}, None,
     "the views are served over HTTPS only, and http://10.0.0.5:10351 is not an https:// address (written on "
     "Lease ns/sched by a batchsched older than this command)"),
    ({ENDPOINT_ANNOTATION: "https://10.0.0.5:10352"}, None,
     f"Lease ns/sched carries no CA for the views' certificate (annotation {CA_ANNOTATION}); give --ca-file"),
    ({CA_ANNOTATION: "PEM"}, "http://localhost:10352",
     "the views are served over HTTPS only, and http://localhost:10352 is not an https:// address"),
])
def test_a_lease_without_https_or_a_ca_is_refused_with_what_to_give(
    annotations: dict[str, str], server: str | None, said: str,
) -> None:
    async def main() -> str:
        async with apiserver(lease(**annotations)) as creds:
            with pytest.raises(ViewError) as err:
                await find_server(creds, namespace="ns", lease="sched", server=server)
        return str(err.value)

    assert asyncio.run(main()) == said


def test_a_ca_that_is_no_certificate_is_said_with_where_it_was_read() -> None:
    with pytest.raises(ViewError) as err:
        ViewsServer("https://x:1", "not a PEM", "Lease ns/sched, annotation x").ssl_context()
    assert "(read from Lease ns/sched, annotation x)" in str(err.value)


def _write(folder: Path, names: list[str]) -> tuple[Path, Path, Path, bytes]:
    made = make_self_signed(names)
    cert, key, ca = folder / "tls.crt", folder / "tls.key", folder / "ca.crt"
    cert.write_bytes(made.cert_pem)
    key.write_bytes(made.key_pem)
    ca.write_bytes(made.ca_pem)
    return cert, key, ca, made.ca_pem


def test_a_certificate_from_files_is_served_and_read_again_when_renewed(tmp_path: Path) -> None:
    cert, key, ca, first_ca = _write(tmp_path, ["localhost", "127.0.0.1"])
    tls = ServingTls.from_files(str(cert), str(key), str(ca))
    assert tls.ca_pem == first_ca.decode()
    assert tls.reload() is False  # unchanged files are not read again

    async def read(port: int, ca_pem: str) -> Any:
        creds = Credentials(host="https://unused", token=TOKEN)
        return await read_view(creds, ViewsServer(f"https://127.0.0.1:{port}", ca_pem, "test"), "/debug/queues")

    async def main() -> None:
        async with views_over_tls(tls) as port:
            assert await read(port, tls.ca_pem)
            # renewed by a new CA (as cert-manager rotates it): new connections get the new one
            _, _, _, second_ca = _write(tmp_path, ["localhost", "127.0.0.1"])
            assert tls.reload() is True
            assert tls.ca_pem == second_ca.decode()
            assert await read(port, tls.ca_pem)
            with pytest.raises(ViewError):
                await read(port, first_ca.decode())

    asyncio.run(main())


def test_a_certificate_file_that_cannot_be_used_is_said_by_name(tmp_path: Path) -> None:
    cert, key, _, _ = _write(tmp_path, ["localhost"])
    with pytest.raises(CertificateError) as err:
        ServingTls.from_files(str(cert), str(tmp_path / "missing.key"))
    assert str(err.value) == f"explain.tls: {tmp_path / 'missing.key'} does not exist"
    other = tmp_path / "other"
    other.mkdir()
    _, other_key, _, _ = _write(other, ["localhost"])
    with pytest.raises(CertificateError) as err:
        ServingTls.from_files(str(cert), str(other_key))
    assert str(err.value).startswith(f"explain.tls: cannot load {cert} with {other_key}:")
    # without caFile the certificate itself is published
    assert ServingTls.from_files(str(cert), str(key)).ca_pem == cert.read_text()


@pytest.mark.parametrize(("explain", "said"), [
    ({"tls": {"certFile": "/tls/tls.crt"}}, "config: explain.tls: give both certFile and keyFile, or neither"),
    ({"tls": {"caFile": "/tls/ca.crt"}}, "config: explain.tls.caFile: only with certFile and keyFile"),
    ({"advertiseAddress": "http://sched:10352"}, "config: explain.advertiseAddress: expected https://host:port"),
    ({"address": "10352"}, "config: explain.address: expected host:port, got '10352'"),
    ({"address": "0.0.0.0:10351"}, "config: explain.address: must differ from metricsAddress"),
])
def test_a_views_setting_that_cannot_work_is_refused(explain: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"metricsAddress": "0.0.0.0:10351", "explain": explain})
    assert str(err.value).startswith(said), str(err.value)
