"""The client side of the views: find the leading scheduler, read a view with the caller's
own credentials, and ``batchsched dashboard``'s local proxy for a browser.

The leader writes where it serves its views on the Lease it holds (annotation
``batchsched.io/endpoint``); a kubeconfig is all the caller needs. Where that address is
not reachable from the caller (a laptop outside the pod network), ``--server`` names one
that is (``kubectl port-forward``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from batchsched.kube.client import Credentials, KubeClient, load_credentials
from batchsched.kube.endpoints import bound_port
from batchsched.kube.errors import KubeError, NotFoundError
from batchsched.kube.leader import ENDPOINT_ANNOTATION

__all__ = ["ViewError", "default_kubeconfig", "find_server", "read_view", "serve_proxy"]


class ViewError(RuntimeError):
    """A view could not be read: the message says why, in one line."""


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


async def find_server(creds: Credentials, *, namespace: str, lease: str) -> str:
    """The leader's views address, from its Lease."""
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
    server = ((obj.get("metadata") or {}).get("annotations") or {}).get(ENDPOINT_ANNOTATION)
    if not server:
        raise ViewError(f"Lease {namespace}/{lease} does not say where the leader serves its views "
                        f"(annotation {ENDPOINT_ANNOTATION}); give --server")
    return str(server).rstrip("/")


def _headers(creds: Credentials) -> dict[str, str]:
    if not creds.token:
        raise ViewError("the kubeconfig has no bearer token; the views need one "
                        "(a client certificate cannot be passed on): use `kubectl create token` or a token user")
    return {"Authorization": creds.token, "Accept": "application/json"}


async def read_view(creds: Credentials, server: str, path: str, params: Mapping[str, str] | None = None) -> Any:
    """GET ``server + path`` with the caller's token; the JSON body, or :class:`ViewError`."""
    headers = _headers(creds)
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(
            server + path, params=dict(params or {}), headers=headers,
        ) as resp:
            raw = await resp.read()
    except aiohttp.ClientError as exc:
        raise ViewError(f"cannot reach batchsched at {server}: {exc}") from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ViewError(f"batchsched at {server} answered {resp.status}: {raw[:200].decode(errors='replace')}") from None
    if resp.status != 200:
        raise ViewError(f"batchsched answered {resp.status}: {body.get('error') if isinstance(body, dict) else body}")
    return body


async def serve_proxy(creds: Credentials, server: str, *, port: int, host: str = "127.0.0.1") -> tuple[web.AppRunner, int]:
    """A local proxy to the scheduler's views and web view, adding the caller's token to each
    request (as ``kubectl proxy`` does): a browser on this machine needs no token."""
    headers = _headers(creds)
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))

    async def forward(request: web.Request) -> web.Response:
        path = request.path
        if not (path.startswith("/debug/") or path == "/ui" or path.startswith("/ui/")):
            raise web.HTTPFound("/ui/") if path == "/" else web.HTTPNotFound()
        try:
            async with http.get(server + path, params=request.query, headers=headers, allow_redirects=False) as resp:
                body = await resp.read()
                kept = {k: v for k, v in resp.headers.items() if k.lower() in ("content-type", "cache-control", "location")}
                return web.Response(body=body, status=resp.status, headers=kept)
        except aiohttp.ClientError as exc:
            return web.json_response({"error": f"cannot reach batchsched at {server}: {exc}"}, status=502)

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
