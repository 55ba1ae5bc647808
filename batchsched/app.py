"""The running scheduler: a thin async shell around the pure scheduling session.

All decisions are made by :class:`batchsched.core.session.Session`; this module only moves
data in and out of it:

- **watches -> session**: each reflector parses its objects and hands them to the
  session's event intake (the event loop is the single writer, so a step never sees a
  half-applied event);
- **loop -> session.step -> I/O**: when the session wants a step (or on the slow timer),
  ``step(now)`` returns :class:`~batchsched.core.session.Decisions`, which go to the
  binder, the evictor and the status writers; their results go back to the session's
  result intake;
- **http, leader election, metrics, shutdown**.

Every write made for the leader (Bindings, evictions, cleanups, pod conditions and Events,
PodGroup and Queue status) goes through one :class:`~batchsched.kube.leader.Fence`, which
the elector keeps open until its last renewal's deadline; without leader election it is
always open. A replica that loses its lease stops without sending anything more: what
was queued is dropped by the fence, nothing is drained and the Lease is not touched. A
leader stopped gracefully hands over: its fence closes, what it sent lands, and it
releases the Lease (:meth:`Scheduler._hand_over`); a new leader steps once its mirror is
shown to hold every write of its predecessor (:meth:`Scheduler._catch_up`).

The clock is read here and nowhere in the core: ``time.time()`` is passed to the session.
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

from batchsched import procmem
from batchsched.config import Config, ConfigError, load_config
from batchsched.core.decisions import Decisions
from batchsched.core.model import PodUID
from batchsched.core.placement import kernels
from batchsched.core.plan import Binding, Eviction, ObjectRef
from batchsched.core.session import Session
from batchsched.insight.explain import Insight
from batchsched.kube.auth import RequestAuth
from batchsched.kube.binder import Binder
from batchsched.kube.cleanup import CleanupWriter
from batchsched.kube.client import KubeClient
from batchsched.kube.endpoints import LOOP_STALL_SECONDS, PlainEndpoints, serve_views
from batchsched.kube.errors import KubeError, NotFoundError
from batchsched.kube.evictor import Evictor
from batchsched.kube.gauges import observe_bound, slow_gauges
from batchsched.kube.groupstatus import GroupStatusWriter
from batchsched.kube.intake import PODGROUP_PATHS, Intake
from batchsched.kube.leader import ENDPOINT_ANNOTATION, Fence, LeaderElector
from batchsched.kube.mixstore import MixStore, observe_mix
from batchsched.kube.queuestatus import QueueStatusWriter
from batchsched.kube.snapshot import take_snapshot
from batchsched.kube.status import StatusWriter
from batchsched.kube.tls import (
    CA_ANNOTATION,
    SERVER_NAME_ANNOTATION,
    CertificateError,
    ServingTls,
    serving_names,
)
from batchsched.kube.views import SessionViews
from batchsched.kube.watch import Reflector
from batchsched.metrics import Metrics

log = logging.getLogger("batchsched")

#: a step longer than this may have freed much memory: it is given back to the system,
#: at most every :data:`TRIM_EVERY_SECONDS`
TRIM_AFTER_SECONDS = 0.5
TRIM_EVERY_SECONDS = 30.0
#: a collection listed this soon after the previous leader's writes could have ended is
#: listed again when leading begins (writes in flight at that moment, clocks a little apart)
CATCH_UP_MARGIN_SECONDS = 2.0
#: the collections a leader writes, by their reflectors' names (Bindings, evictions and
#: cleanups of pods; ResourceClaims allocated for pods; PodGroup and Queue status): the
#: only ones where a write of the previous leader can be missing from a standby's mirror
#: (what others write reaches a leader's watches as late as it reaches a standby's)
LEADER_WRITES = frozenset({"pods", "resourceclaims", "queues", *(f"podgroups.{api}" for api in PODGROUP_PATHS)})
#: how often a standby looks whether its leader has gone silent (:meth:`Scheduler._read_ahead`)
READ_AHEAD_POLL_SECONDS = 0.25
#: the watch that shows a collection's mirror current (:meth:`Scheduler._watch_shows_current`)
#: lasts this long: the apiserver sends a bookmark 2 s before a watch's end
PROBE_WATCH_SECONDS = 3
#: the gauges that walk every queue, group and node are set at most this often
SLOW_GAUGE_SECONDS = 5.0
#: how often a views certificate from files is checked for a renewal
CERTIFICATE_CHECK_SECONDS = 60.0

class SchedulerFailed(RuntimeError):
    """The replica stopped on an unexpected error (it was reported and the lease released)."""


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
        self.session = Session(config.session_settings())
        #: closed until this replica leads (open for good without leader election)
        self.fence = Fence() if config.leader_election.enabled else Fence.always_open()
        fence = self.fence
        self.cleanups = CleanupWriter(client, fence=fence)
        self.binder = Binder(
            client, concurrency=config.binder.concurrency, retries=config.binder.retries,
            on_result=self._bind_result, cleanups=self.cleanups, identity=self.identity, fence=fence,
        )
        self.evictor = Evictor(
            client, concurrency=config.gang.eviction_concurrency, on_result=self._evict_result, fence=fence,
        )
        self.status = StatusWriter(
            client, instance=self.identity, concurrency=config.status.concurrency, fence=fence,
        )
        self.group_status = GroupStatusWriter(client, fence=fence)
        self.queue_status = QueueStatusWriter(client, fence=fence)
        le = config.leader_election
        #: the workload mix kept across restarts, next to the Lease (written while leading)
        self.mix_store = MixStore(client, self.session.state, namespace=le.namespace, lease_name=le.lease_name,
                                  fence=fence)
        #: the lease was lost (not given up): stop without sending anything more
        self.lease_lost = False
        self.ready = False
        self.leading = asyncio.Event()
        #: the plain port of /metrics, /healthz, /readyz
        self.http_port: int | None = None
        #: the HTTPS port of the views (None when neither views nor snapshot are served)
        self.views_port: int | None = None
        #: the views' certificate and the CA published on the Lease
        self.tls: ServingTls | None = None
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.elector: LeaderElector | None = None
        self._failure: BaseException | None = None
        self._trimmed = -1e18
        #: when the event loop last turned (``/healthz`` fails once it stops turning)
        self._turned = time.monotonic()
        #: one catch-up list of the collections a leader writes at a time
        self._relisting = asyncio.Lock()
        #: set while a graceful stop hands the Lease over: results no longer reach the session
        self._handing_over = False
        #: reflector name -> when this replica's last catch-up list of it began
        self._read_at: dict[str, float] = {}
        self.intake = Intake(
            client, self.session, status=self.status, group_status=self.group_status,
            queue_status=self.queue_status, metrics=self.metrics, on_change=self._poke, on_failure=self._fail,
        )
        self.reflectors = self.intake.reflectors
        ex = config.explain
        self.insight = Insight(self.session, estimate_ttl=ex.estimate_ttl_seconds, max_steps=ex.estimate_max_steps)
        self.views = SessionViews(self.insight, self.metrics, budget=ex.estimate_budget_seconds)
        self._gauged = -1e18

    def _fail(self, exc: BaseException) -> None:
        """An unexpected error: never keep a replica that looks alive and schedules
        nothing. Stop (not ready, the lease released) and exit non-zero."""
        log.critical("stopping: %s", exc, exc_info=exc)
        if self._failure is None:
            self._failure = exc
        self.ready = False
        self.stop()

    @property
    def cycles(self) -> int:
        return self.session.cycles

    def _poke(self) -> None:
        if self.session.wants_step:
            self._wake.set()

    # -- results -----------------------------------------------------------------------------------

    def _bind_result(self, b: Binding, outcome: str, err: KubeError | None) -> None:
        self.metrics.binds.labels(outcome).inc()
        if self._handing_over:
            return  # its session ends with it: thousands of Bindings dropped at the fence cost nothing
        if outcome == "bound":
            now = time.time()
            observe_bound(self.metrics, self.session, b, now)
            self.views.started(b.unit, now)
        error = str(err) if err is not None and outcome == "failed" else ""
        self.intake.guard(lambda: self._apply(self.session.on_bind_result(b, outcome, now=time.time(), error=error)))

    def _evict_result(self, e: Eviction, outcome: str, err: KubeError | None) -> None:
        if self._handing_over:
            return
        if outcome == "evicted":
            self.metrics.evictions.labels(e.cause).inc()
        if e.preemptor and outcome == "evicted":
            self.metrics.attempts.labels("preempted").inc()
        if e.preemptor and outcome in ("blocked", "failed"):
            log.info("preemption for %s: eviction of %s/%s %s: %s", e.preemptor, e.namespace, e.name, outcome, err)
        error = str(err) if err is not None else ""
        self.intake.guard(lambda: self._apply(self.session.on_evict_result(e, outcome, error=error)))

    def _resync(self, ref: ObjectRef) -> None:
        """Read a pod again (a conflict, a binding never confirmed) and feed what is there."""
        uid = PodUID(ref.uid)

        async def fetch() -> None:
            state = self.session.state
            try:
                obj = await self.client.get(f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}")
            except NotFoundError:
                pod = state.pods.get(uid)
                if pod is not None:
                    self.session.on_pod("DELETED", pod)
                self._poke()
                return
            except KubeError as exc:
                log.warning("resync of %s/%s failed: %s", ref.namespace, ref.name, exc)
                return
            if obj.get("metadata", {}).get("uid") != uid:
                old = state.pods.get(uid)
                if old is not None:
                    self.session.on_pod("DELETED", old)
            self.intake.pod("MODIFIED", obj)
            self.intake.guard(lambda: self._apply(self.session.on_pod_read(uid, now=time.time())))

        self._tasks.append(asyncio.get_running_loop().create_task(fetch()))

    # -- decisions -> I/O ----------------------------------------------------------------------------

    def _apply(self, d: Decisions) -> None:
        # cleanups first: a binding that writes the same pod waits for its cleanup
        for ref, stale_annotations, stale_labels in d.cleanups:
            self.cleanups.submit(ref, stale_annotations, stale_labels)
        for namespace, name, uid in d.claim_deletes:
            self.cleanups.delete_claim(namespace, name, uid)
        self.binder.submit_all(d.binds)
        for e in d.evictions:
            self.evictor.submit(e)
        for c in d.unschedulable:
            self.status.pod_unschedulable(c.ref, c.message, reason=c.reason)
        for n in d.scheduled:
            self.status.pod_scheduled(n.ref, n.node, where=n.where)
        for ev in d.events:
            self.status.event(ev.ref, type=ev.type, reason=ev.reason, message=ev.message)
        for group, status in d.group_statuses:
            self.group_status.update(group, status)
        for name, qstatus in d.queue_statuses:
            self.queue_status.update(name, qstatus)
        for ref in d.resyncs:
            self._resync(ref)
        for ref, node in d.nominated:
            self.status.pod_nominated(ref, node)

    def run_cycle(self) -> int:
        """One step now; returns the number of bindings handed to the binder."""
        t0 = time.perf_counter()
        with procmem.collector_paused():
            d = self.session.step(time.time())
            self._apply(d)
        if d.again:
            self._wake.set()
        seconds = time.perf_counter() - t0
        if self.session.cycles <= 1 and d.plan is not None:
            log.info("first cycle: %d bindings out, %d pods told, in %.2f s", len(d.binds), len(d.unschedulable),
                     seconds)
        self._observe(d, seconds)
        if seconds > TRIM_AFTER_SECONDS and time.monotonic() - self._trimmed > TRIM_EVERY_SECONDS:
            # a large step freed much: give the pages back (the resident size stays honest)
            self._trimmed = time.monotonic()
            procmem.trim()
        return len(d.binds)

    def _observe(self, d: Decisions, seconds: float) -> None:
        m, state = self.metrics, self.session.state
        m.pending_pods.set(len(state.pending))
        m.assumed_pods.set(len(state.assumed))
        m.pods_untold.set(self.status.owed)
        m.nodes.set(len(state.nodes))
        cards, held, free = state.card_usage()
        m.gpu_cards.set(cards)
        m.gpu_allocated.set(held / 1000)
        m.gpu_free_cards.set(free)
        if time.monotonic() - self._gauged >= SLOW_GAUGE_SECONDS:
            self._gauged = time.monotonic()
            slow_gauges(m, self.session)
            observe_mix(m.workload_mix, state)
        plan = d.plan
        if plan is None:
            return
        m.cycle_duration.labels("kernel").observe(plan.timings.get("kernel", 0.0))
        m.cycle_duration.labels("preempt").observe(plan.timings.get("preempt", 0.0))
        m.cycle_duration.labels("total").observe(seconds)
        m.attempts.labels("scheduled").inc(len(plan.bindings))
        m.attempts.labels("unschedulable").inc(len(plan.unschedulable))
        log.debug(
            "cycle %d: %d bound, %d unschedulable in %.1f ms",
            self.session.cycles, len(plan.bindings), len(plan.unschedulable), seconds * 1e3,
        )

    async def _loop(self) -> None:
        interval = self.config.cycle.min_interval_seconds
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            if not self.leading.is_set() or self._stopping.is_set() or not self.fence.is_open():
                continue
            if interval:
                await asyncio.sleep(interval)
            self.run_cycle()

    # -- life cycle --------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _stalled(self) -> float | None:
        """Seconds the event loop has not turned for, past :data:`LOOP_STALL_SECONDS` (None:
        it turns); read by ``/healthz`` from its own thread."""
        since = time.monotonic() - self._turned
        return since if since > LOOP_STALL_SECONDS else None

    async def _turning(self) -> None:
        while True:
            self._turned = time.monotonic()
            await asyncio.sleep(1.0)

    async def run(self) -> None:
        self._turned = time.monotonic()
        plain = PlainEndpoints(self.config.metrics_address, self.metrics.registry,
                               ready=lambda: self.ready, stalled=self._stalled)
        self.http_port = plain.port
        runners: list[web.AppRunner] = []
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[Any]] = []
        if self.config.explain.enabled or self.config.debug_snapshot:
            try:
                runners.append(await self._serve_views())
            except BaseException:
                plain.close()
                raise
            if self.tls is not None and self.config.explain.tls.cert_file:
                tasks.append(loop.create_task(self._reload_certificate(), name="views-certificate"))
        # the mix kept from before (it takes the prior's place); the listing adds every pod to it
        await self.mix_store.restore()
        tasks.append(loop.create_task(self._turning(), name="loop-turns"))
        tasks += [loop.create_task(r.run(), name=f"watch-{r.name}") for r in self.reflectors]
        tasks.append(loop.create_task(self.status.run(), name="status"))
        tasks.append(loop.create_task(self.group_status.run(), name="group-status"))
        tasks.append(loop.create_task(self.queue_status.run(), name="queue-status"))
        tasks.append(loop.create_task(self.mix_store.run(), name="workload-mix"))
        warm = loop.run_in_executor(None, kernels.warm_up)
        try:
            await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
            log.info("kernels ready in %.2f s", await warm)
            self.ready = True
            state = self.session.state
            log.info("mirror synced: %d nodes, %d pods; %d pending", len(state.nodes), len(state.pods), len(state.pending))
            le = self.config.leader_election
            if le.enabled:
                self.elector = LeaderElector(
                    client=self.client, namespace=le.namespace, name=le.lease_name, identity=self.identity,
                    lease_duration=le.lease_duration_seconds, renew_deadline=le.renew_deadline_seconds,
                    retry_period=le.retry_period_seconds, fence=self.fence,
                    annotations=self._lease_annotations(),
                )

                def started() -> None:
                    log.info("%s is the leader", self.identity)
                    self.metrics.leader.set(1)
                    self._tasks.append(loop.create_task(self._catch_up(), name="catch-up"))

                def stopped() -> None:
                    if not self._stopping.is_set():
                        log.warning("%s lost the lease; stopping", self.identity)
                        self.lease_lost = True
                    self.metrics.leader.set(0)
                    self.leading.clear()
                    self.stop()

                tasks.append(loop.create_task(self.elector.run(started, stopped), name="leader"))
                tasks.append(loop.create_task(self._read_ahead(self.elector), name="read-ahead"))
            else:
                self.leading.set()
                self._wake.set()  # the first step now, not at the loop's next timeout
            if self.config.explain.enabled and self.config.explain.estimate_interval_seconds > 0:
                tasks.append(loop.create_task(self._estimate(), name="estimates"))
            loop_task = loop.create_task(self._loop(), name="cycle")
            stopping = loop.create_task(self._stopping.wait(), name="stopping")
            tasks.append(stopping)
            # every task runs until the replica stops; one that ends before (the loop on a
            # broken invariant, a watch, a writer) stops it as a failure
            done, _ = await asyncio.wait({loop_task, *tasks}, return_when=asyncio.FIRST_COMPLETED)
            if not self._stopping.is_set():
                ended = next(iter(done))
                error = None if ended.cancelled() else ended.exception()
                self._fail(error or RuntimeError(f"task {ended.get_name()} ended"))
            with contextlib.suppress(Exception):
                await loop_task
        finally:
            self.ready = False
            self.leading.clear()
            if self.lease_lost:
                self._abandon()
            elif self.elector is not None:
                await self._hand_over(self.elector)
            else:
                await self._drain()
            # what the waits above left in flight ends now, not against a closed client
            for writer in (self.binder, self.evictor, self.cleanups):
                await writer.cancel()
            for t in tasks + self._tasks:
                t.cancel()
            await asyncio.gather(*tasks, *self._tasks, return_exceptions=True)
            for r in runners:
                await r.cleanup()
            plain.close()
        if self._failure is not None:
            raise SchedulerFailed(str(self._failure)) from self._failure


    def views_address(self) -> str:
        """host:port the views are served on: ``explain.address``, else the metrics
        address's host on any free port."""
        given = self.config.explain.address
        return given or f"{self.config.metrics_address.rpartition(':')[0]}:0"

    async def _serve_views(self) -> web.AppRunner:
        """The certificate (from files, else made now for the names this replica answers
        to), then the HTTPS listener of the views."""
        ex = self.config.explain
        if ex.tls.cert_file:
            self.tls = ServingTls.from_files(ex.tls.cert_file, ex.tls.key_file, ex.tls.ca_file)
        else:
            self.tls = ServingTls.self_signed(serving_names(
                bind_host=self.views_address().rpartition(":")[0], advertise=ex.advertise_address,
                extra=[ex.tls.server_name] if ex.tls.server_name else []))
        runner, self.views_port = await serve_views(
            self.views_address(), self.tls.context, auth=RequestAuth(self.client),
            snapshot=(lambda: take_snapshot(self.client, self.config.document())) if self.config.debug_snapshot else None,
            views=self.views if ex.enabled else None,
        )
        return runner

    def _lease_annotations(self) -> dict[str, str] | None:
        """Where the views are and the CA that signed their certificate, for the Lease."""
        if not self.config.explain.enabled or self.tls is None:
            return None
        # the server name written empty too: the Lease keeps the annotations a previous
        # holder wrote, and a name this replica's certificate lacks must not outlive it
        return {ENDPOINT_ANNOTATION: self.advertised(), CA_ANNOTATION: self.tls.ca_pem,
                SERVER_NAME_ANNOTATION: self.config.explain.tls.server_name}

    async def _reload_certificate(self) -> None:
        """A certificate from files is read again when they change (cert-manager renews the
        Secret, the kubelet updates the mounted files); the CA on the Lease follows."""
        while True:
            await asyncio.sleep(CERTIFICATE_CHECK_SECONDS)
            assert self.tls is not None
            try:
                changed = self.tls.reload()
            except CertificateError as exc:
                log.warning("the views' certificate was not replaced: %s", exc)
                continue
            if changed:
                log.info("the views' certificate was read again from %s", self.config.explain.tls.cert_file)
                if self.elector is not None and self.config.explain.enabled:
                    self.elector.annotations[CA_ANNOTATION] = self.tls.ca_pem

    def advertised(self) -> str:
        """Where `batchsched explain` reaches this replica (written on the Lease it holds)."""
        given = self.config.explain.advertise_address
        if given:
            return given
        host = self.views_address().rpartition(":")[0].strip("[]")
        if host in ("", "0.0.0.0", "::"):
            host = os.environ.get("POD_IP") or socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"https://{host}:{self.views_port}"

    async def _estimate(self) -> None:
        """Start estimates now and then while leading, so their error is measured even when
        nobody asks (a failed run is logged, not fatal: it decides nothing)."""
        while True:
            await asyncio.sleep(self.config.explain.estimate_interval_seconds)
            if not self.leading.is_set():
                continue
            try:
                await self.views.fresh(wait=True)
            except Exception:
                log.exception("start estimates failed")

    async def _catch_up(self) -> None:
        """A new leader's first step waits until its mirror holds every write the previous
        holder of the Lease made: each collection a leader writes that was last listed
        before that holder's writes could have ended (:attr:`LeaderElector.predecessor_until`)
        is listed again. A standby's watches may lag (a loaded machine, watches backing off
        after an apiserver outage), and a Binding the previous leader made that the mirror
        has not seen would have its room handed out twice. A replica that starts after its
        predecessor's writes ended (a restart after a crash), or a standby that read ahead
        (:meth:`_read_ahead`), listed them after that moment and starts at once."""
        until = self.elector.predecessor_until if self.elector is not None else 0.0
        await self._list_written_before(until, "before leading")
        if self.fence.is_open() and not self._stopping.is_set():
            self.leading.set()
            self._wake.set()

    async def _read_ahead(self, elector: LeaderElector) -> None:
        """While standing by: once the holder of the Lease has gone without a renewal past
        the moment its writes end (its fence, a few seconds before its lease lapses: it
        died, or is cut off), list again the collections a leader writes. Done before the
        lapse, that list is what taking over would otherwise wait for. A live holder renews
        every retry period and never comes near that moment."""
        while not elector.is_leader:
            await asyncio.sleep(READ_AHEAD_POLL_SECONDS)
            ends = elector.holder_writes_end
            if ends and time.time() >= ends + CATCH_UP_MARGIN_SECONDS and not elector.is_leader:
                await self._list_written_before(ends, "while the leader is silent")
        await self._stopping.wait()

    async def _list_written_before(self, until: float, when: str) -> None:
        """List again each collection a leader writes last listed before ``until`` (plus
        the margin); one such catch-up at a time, so a new leader waits for one begun
        while it stood by rather than starting another."""
        async with self._relisting:
            stale = [r for r in self.reflectors if r.name in LEADER_WRITES
                     and max(r.listed_at, self._read_at.get(r.name, 0.0)) <= until + CATCH_UP_MARGIN_SECONDS]
            if not stale:
                return
            t0, began = time.monotonic(), time.time()
            current = await asyncio.gather(*(self._watch_shows_current(r) for r in stale))
            relisted = [r for r, ok in zip(stale, current, strict=True) if not ok]
            await asyncio.gather(*(r.relist() for r in relisted))
            # as fresh as a list begun then, including a collection the cluster does not
            # serve (its relist returns at once: there was nothing to read)
            self._read_at.update((r.name, began) for r in stale)
            log.info("%s read %d collections again %s (%.1f s): %d shown current by their watches, %d listed",
                     self.identity, len(stale), when, time.monotonic() - t0, len(stale) - len(relisted),
                     len(relisted))

    async def _watch_shows_current(self, r: Reflector) -> bool:
        """True once ``r``'s mirror holds every write to its collection committed before
        now, shown without listing it again (a list of every pod takes seconds at scale).

        A consistent read of one item gives the collection's resourceVersion now, R
        (resourceVersions of one resource type compare as integers since Kubernetes 1.35).
        A short watch from the mirror's resourceVersion replays what came since, up to an
        event or the bookmark the apiserver sends before the watch ends, at or past R; the
        reflector's own watch carries the same events, in the same order, so once it has
        applied the last of them that precedes R, the mirror is as current as a list made
        now. False (list it again) when anything is not as expected: a resourceVersion
        that is not an integer, an error, no bookmark before the watch ends, a reflector
        that does not catch up within the watch's time."""
        start = r.resource_version
        if not start.isdigit():  # never listed (not served, not allowed): its relist returns at once
            return False
        needed = int(start)
        try:
            async with asyncio.timeout(PROBE_WATCH_SECONDS + 2):
                page = await self.client.request("GET", r.path, params={**r.params, "limit": 1}, timeout=10)
                now_rv = int((page.get("metadata") or {})["resourceVersion"])
                if needed < now_rv:
                    async for _, obj in self.client.watch(r.path, start, timeout_seconds=PROBE_WATCH_SECONDS,
                                                          **r.params):
                        rv = int((obj.get("metadata") or {})["resourceVersion"])
                        if rv >= now_rv:
                            break
                        needed = max(needed, rv)
                    else:
                        return False  # the watch ended before it reached R
                while int(r.resource_version) < needed:
                    await asyncio.sleep(0.01)
                return True
        except (KubeError, TimeoutError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.info("%s: the watch could not show it current (%s); listing it again", r.name, exc)
            return False

    async def _drain(self) -> None:
        """A graceful stop without leader election: let what is queued and in flight finish."""
        if not await self.binder.drain(10.0):
            log.warning("shutting down with %d bindings in flight", self.binder.in_flight)
        if not await self.evictor.drain(5.0):
            log.warning("shutting down with %d evictions in flight", self.evictor.in_flight)
        await self.group_status.drain(5.0)
        await self.queue_status.drain(5.0)
        with contextlib.suppress(TimeoutError):  # the latest mix, for the replica that starts next
            await asyncio.wait_for(self.mix_store.write(), 5.0)
        if self.fence.is_open():  # a standby's reports wait for it to lead: none will be sent
            await self.status.drain(5.0)

    async def _hand_over(self, elector: LeaderElector) -> None:
        """A graceful stop under leader election: the Lease is given up as soon as what
        was sent has landed, so a standby leads within its retry period. The workload mix
        is saved (one write, for the replica that starts next); then the fence closes, so
        what is queued (Bindings, evictions, reports) is never sent: the next leader
        decides and tells again from what it reads. What is in flight lands before the
        Lease is released, so the next leader's mirror holds it."""
        if self.fence.is_open():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.mix_store.write(), 5.0)

        async def settle() -> None:
            if not await self.binder.drain(10.0):
                log.warning("giving the lease up with %d bindings in flight", self.binder.in_flight)
            if not await self.evictor.drain(5.0):
                log.warning("giving the lease up with %d evictions in flight", self.evictor.in_flight)

        dropped = self.status.pending + self.group_status.pending + self.queue_status.pending
        self._handing_over = True
        with contextlib.suppress(Exception):
            await elector.release(settle=settle)
        log.info("%s handed over: %d bindings and %d evictions left to the next leader, %d status writes not sent",
                 self.identity, self.binder.fenced, self.evictor.fenced, dropped)

    def _abandon(self) -> None:
        """The lease was lost: the fence is closed, so nothing queued will be sent; what is
        in flight was sent before the deadline. Nothing is waited for."""
        log.warning(
            "%s: not sending %d bindings, %d evictions and %d status writes still queued or in flight; "
            "%d bindings and %d evictions were held back by the lease deadline",
            self.identity, self.binder.in_flight, self.evictor.in_flight,
            self.status.pending + self.group_status.pending + self.queue_status.pending,
            self.binder.fenced, self.evictor.fenced,
        )


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
    except (KubeError, OSError, SchedulerFailed, CertificateError) as exc:
        print(f"batchsched: error: {exc}", file=__import__("sys").stderr)
        return 1
    return 0
