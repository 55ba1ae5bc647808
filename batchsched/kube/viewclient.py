"""The client side of the views: find the leading scheduler, read a view with the caller's
own credentials, and ``batchsched dashboard``'s local proxy for a browser.

The leader writes where it serves its views on the Lease it holds (annotation
``batchsched.io/endpoint``), and the CA that signed their certificate (annotation
``batchsched.io/views-ca``, :mod:`batchsched.kube.tls`); a kubeconfig is all the caller
needs. Every request verifies the views' certificate with that CA (or ``--ca-file``'s): the
caller's token is never sent to a server that did not prove it is the scheduler. Where the
address is not reachable from the caller (a laptop outside the pod network), ``--server``
names one that is (``kubectl port-forward``: ``https://localhost:<port>``).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from batchsched.kube.client import Credentials, KubeClient, load_credentials
from batchsched.kube.endpoints import bound_port
from batchsched.kube.errors import KubeError, NotFoundError
from batchsched.kube.leader import ENDPOINT_ANNOTATION
from batchsched.kube.tls import (
    CA_ANNOTATION,
    SERVER_NAME_ANNOTATION,
    CertificateError,
    client_context,
)

__all__ = ["ViewError", "ViewsServer", "default_kubeconfig", "find_server", "read_view", "serve_proxy"]


class ViewError(RuntimeError):
    """A view could not be read: the message says why, in one line."""


@dataclass(slots=True, frozen=True)
class ViewsServer:
    """Where the leader serves its views (``https://host:port``) and the CA (PEM) that
    its certificate is verified with; ``ca_from`` says where that CA was read, for errors;
    ``server_name``: the name the certificate must hold when not the address's host."""

    address: str
    ca_pem: str
    ca_from: str
    server_name: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        try:
            return client_context(self.ca_pem)
        except CertificateError as exc:
            raise ViewError(f"{exc} (read from {self.ca_from})") from None


def default_kubeconfig(given: str | None) -> str | None:
    """``--kubeconfig``, else ``$KUBECONFIG`` (its first file), else ``~/.kube/config`` when it
    exists, else None (the in-cluster service account)."""
    if given:
        return given
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return env.split(os.pathsep)[0]
    home = os.path.expanduser("~/.kube/config")
    return home if os.path.exists(home) else None


async def credentials(kubeconfig: str | None) -> Credentials:
    path = default_kubeconfig(kubeconfig)
    if path is not None and not os.path.isfile(os.path.expanduser(path)):
        raise ViewError(f"kubeconfig {path} does not exist")
    try:
        return await load_credentials(path)
    except Exception as exc:
        raise ViewError(f"cannot read the kubeconfig: {exc}") from None


async def find_server(creds: Credentials, *, namespace: str, lease: str, server: str | None = None,
                      ca_file: str | None = None, server_name: str | None = None) -> ViewsServer:
    """The leader's views address, CA and server name, from its Lease; ``server``,
    ``ca_file`` and ``server_name`` (``--server``, ``--ca-file``, ``--tls-server-name``)
    replace them. The Lease is not read when the address and the CA are given."""
    annotations: dict[str, Any] = {}
    if not (server and ca_file):
        annotations = await _lease_annotations(creds, namespace=namespace, lease=lease)
    where = f"Lease {namespace}/{lease}"
    address = (server or str(annotations.get(ENDPOINT_ANNOTATION) or "")).rstrip("/")
    if not address:
        raise ViewError(f"{where} does not say where the leader serves its views "
                        f"(annotation {ENDPOINT_ANNOTATION}); give --server")
    if not address.startswith("https://"):
        raise ViewError(f"the views are served over HTTPS only, and {address} is not an https:// address"
                        + ("" if server else f" (written on {where} by a batchsched older than this command)"))
    name = server_name or annotations.get(SERVER_NAME_ANNOTATION) or None
    if ca_file:
        try:
            return ViewsServer(address, Path(ca_file).read_text(), ca_file, name)
        except OSError as exc:
            raise ViewError(f"cannot read --ca-file {ca_file}: {exc.strerror}") from None
    ca = annotations.get(CA_ANNOTATION)
    if not ca:
        raise ViewError(f"{where} carries no CA for the views' certificate (annotation {CA_ANNOTATION}); "
                        "give --ca-file")
    return ViewsServer(address, str(ca), f"{where}, annotation {CA_ANNOTATION}", name)


async def _lease_annotations(creds: Credentials, *, namespace: str, lease: str) -> dict[str, Any]:
    client = KubeClient.from_credentials(creds)
    try:
        obj = await client.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}")
    except NotFoundError:
        raise ViewError(f"no Lease {namespace}/{lease}: is batchsched running there with leader election? "
                        "--lease-namespace and --lease-name look elsewhere (leaderElection.namespace and "
                        "leaseName of its configuration); --server names its views address") from None
    except KubeError as exc:
        raise ViewError(f"cannot read Lease {namespace}/{lease}: {exc}") from None
    finally:
        await client.close()
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _headers(creds: Credentials) -> dict[str, str]:
    if not creds.token:
        raise ViewError("the kubeconfig has no bearer token; the views need one "
                        "(a client certificate cannot be passed on): use `kubectl create token` or a token user")
    return {"Authorization": creds.token, "Accept": "application/json"}


