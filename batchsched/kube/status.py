"""Events and pod conditions: what the user sees of our decisions, written off the hot path.

The scheduling cycle must never wait on the API server to say why a pod is pending, and a
pod that stays unschedulable for an hour must not cost a write per cycle. So the cycle
calls :class:`StatusWriter` methods, which only enqueue; a fixed number of workers
(``concurrency``, the write budget) drain the queue in :meth:`StatusWriter.run`.

Coalescing:

- An unschedulable pod is written (a ``FailedScheduling`` Event and its ``PodScheduled``
  condition) only when its message changes: the last message written or queued is
  remembered per pod UID until the pod is scheduled or forgotten.
- Condition patches are kept per UID, latest wins: a newer message replaces one still
  waiting, and two patches of one pod are never in flight together, so an older message
  cannot land after a newer one.
- Every patch carries the pod's UID as a precondition, so it cannot reach a pod recreated
  under the same name; such a write fails with a conflict and is dropped.

A burst (the first step over a large backlog tells every waiting pod why it waits) is not
queued whole: once the queue holds half of ``max_queue``, what pods are told waits in a
book of its own (latest message per pod, oldest pod first) and is fed to the queue as it
drains, so the scheduler's step hands over 100,000 conditions in a tenth of the time it
took to queue them, no Event is dropped for a full queue, and a pod bound or gone before
its turn is never told. How long a pod waits to be told is then what the API server's write
rate makes it: the book's size over the writes per second (:attr:`StatusWriter.owed`).

The queue itself (latest wins, one write in flight per key, draining) is a
:class:`~batchsched.kube.coalesce.CoalescingWriter`; Events go through it too, each under a
key of its own, so they are never coalesced.

An Event must name its object exactly, uid included, for ``kubectl describe`` to show it.
Kueue's Workload, where Events about a Kueue pod group go, is the one object named in an
Event that batchsched does not watch: its uid is read when such an Event is written
(:data:`READ_UID`); a Workload not there (yet) gets the Event without it.

Failures: a pod (or namespace) that is gone - 404, 409 - drops the write; temporary errors
are retried under :func:`~batchsched.kube.retry.status_writes`, and still failing, kept and tried again later;
anything else is logged and dropped. Nothing here raises into the scheduler.

Every write here is made for the leader: each attempt first checks the replica's
:class:`~batchsched.kube.leader.Fence`, and a write whose fence has passed is kept unsent
and tried again later (the scheduler, having decided it, does not ask again).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from batchsched.core.plan import ObjectRef
from batchsched.kube.api import JSON, KubeAPI
from batchsched.kube.coalesce import CoalescingWriter, WriteLater
from batchsched.kube.errors import PermanentError
from batchsched.kube.leader import Fence, Fenced
from batchsched.kube.retry import status_writes, try_write

__all__ = ["ObjectRef", "StatusWriter"]

log = logging.getLogger("batchsched.status")

MESSAGE_LIMIT = 1024
#: owed conditions moved to the queue at once, at most; and the pause while it has no room
FEED_CHUNK = 500
FEED_PAUSE = 0.05
_NAME_LIMIT = 253
_INSTANCE_LIMIT = 128
_EVENT_TYPES = ("Normal", "Warning")
#: Events dropped on a full queue are logged at most this often, with their count (a burst
#: of Bindings drops thousands a second: one line each buried the log)
DROP_LOG_SECONDS = 10.0
#: kinds of object Events are written about whose uid batchsched does not know, to their
#: resource names: the uid is read when the Event is written
READ_UID = {"Workload": "workloads"}




def rfc3339(ts: float) -> str:
    """A ``metav1.Time`` string (whole seconds, UTC) for a Unix time."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class _EventWrite:
    namespace: str
    body: JSON


@dataclass(frozen=True, slots=True)
class _Condition:
    """A pod's ``PodScheduled=False`` condition; two are the same when reason and message are."""

    ref: ObjectRef = field(compare=False)
    reason: str
    message: str
    since: float = field(compare=False)


@dataclass(frozen=True, slots=True)
class _Nominated:
    """A pod's ``status.nominatedNodeName`` ("" clears it)."""

    ref: ObjectRef = field(compare=False)
    node: str


#: a pod UID (its condition), ("event", the Event's name) or ("nominated", a pod UID)
_Key = str | tuple[str, str]


