"""The running scheduler: watches in, one cycle loop, binder and status writers out.

Everything here is I/O and wiring; decisions are made by :class:`batchsched.core.cycle.Cycle`
over a snapshot of :class:`batchsched.core.state.ClusterState`. The event loop is the
single writer of the state: watch callbacks and bind results mutate it between cycles,
and a cycle runs synchronously, so it never sees a half-applied event.

Loop::

    wait for a reason to run (a new pending pod, capacity freed or added, a bind failed,
    or the slow retry timer) -> snapshot -> cycle -> assume each binding and hand it to
    the binder -> write FailedScheduling for pods whose reason changed
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from batchsched.config import Config, ConfigError, load_config
from batchsched.core import kernels
from batchsched.core.cycle import Binding, Cycle, Unit, single_unit
from batchsched.core.model import PodUID, parse_node, parse_pod
from batchsched.core.state import ClusterState
from batchsched.kube.binder import Binder
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import KubeError, NotFoundError
from batchsched.kube.leader import LeaderElector
from batchsched.kube.status import ObjectRef, StatusWriter
from batchsched.kube.watch import Reflector
from batchsched.metrics import Metrics

log = logging.getLogger("batchsched")


def pod_ref(namespace: str, name: str, uid: str) -> ObjectRef:
    return ObjectRef(kind="Pod", api_version="v1", namespace=namespace, name=name, uid=uid)


class Scheduler:
    """One replica. ``await run()`` until :meth:`stop` (or SIGTERM through :func:`serve`)."""

    def __init__(
        self,
        client: KubeClient,
        config: Config,
        *,
        metrics: Metrics | None = None,
        identity: str | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.metrics = metrics or Metrics()
        self.identity = identity or config.identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.state = ClusterState(config.scheduler_names)
        self.cycle = Cycle(config.scoring_config())
        self.binder = Binder(
            client, concurrency=config.binder.concurrency, retries=config.binder.retries,
            on_result=self._bind_result,
        )
        self.status = StatusWriter(client, instance=self.identity, concurrency=config.status.concurrency)
        self.ready = False
        self.leading = asyncio.Event()
        self.cycles = 0
        self.http_port: int | None = None
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        #: uid -> (capacity generation, time) of the last failed attempt
        self._attempts: dict[PodUID, tuple[int, float]] = {}
        self._assumed_at: dict[PodUID, float] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self.elector: LeaderElector | None = None
        self.reflectors = [
            Reflector(client, "/api/v1/nodes", on_list=self._nodes_listed, on_event=self._node_event, name="nodes"),
            Reflector(client, "/api/v1/pods", on_list=self._pods_listed, on_event=self._pod_event, name="pods"),
        ]

    # -- watch callbacks (the only writers of the state, with bind results) ------------------

    def _nodes_listed(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_nodes(parse_node(o) for o in items)
        self._wake.set()

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.metrics.watch_events.labels("nodes").inc()
        before = self.state.capacity_generation
        self.state.node_event(kind, parse_node(obj))
        if self.state.capacity_generation != before:
            self._wake.set()

    def _pods_listed(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_pods(parse_pod(o) for o in items)
        self._wake.set()

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.metrics.watch_events.labels("pods").inc()
        pod = parse_pod(obj)
        before = self.state.capacity_generation
        was_pending = pod.uid in self.state.pending
        self.state.pod_event(kind, pod)
        if kind == "DELETED" or pod.holds_resources or pod.terminal:
            self._attempts.pop(pod.uid, None)
            self._assumed_at.pop(pod.uid, None)
            if kind == "DELETED":
                self.status.forget(pod.uid)
        if self.state.capacity_generation != before or (
            pod.uid in self.state.pending and not was_pending
        ):
            self._wake.set()
        elif pod.uid in self.state.pending and self._attempts.get(pod.uid) is not None:
            # the pod itself changed (new tolerations, gates removed...): try it again
            self._attempts.pop(pod.uid, None)
            self._wake.set()

    # -- binding results -------------------------------------------------------------------------

    def _bind_result(self, b: Binding, outcome: str, err: KubeError | None) -> None:
        self.metrics.binds.labels(outcome).inc()
        uid = PodUID(b.uid)
        if outcome == "bound":
            if self.config.status.scheduled_events:
                self.status.pod_scheduled(pod_ref(b.namespace, b.name, b.uid), b.node)
            return
        self._assumed_at.pop(uid, None)
        self.state.forget(uid)
        if outcome == "conflict":
            self._resync(b.namespace, b.name, uid)
        elif outcome == "failed":
            self._attempts[uid] = (self.state.capacity_generation, time.monotonic())
        self._wake.set()

    def _resync(self, namespace: str, name: str, uid: PodUID) -> None:
        async def fetch() -> None:
            try:
                obj = await self.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            except NotFoundError:
                pod = self.state.pods.get(uid)
                if pod is not None:
                    self.state.pod_event("DELETED", pod)
                return
            except KubeError as exc:
                log.warning("resync of %s/%s failed: %s", namespace, name, exc)
                return
            if obj.get("metadata", {}).get("uid") != uid:
                old = self.state.pods.get(uid)
                if old is not None:
                    self.state.pod_event("DELETED", old)
            self._pod_event("MODIFIED", obj)

        self._tasks.append(asyncio.get_running_loop().create_task(fetch()))

    # -- the loop ----------------------------------------------------------------------------------

    def schedulable_units(self, now: float) -> list[Unit]:
        retry = self.config.cycle.retry_unschedulable_seconds
        gen = self.state.capacity_generation
        units = []
        for uid, pod in self.state.pending.items():
            if pod.gated:
                continue
            seen = self._attempts.get(uid)
            if seen is not None and seen[0] == gen and now - seen[1] < retry:
                continue
            units.append(single_unit(pod))
        return units

    def run_cycle(self) -> int:
        """One cycle now; returns the number of bindings handed to the binder."""
        now = time.monotonic()
        units = self.schedulable_units(now)
        self.metrics.pending_pods.set(len(self.state.pending))
        if not units:
            return 0
        gen = self.state.capacity_generation
        t0 = time.perf_counter()
        snap = self.state.snapshot()
        t1 = time.perf_counter()
        plan = self.cycle.run(snap, units)
        self.cycles += 1
        for b in plan.bindings:
            uid = PodUID(b.uid)
            self.state.assume(uid, b.node)
            self._attempts.pop(uid, None)
            self._assumed_at[uid] = now
            self.binder.submit(b)
        for u in plan.unschedulable:
            self._attempts[u.pod.uid] = (gen, now)
            self.status.pod_unschedulable(pod_ref(u.pod.namespace, u.pod.name, u.pod.uid), u.message)
        t2 = time.perf_counter()
        m = self.metrics
        m.cycle_duration.labels("snapshot").observe(t1 - t0)
        m.cycle_duration.labels("kernel").observe(plan.timings.get("kernel", 0.0))
        m.cycle_duration.labels("total").observe(t2 - t0)
        m.attempts.labels("scheduled").inc(len(plan.bindings))
        m.attempts.labels("unschedulable").inc(len(plan.unschedulable))
        m.assumed_pods.set(len(self.state.assumed))
        m.nodes.set(len(self.state.nodes))
        log.debug(
            "cycle %d: %d units, %d bound, %d unschedulable in %.1f ms",
            self.cycles, len(units), len(plan.bindings), len(plan.unschedulable), (t2 - t0) * 1e3,
        )
        return len(plan.bindings)

    def _check_assumed(self, now: float) -> None:
        """A binding the apiserver accepted that the watch never confirmed: look again."""
        limit = self.config.binder.assumed_timeout_seconds
        for uid, since in list(self._assumed_at.items()):
            if now - since > limit and uid in self.state.assumed:
                pod = self.state.pods.get(uid)
                self._assumed_at[uid] = now
                if pod is not None:
                    self._resync(pod.namespace, pod.name, uid)

    async def _loop(self) -> None:
        interval = self.config.cycle.min_interval_seconds
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            if not self.leading.is_set() or self._stopping.is_set():
                continue
            if interval:
                await asyncio.sleep(interval)
            self._check_assumed(time.monotonic())
            self.run_cycle()

    # -- life cycle --------------------------------------------------------------------------------

    async def _serve_http(self) -> web.AppRunner:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            return web.Response(text="ok") if self.ready else web.Response(status=503, text="not ready")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, _, port = self.config.metrics_address.rpartition(":")
        site = web.TCPSite(runner, host, int(port))
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.http_port = int(server.sockets[0].getsockname()[1])
        return runner

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        runner = await self._serve_http()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(r.run(), name=f"watch-{r.name}") for r in self.reflectors]
        tasks.append(loop.create_task(self.status.run(), name="status"))
        warm = loop.run_in_executor(None, kernels.warm_up)
        try:
            await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
            await warm
            self.ready = True
            log.info("mirror synced: %d nodes, %d pods; %d pending", len(self.state.nodes), len(self.state.pods), len(self.state.pending))
            le = self.config.leader_election
            if le.enabled:
                self.elector = LeaderElector(
                    client=self.client, namespace=le.namespace, name=le.lease_name, identity=self.identity,
                    lease_duration=le.lease_duration_seconds, renew_deadline=le.renew_deadline_seconds,
                    retry_period=le.retry_period_seconds,
                )

                def started() -> None:
                    log.info("%s is the leader", self.identity)
                    self.metrics.leader.set(1)
                    self.leading.set()
                    self._wake.set()

                def stopped() -> None:
                    log.warning("%s lost the lease; stopping", self.identity)
                    self.metrics.leader.set(0)
                    self.leading.clear()
                    self.stop()

                tasks.append(loop.create_task(self.elector.run(started, stopped), name="leader"))
            else:
                self.leading.set()
            loop_task = loop.create_task(self._loop(), name="cycle")
            await self._stopping.wait()
            await loop_task
        finally:
            self.leading.clear()
            drained = await self.binder.drain(10.0)
            if not drained:
                log.warning("shutting down with %d bindings in flight", self.binder.in_flight)
            await self.status.drain(5.0)
            if self.elector is not None:
                with contextlib.suppress(Exception):
                    await self.elector.release()
            for t in tasks + self._tasks:
                t.cancel()
            await asyncio.gather(*tasks, *self._tasks, return_exceptions=True)
            await runner.cleanup()


async def serve(kubeconfig: str | None, config: Config) -> None:
    client = await KubeClient.connect(kubeconfig)
    sched = Scheduler(client, config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sched.stop)
    try:
        await sched.run()
    finally:
        await client.close()


def run_from_cli(*, kubeconfig: str | None, config_path: str | None) -> int:
    logging.basicConfig(
        level=os.environ.get("BATCHSCHED_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"batchsched: error: {exc}", file=__import__("sys").stderr)
        return 1
    try:
        asyncio.run(serve(kubeconfig, config))
    except KeyboardInterrupt:
        return 130
    except (KubeError, OSError) as exc:
        print(f"batchsched: error: {exc}", file=__import__("sys").stderr)
        return 1
    return 0