def _unreachable(server: ViewsServer, exc: aiohttp.ClientError) -> ViewError:
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return ViewError(f"batchsched at {server.address} presented a certificate that the CA of "
                         f"{server.ca_from} does not verify: {exc.certificate_error}")
    return ViewError(f"cannot reach batchsched at {server.address}: {exc}")


async def read_view(creds: Credentials, server: ViewsServer, path: str, params: Mapping[str, str] | None = None) -> Any:
    """GET ``path`` of the views with the caller's token, over TLS verified with the
    server's CA; the JSON body, or :class:`ViewError`."""
    headers = _headers(creds)
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(ssl=server.ssl_context())
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http, http.get(
            server.address + path, params=dict(params or {}), headers=headers, server_hostname=server.server_name,
        ) as resp:
            raw = await resp.read()
    except aiohttp.ClientError as exc:
        raise _unreachable(server, exc) from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ViewError(f"batchsched at {server.address} answered {resp.status}: "
                        f"{raw[:200].decode(errors='replace')}") from None
    if resp.status != 200:
        raise ViewError(f"batchsched answered {resp.status}: {body.get('error') if isinstance(body, dict) else body}")
    return body


async def serve_proxy(creds: Credentials, server: ViewsServer, *, port: int,
                      host: str = "127.0.0.1") -> tuple[web.AppRunner, int]:
    """A local proxy to the scheduler's views and web view, adding the caller's token to each
    request (as ``kubectl proxy`` does): a browser on this machine needs no token. It serves
    plain HTTP on loopback only; the hop to the scheduler is TLS, verified with its CA."""
    headers = _headers(creds)
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                 connector=aiohttp.TCPConnector(ssl=server.ssl_context()))

    async def forward(request: web.Request) -> web.Response:
        path = request.path
        if not (path.startswith("/debug/") or path == "/ui" or path.startswith("/ui/")):
            raise web.HTTPFound("/ui/") if path == "/" else web.HTTPNotFound()
        try:
            async with http.get(server.address + path, params=request.query, headers=headers,
                                allow_redirects=False, server_hostname=server.server_name) as resp:
                body = await resp.read()
                kept = {k: v for k, v in resp.headers.items() if k.lower() in ("content-type", "cache-control", "location")}
                return web.Response(body=body, status=resp.status, headers=kept)
        except aiohttp.ClientError as exc:
            return web.json_response({"error": str(_unreachable(server, exc))}, status=502)

    async def close(_: web.Application) -> None:
        await http.close()

    app = web.Application()
    app.router.add_get("/{tail:.*}", forward)
    app.on_cleanup.append(close)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, bound_port(site) or port
