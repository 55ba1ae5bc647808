"""A fault-injecting proxy between a batchsched replica and the apiserver.

It speaks HTTP, not bytes, so it can record each request and cut one cleanly: TLS is
terminated with the sandbox's own serving certificate (issued for 127.0.0.1 by the
sandbox's CA, so the replica's kubeconfig only changes its ``server``), and every request is
sent on over TLS to the real apiserver, verified with the CA. Responses are streamed, so a
watch through the proxy is a watch. It runs an aiohttp server and client on an event loop
in a thread of its own: the harness may block without stalling the replica's traffic.

Modes, switched from any thread:

- pass-through (the default, and after :meth:`Proxy.heal`);
- :meth:`Proxy.slow`: each request waits about ``latency`` seconds (half to one and a half
  times it) before it is sent on; with ``drop_rate``, a request's connection is cut before
  it is sent with that probability, and a streaming response (a watch) is cut with that
  probability in each second it runs;
- :meth:`Proxy.partition`: every open connection is cut at once; new requests are recorded
  but never sent on (as if the network ate them) until :meth:`Proxy.heal`, when they are
  cut, not delivered.

:attr:`Proxy.requests` holds ``(time.time(), method, path with query)`` of every request a
replica sent, forwarded or not; :attr:`Proxy.answers` the status of each one the apiserver
answered.

Between faults it plays the load balancer in front of an apiserver: once the apiserver could
not be reached, connections are refused (cut) until its ``/readyz`` answers 200 again. An apiserver that has just started serves before it is ready, with its RBAC caches
still empty; a client sent there is refused (403) for its first moments, which no load
balancer that checks readiness lets happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml
from aiohttp import web

if TYPE_CHECKING:
    from batchsched.sandbox.cluster import SandboxState

#: headers that belong to one connection, never forwarded
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length"}


def _is_watch(request: web.Request) -> bool:
    return request.query.get("watch") in ("1", "true")


class _Cut(Exception):
    """This request's connection is to be cut."""