class StatusWriter:
    """Queue Events and pod conditions; :meth:`run` writes them with bounded concurrency.

    ``written`` counts successful writes, ``dropped`` writes given up (the object is gone,
    the server refused, or the queue was full), ``pending`` writes queued or in flight
    (writes put off by the fence or by temporary errors wait for their next try apart).
    ``retry`` is the policy each write is retried under; ``fence`` is checked before each
    attempt (always open when not given).
    """

    def __init__(
        self,
        client: KubeAPI,
        *,
        component: str = "batchsched",
        instance: str,
        concurrency: int = 16,
        max_queue: int = 10_000,
        clock: Callable[[], float] = time.time,
        fence: Fence | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.fence = fence if fence is not None else Fence.always_open()
        self.component = component
        self.instance = instance[:_INSTANCE_LIMIT]
        self.concurrency = concurrency
        self.max_queue = max_queue
        self.retry = status_writes()
        self._clock = clock
        self._writes: CoalescingWriter[_Key, _EventWrite | _Condition | _Nominated] = CoalescingWriter(
            write=self._write, concurrency=concurrency, name="status-writer"
        )
        self._refused = 0  # Events not queued: the queue was full
        self._refused_logged = 0  # of which already logged
        self._refused_log_at = float("-inf")  # when they last were (monotonic)
        #: conditions told while the queue held ``room`` writes: uid -> the latest, oldest first
        self._owed: OrderedDict[str, _Condition] = OrderedDict()
        self._owed_added = asyncio.Event()
        #: writes queued beyond which what pods are told waits in :attr:`_owed`
        self.room = max(1, max_queue // 2)

    @property
    def pending(self) -> int:
        """Writes queued or in flight, and conditions owed (not queued yet)."""
        return self._writes.pending + len(self._owed)

    @property
    def owed(self) -> int:
        """Pods told why they wait whose condition is not queued yet (a burst beyond the
        queue's room)."""
        return len(self._owed)

    @property
    def written(self) -> int:
        return self._writes.written

    @property
    def dropped(self) -> int:
        return self._writes.dropped + self._refused

    @property
    def put_off(self) -> int:
        """Writes put off (the fence had passed, or temporary errors outlasted the retries)."""
        return self._writes.put_off

    # -- what the scheduler calls (never blocks) ------------------------------------------

    def event(self, ref: ObjectRef, *, type: str, reason: str, message: str) -> None:
        """Queue a core/v1 Event about ``ref``."""
        if type not in _EVENT_TYPES:
            raise ValueError(f"an Event's type is Normal or Warning, not {type!r}")
        if self._writes.queued >= self.max_queue:
            self._refused += 1
            at = time.monotonic()
            if at - self._refused_log_at >= DROP_LOG_SECONDS:
                log.warning("status queue full (%d writes): dropped %d Events since the last report, the last %s "
                            "about %s", self.max_queue, self._refused - self._refused_logged, reason, ref.name)
                self._refused_logged, self._refused_log_at = self._refused, at
            return
        namespace = ref.namespace or "default"
        now = rfc3339(self._clock())
        involved: JSON = {"kind": ref.kind, "apiVersion": ref.api_version, "name": ref.name}
        if ref.namespace:
            involved["namespace"] = ref.namespace
        if ref.uid:
            involved["uid"] = ref.uid
        name = f"{ref.name[: _NAME_LIMIT - 17]}.{secrets.token_hex(8)}"
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:MESSAGE_LIMIT],
            "type": type,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": None,
            "count": 1,
        }
        self._writes.put(("event", f"{namespace}/{name}"), _EventWrite(namespace, body))

    def pod_nominated(self, ref: ObjectRef, node: str) -> None:
        """Set (or, with "", clear) the node a preemptor's pod is nominated to, as
        kube-scheduler does: users and cluster-autoscaler read it, and a restarted
        scheduler holds the node for it again."""
        self._writes.offer(("nominated", ref.uid), _Nominated(ref, node))

    def pod_unschedulable(
        self, ref: ObjectRef, message: str, *, reason: str = "Unschedulable"
    ) -> None:
        """Say why a pod cannot be placed: an Event and its ``PodScheduled=False`` condition.

        Nothing is written when the message (and reason) are those last written or queued
        for this pod.
        """
        condition = _Condition(ref, reason, message[:MESSAGE_LIMIT], since=self._clock())
        if self._owed or self._writes.queued >= self.room:
            self._owed[ref.uid] = condition  # latest wins; its place in line kept
            self._owed_added.set()
            return
        self._offer(condition)

    def _offer(self, condition: _Condition) -> None:
        """Queue a condition, and its Event when it says something new."""
        if self._writes.offer(condition.ref.uid, condition):
            self.event(condition.ref, type="Warning", reason="FailedScheduling", message=condition.message)

    def pod_scheduled(self, ref: ObjectRef, node: str, *, where: str = "") -> None:
        """Record that a pod was bound: a ``Scheduled`` Event (saying the topology domain
        its gang was placed in, ``where``, when there is one); its unschedulable state is
        forgotten (and a condition patch still waiting is dropped)."""
        self.forget(ref.uid)
        within = f" within {where}, with its gang" if where else ""
        self.event(
            ref,
            type="Normal",
            reason="Scheduled",
            message=f"Successfully assigned {ref.namespace}/{ref.name} to {node}{within}",
        )

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a pod (it was deleted or scheduled)."""
        self._writes.forget(uid)
        self._writes.forget(("nominated", uid))
        self._owed.pop(uid, None)

    # -- the writers --------------------------------------------------------------------

    async def run(self) -> None:
        """Write until cancelled, with ``concurrency`` workers, from the time this replica
        first leads (:meth:`~batchsched.kube.leader.Fence.led`): a standby keeps what it
        was asked to write (coalesced per object) instead of dropping it at its fence."""
        await self.fence.led()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._writes.run())
            tasks.create_task(self._feed())

    async def _feed(self) -> None:
        """Move owed conditions to the queue as it drains below its room, a chunk at a
        time, letting the event loop run between chunks."""
        while True:
            await self._owed_added.wait()
            while self._owed:
                free = self.room - self._writes.queued
                if free <= 0:
                    await asyncio.sleep(FEED_PAUSE)
                    continue
                for _ in range(min(free, FEED_CHUNK, len(self._owed))):
                    self._offer(self._owed.popitem(last=False)[1])
                await asyncio.sleep(0)
            self._owed_added.clear()

    async def drain(self, timeout: float) -> bool:
        """Wait until nothing is owed, queued or in flight; False if something still was
        after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        try:
            async with asyncio.timeout(timeout):
                while self._owed:
                    await asyncio.sleep(FEED_PAUSE)
        except TimeoutError:
            return False
        return await self._writes.drain(max(0.0, until - loop.time()))

    async def _write(self, key: _Key, item: _EventWrite | _Condition | _Nominated) -> bool:
        try:
            return await self._send(item)
        except Fenced as exc:
            log.debug("%s", exc)
            raise WriteLater(str(exc)) from exc

    async def _send(self, item: _EventWrite | _Condition | _Nominated) -> bool:
        fence = self.fence
        if isinstance(item, _Nominated):
            pod = item.ref
            body: JSON = {"metadata": {"uid": pod.uid}, "status": {"nominatedNodeName": item.node or None}}
            what = f"nominated node of pod {pod.namespace}/{pod.name}"
            return await try_write(
                self.retry,
                fence.guard(lambda: self.client.patch(
                    f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status", body, kind="merge",
                ), what=what),
                what=what,
            )
        if isinstance(item, _EventWrite):
            path = f"/api/v1/namespaces/{item.namespace}/events"
            what = f"event {item.body['reason']} about {item.body['involvedObject']['name']}"

            async def create() -> JSON:
                return await self.client.create(path, await self._identified(item.body))

            return await try_write(self.retry, fence.guard(create, what=what), what=what)
        return await self._condition(item)

    async def _identified(self, body: JSON) -> JSON:
        """The Event ``body`` with its object's uid, read now when it has none and is of a
        kind in :data:`READ_UID`; unchanged when the object cannot be read (gone, not yet
        made, or not readable under the scheduler's role)."""
        involved = body["involvedObject"]
        resource = READ_UID.get(involved["kind"])
        if resource is None or involved.get("uid") or not involved.get("namespace"):
            return body
        where = f"/apis/{involved['apiVersion']}/namespaces/{involved['namespace']}/{resource}/{involved['name']}"
        try:
            obj = await self.client.get(where)
        except PermanentError as exc:  # temporary errors: the Event's write is tried again
            log.debug("event about %s %s sent without its uid: %s", involved["kind"], involved["name"], exc)
            return body
        uid = (obj.get("metadata") or {}).get("uid")
        return {**body, "involvedObject": {**involved, "uid": uid}} if isinstance(uid, str) and uid else body

    async def _condition(self, item: _Condition) -> bool:
        ref = item.ref
        patch: JSON = {"metadata": {"uid": ref.uid}, "status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": item.reason,
            "message": item.message,
            "lastProbeTime": None,
            "lastTransitionTime": rfc3339(item.since),
        }]}}
        path = f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}/status"
        what = f"condition of pod {ref.namespace}/{ref.name}"
        return await try_write(
            self.retry,
            self.fence.guard(lambda: self.client.patch(path, patch, kind="strategic"), what=what),
            what=what,
            gone=lambda: self.forget(ref.uid),
        )
