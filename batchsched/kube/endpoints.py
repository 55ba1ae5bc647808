"""The scheduler's own HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``,
and ``/debug/snapshot`` (the cluster as the scheduler reads it, for ``batchsched simulate``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


async def serve_endpoints(
    address: str, registry: CollectorRegistry, *, ready: Callable[[], bool],
    snapshot: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> tuple[web.AppRunner, int | None]:
    """Serve on ``host:port`` (port 0: any free one); returns the runner (``cleanup()`` it)
    and the port bound. ``/readyz`` answers 503 while ``ready()`` is false."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="not ready")

    async def debug_snapshot(_: web.Request) -> web.Response:
        assert snapshot is not None
        try:
            body = await snapshot()
        except Exception as exc:  # a failed listing is the caller's answer, not a crash
            return web.Response(status=502, text=f"snapshot failed: {exc}")
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app = web.Application()
    if snapshot is not None:
        app.router.add_get("/debug/snapshot", debug_snapshot)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    site = web.TCPSite(runner, host, int(port))
    await site.start()
    server = getattr(site, "_server", None)
    bound = int(server.sockets[0].getsockname()[1]) if server is not None and server.sockets else None
    return runner, bound
