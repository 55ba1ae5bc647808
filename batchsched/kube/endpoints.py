"""The scheduler's own HTTP endpoints, on two listeners.

Plain HTTP, open (:class:`PlainEndpoints`, ``metricsAddress``): ``/metrics`` (Prometheus),
``/healthz``, ``/readyz``; nothing that needs a token. They are answered from a thread of
their own, so a probe or a scrape is answered while a long step holds the event loop (the
first step over a large backlog, a list of every pod taken in); ``/healthz`` still tells
whether that loop runs: it fails once the loop has not turned for
:data:`LOOP_STALL_SECONDS`. HTTPS only (:func:`serve_views`,
``explain.address``, :mod:`batchsched.kube.tls`), behind the cluster's authentication and
RBAC (:mod:`batchsched.kube.auth`): the views ``/debug/queues``, ``/debug/jobs``,
``/debug/nodes``, ``/debug/explain``, the read-only web view under ``/ui/`` (static files
that read those views), and ``/debug/snapshot`` (the cluster as the scheduler reads it, for
``batchsched simulate``) when it is turned on. A plain-HTTP request to the views' port fails
in the TLS handshake: no token is ever read off an unencrypted connection.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Protocol

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from batchsched.kube.auth import RequestAuth

__all__ = ["LOOP_STALL_SECONDS", "PlainEndpoints", "Views", "bound_port", "serve_views"]

#: ``/healthz`` fails when the event loop has not turned for this long: far beyond any step
#: or list (seconds at the largest sizes measured), so only a loop that is stuck
LOOP_STALL_SECONDS = 60.0

_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".svg": "image/svg+xml"}


class Views(Protocol):
    """What the debug endpoints serve (the app answers from its session)."""

    async def queues(self) -> dict[str, Any]: ...

    async def jobs(self, *, queue: str | None, namespace: str | None) -> dict[str, Any]: ...

    async def nodes(self) -> dict[str, Any]: ...

    async def explain(self, *, kind: str, name: str, namespace: str, api: str = "") -> dict[str, Any]:
        """Raises LookupError for an unknown object; ``api``: the PodGroup's API group."""
        ...


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


class PlainEndpoints:
    """``/metrics``, ``/healthz`` and ``/readyz`` over plain HTTP on ``host:port`` (port 0:
    any free one), served by a thread of their own. ``/readyz`` answers 503 while
    ``ready()`` is false; ``/healthz`` answers 503 while ``stalled()`` gives the seconds
    the event loop has not turned for (None: it turns)."""

    def __init__(self, address: str, registry: CollectorRegistry, *, ready: Callable[[], bool],
                 stalled: Callable[[], float | None]) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, ctype, body = 404, "text/plain", b"not found"
                if self.path == "/metrics":
                    status, ctype, body = 200, CONTENT_TYPE_LATEST, generate_latest(registry)
                elif self.path == "/healthz":
                    since = stalled()
                    status, body = (200, b"ok") if since is None else \
                        (503, f"the event loop has not run for {since:.0f} s".encode())
                elif self.path == "/readyz":
                    status, body = (200, b"ok") if ready() else (503, b"not ready")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # no access log

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        self._server = Server((host, int(port)), Handler)
        #: the port bound
        self.port: int = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="endpoints", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


async def serve_views(
    address: str, tls: ssl.SSLContext, *, auth: RequestAuth,
    snapshot: Callable[[], Awaitable[dict[str, Any]]] | None = None, views: Views | None = None,
) -> tuple[web.AppRunner, int | None]:
    """The views (and ``/debug/snapshot`` when given) over HTTPS with ``tls`` on
    ``host:port``, each request's token checked by ``auth``; the runner and the port."""

    @web.middleware
    async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        path = request.path
        if path.startswith("/debug/") or path == "/ui" or path.startswith("/ui/"):
            decision = await auth.check(request.headers.get("Authorization"), path)
            if decision.status != 200:
                return _json({"error": decision.message}, decision.status)
        return await handler(request)

    app = web.Application(middlewares=[guard])
    if snapshot is not None:
        async def debug_snapshot(_: web.Request) -> web.Response:
            try:
                body = await snapshot()
            except Exception as exc:  # a failed listing is the caller's answer, not a crash
                return web.Response(status=502, text=f"snapshot failed: {exc}")
            return _json(body)

        app.router.add_get("/debug/snapshot", debug_snapshot)
    if views is not None:
        _add_views(app, views)
    return await _start(app, address, tls)


def _add_views(app: web.Application, views: Views) -> None:
    async def queues(_: web.Request) -> web.Response:
        return _json(await views.queues())

    async def jobs(request: web.Request) -> web.Response:
        q = request.query
        return _json(await views.jobs(queue=q.get("queue") or None, namespace=q.get("namespace") or None))

    async def nodes(_: web.Request) -> web.Response:
        return _json(await views.nodes())

    async def explain(request: web.Request) -> web.Response:
        q = request.query
        kind = (q.get("kind") or "").lower()
        if kind not in ("pod", "podgroup", "queue") or not q.get("name"):
            return _json({"error": "give kind=pod|podgroup|queue and name (and namespace)"}, 400)
        try:
            return _json(await views.explain(kind=kind, name=q["name"], namespace=q.get("namespace") or "default",
                                             api=q.get("api") or ""))
        except LookupError as exc:
            return _json({"error": str(exc.args[0]) if exc.args else "not found"}, 404)

    web_root = resources.files("batchsched.insight").joinpath("web")

    async def ui(request: web.Request) -> web.StreamResponse:
        name = request.match_info.get("name") or "index.html"
        if request.path == "/ui":
            raise web.HTTPFound("/ui/")
        if "/" in name or name.startswith(".") or not any(name.endswith(s) for s in _TYPES):
            raise web.HTTPNotFound()
        item = web_root.joinpath(name)
        if not item.is_file():
            raise web.HTTPNotFound()
        suffix = name[name.rfind("."):]
        return web.Response(body=item.read_bytes(), content_type=_TYPES[suffix],
                            headers={"Cache-Control": "no-cache"})

    app.router.add_get("/debug/queues", queues)
    app.router.add_get("/debug/jobs", jobs)
    app.router.add_get("/debug/nodes", nodes)
    app.router.add_get("/debug/explain", explain)
    app.router.add_get("/ui", ui)
    app.router.add_get("/ui/", ui)
    app.router.add_get("/ui/{name}", ui)


async def _start(app: web.Application, address: str, tls: ssl.SSLContext | None) -> tuple[web.AppRunner, int | None]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    site = web.TCPSite(runner, host.strip("[]"), int(port), ssl_context=tls)
    await site.start()
    return runner, bound_port(site)


def bound_port(site: web.TCPSite) -> int | None:
    """The port a started site listens on (it was asked for port 0: any free one)."""
    server = getattr(site, "_server", None)
    return int(server.sockets[0].getsockname()[1]) if server is not None and server.sockets else None