class Proxy:
    """See the module docstring. :meth:`start` before use, :meth:`stop` after."""

    def __init__(self, sandbox: SandboxState, *, kubeconfig: str, workdir: Path, seed: int = 0) -> None:
        self.upstream = sandbox.server
        pki = Path(sandbox.dir) / "pki"
        self.ca = str(pki / "ca.crt")
        self.cert = str(pki / "apiserver.crt")
        self.key = str(pki / "apiserver.key")
        self.source_kubeconfig = kubeconfig
        #: the readiness probe's credentials: the sandbox's admin (outside the audit of batchsched's requests)
        self._probe_kubeconfig = sandbox.kubeconfig
        self.kubeconfig = str(workdir / "kubeconfig-proxy")
        self.requests: list[tuple[float, str, str]] = []
        #: (time, method, path, status) of every request the apiserver answered
        self.answers: list[tuple[float, str, str, int]] = []
        #: requests answered (forwarded), cut, and held during partitions
        self.forwarded = 0
        self.cut = 0
        self.held = 0
        self.port = 0
        self._latency = 0.0
        self._drop = 0.0
        self._partitioned = False
        self._watches_held = False
        self._rng = random.Random(seed)
        self._open: set[asyncio.Task[Any]] = set()
        #: the open streaming responses (watches), cut at random while slow
        self._streams: set[asyncio.Task[Any]] = set()
        self._heal_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None
        #: the apiserver could not be reached: wait for its /readyz before sending on
        self._upstream_down = False
        self._ready_wait: asyncio.Task[None] | None = None

    # -- modes (any thread) -------------------------------------------------------------

    def slow(self, latency: float, drop_rate: float = 0.0) -> None:
        """Delay every request by about ``latency`` s; cut connections at ``drop_rate``."""
        self._call(self._set_slow, latency, drop_rate)

    def partition(self, *, watches_only: bool = False) -> None:
        """Cut every connection and hold new requests (nothing reaches the apiserver).
        With ``watches_only``, only the watches are cut and held: other requests (the
        lease's renewals among them) still pass."""
        self._call(self._set_partition, watches_only)

    def heal(self) -> None:
        """Back to pass-through; requests held during a partition are cut, not delivered."""
        self._call(self._set_heal)

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    def _call(self, fn: Any, *args: Any) -> None:
        if self._loop is None:
            raise RuntimeError("the proxy is not running")
        done = threading.Event()

        def run() -> None:
            try:
                fn(*args)
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def _set_slow(self, latency: float, drop: float) -> None:
        self._latency, self._drop = latency, drop

    def _set_partition(self, watches_only: bool) -> None:
        self._partitioned = not watches_only
        self._watches_held = watches_only
        self._heal_event = asyncio.Event()
        for task in list(self._streams if watches_only else self._open):
            task.cancel()

    def _set_heal(self) -> None:
        self._partitioned = self._watches_held = False
        self._latency = self._drop = 0.0
        if self._heal_event is not None:
            self._heal_event.set()

    # -- life cycle ----------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        self._thread = threading.Thread(target=self._run_thread, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the proxy did not start: {self._error}")
        kc = yaml.safe_load(Path(self.source_kubeconfig).read_text())
        for cluster in kc.get("clusters") or []:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
            cluster["cluster"]["certificate-authority"] = self.ca
        path = Path(self.kubeconfig)
        path.write_text(yaml.safe_dump(kc))
        path.chmod(0o600)

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(15)

    def _run_thread(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(self.cert, self.key)
        client_ctx = ssl.create_default_context(cafile=self.ca)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=client_ctx),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx, shutdown_timeout=0.5)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self._started.set()
        dropper = asyncio.create_task(self._drop_streams())
        try:
            await self._stopping.wait()
        finally:
            dropper.cancel()
            for task in list(self._open):
                task.cancel()
            await runner.cleanup()
            await self._session.close()

    async def _drop_streams(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self._drop:
                for task in list(self._streams):
                    if self._rng.random() < self._drop:
                        task.cancel()

    # -- one request ------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((time.time(), request.method, request.path_qs))
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        try:
            return await self._serve(request)
        except (asyncio.CancelledError, _Cut):
            self.cut += 1
            if request.transport is not None:
                request.transport.abort()  # type: ignore[attr-defined]
            raise asyncio.CancelledError from None
        finally:
            self._open.discard(task)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        if self._partitioned or (self._watches_held and _is_watch(request)):
            self.held += 1
            assert self._heal_event is not None
            await self._heal_event.wait()
            raise _Cut
        if self._latency:
            await asyncio.sleep(self._latency * self._rng.uniform(0.5, 1.5))
        if self._drop and self._rng.random() < self._drop:
            raise _Cut
        if self._partitioned:
            raise _Cut
        if self._upstream_down:
            self._start_probe()
            raise _Cut  # no ready apiserver behind the balancer: the connection is refused
        try:
            return await self._forward(request)
        except aiohttp.ClientConnectionResetError:
            raise _Cut from None  # the replica hung up
        except (aiohttp.ClientError, ConnectionError, OSError):
            # the apiserver is away, or went away mid-answer: the network drops the
            # connection, and sends nothing on until the apiserver is ready again
            self._upstream_down = True
            raise _Cut from None

    def _start_probe(self) -> None:
        """Probe the apiserver's /readyz (one probe at a time) until it answers 200."""
        if self._ready_wait is None or self._ready_wait.done():
            kc = yaml.safe_load(Path(self._probe_kubeconfig).read_text())
            auth = f"Bearer {kc['users'][0]['user']['token']}"
            self._ready_wait = asyncio.create_task(self._probe(auth))

    async def _probe(self, auth: str) -> None:
        while self._upstream_down:
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async with self._session.get(self.upstream + "/readyz", headers={"Authorization": auth},
                                             timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        self._upstream_down = False
                        return
            await asyncio.sleep(0.2)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                          data=body or None, allow_redirects=False) as upstream:
            self.answers.append((time.time(), request.method, request.path_qs, upstream.status))
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP:
                    resp.headers[k] = v
            streaming = _is_watch(request)
            if not streaming and upstream.content_length is not None:
                resp.content_length = upstream.content_length
            await resp.prepare(request)
            task = asyncio.current_task()
            if streaming and task is not None:
                self._streams.add(task)
            try:
                async for chunk in upstream.content.iter_any():
                    await resp.write(chunk)
            finally:
                self._streams.discard(task)  # type: ignore[arg-type]
            self.forwarded += 1
            with contextlib.suppress(ConnectionError):
                await resp.write_eof()
            return resp
