"""The harness's own witness: watches of everything the checks judge, in a thread of its own.

A :class:`Recorder` runs an event loop in a background thread with its own client (the
sandbox's admin kubeconfig, never through the fault proxy), so neither a blocked harness
nor a fault aimed at batchsched's connections delays or hides what it sees. It keeps a
:class:`~perf.chaos.checks.Mirror`: the world's pods by uid (each node a uid was ever seen
bound to, first-seen times, deletion, finish, ``PodScheduled=False``), the pool's nodes
(created, deleted, cordoned or tainted spans), PodGroups (of each API the world writes
gangs in), Queues and the Events about pods.
Each watch lists, then watches, and lists again when it fails (a pod that vanished between
two lists is recorded as gone when the relist shows it missing). Every second, and at most
five times a second on changes, it samples a :class:`~perf.chaos.checks.Checker`.

Times are ``time.time()`` when the recorder saw the change: a bind's time is when the watch
delivered it, a little after the apiserver stored it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ExpiredError, KubeError
from perf.chaos.checks import (
    GROUP_APIS,
    JOB_LABEL,
    MEMBER_LABEL,
    QUEUE_LABEL,
    WORLD_LABEL,
    Checker,
    Limits,
    Mirror,
    NodeRecord,
    PodRecord,
    Verdict,
    api_of,
    group_of,
    node_closed,
    podgroups_path,
)

QUEUES = "/apis/batchsched.io/v1alpha1/queues"
SANDBOX_LABEL = "batchsched.io/sandbox-node"


def _pod_scheduled_false(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               for c in (pod.get("status") or {}).get("conditions") or [])


class Recorder:
    """See the module docstring. :meth:`start` and :meth:`stop` from the harness's thread."""

    def __init__(self, kubeconfig: str, *, namespace: str, pool: str, gpus_per_node: int = 8,
                 limits: Limits | None = None, group_apis: tuple[str, ...] = tuple(GROUP_APIS)) -> None:
        self.kubeconfig = kubeconfig
        #: the PodGroup APIs watched (those the cluster serves)
        self.group_apis = group_apis
        self.namespace = namespace
        self.pool = pool
        self.m = Mirror(gpus_per_node=gpus_per_node)
        self.checker = Checker(limits)
        self.lock = threading.RLock()
        #: the world's jobs (read only, for reports)
        self.jobs: dict[str, Any] = {}
        self.relists: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None
        self._synced_names: set[str] = set()
        self._watches = 0

    # -- the thread --------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="chaos-recorder", daemon=True)
        self._thread.start()
        if not self.synced.wait(timeout):
            raise RuntimeError(f"the recorder's watches did not sync within {timeout:.0f} s")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        client = await KubeClient.connect(self.kubeconfig, max_connections=16)
        ns = self.namespace
        watches: list[tuple[str, str, dict[str, str], Callable[[list[dict[str, Any]], float], None],
                            Callable[[str, dict[str, Any], float], None]]] = [
            ("pods", f"/api/v1/namespaces/{ns}/pods", {}, self._pods_listed, self._pod_event),
            ("nodes", "/api/v1/nodes", {"labelSelector": f"{SANDBOX_LABEL}={self.pool}"}, self._nodes_listed, self._node_event),
            *((f"groups.{api}", podgroups_path(api, ns), {}, functools.partial(self._groups_listed, api),
               self._group_event) for api in self.group_apis),
            ("queues", QUEUES, {"labelSelector": f"{WORLD_LABEL}={ns}"}, self._queues_listed, self._queue_event),
            ("events", f"/api/v1/namespaces/{ns}/events", {"fieldSelector": "involvedObject.kind=Pod"},
             self._events_listed, self._event_event),
        ]
        self._watches = len(watches)
        tasks = [asyncio.create_task(self._mirror(client, *w)) for w in watches]
        tasks.append(asyncio.create_task(self._sampler()))
        try:
            await self._stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
            await client.close()

    async def _mirror(self, client: KubeClient, name: str, path: str, params: dict[str, str],
                      listed: Callable[[list[dict[str, Any]], float], None],
                      event: Callable[[str, dict[str, Any], float], None]) -> None:
        rv = ""
        while True:
            try:
                if not rv:
                    items, rv = await client.list(path, **params)
                    with self.lock:
                        listed(items, time.time())
                    self.relists[name] = self.relists.get(name, 0) + 1
                    self._synced_names.add(name)
                    if len(self._synced_names) == self._watches:
                        self.synced.set()
                    self._poke()
                async for etype, obj in client.watch(path, rv, timeout_seconds=60, **params):
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if etype == "BOOKMARK":
                        continue
                    with self.lock:
                        event(etype, obj, time.time())
                    self._poke()
            except asyncio.CancelledError:
                raise
            except ExpiredError:
                rv = ""
            except KubeError:
                self.errors[name] = self.errors.get(name, 0) + 1
                await asyncio.sleep(0.3)
            except Exception:  # a malformed object must not blind the witness
                self.errors[name] = self.errors.get(name, 0) + 1
                rv = ""
                await asyncio.sleep(0.3)

    def _poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _sampler(self) -> None:
        assert self._changed is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0)
            self._changed.clear()
            with self.lock:
                self.checker.sample(self.m, time.time())
            await asyncio.sleep(0.2)

    # -- pods ---------------------------------------------------------------------------

    def _pods_listed(self, items: list[dict[str, Any]], now: float) -> None:
        seen = set()
        for obj in items:
            seen.add(obj["metadata"]["uid"])
            self._see_pod(obj, now)
        for uid, rec in self.m.pods.items():
            if uid not in seen and rec.gone is None:
                self._pod_gone(rec, now)

    def _pod_event(self, etype: str, obj: dict[str, Any], now: float) -> None:
        rec = self._see_pod(obj, now)
        if etype == "DELETED":
            self._pod_gone(rec, now)

    def _pod_gone(self, rec: PodRecord, now: float) -> None:
        rec.gone = now
        if rec.binds:
            self.m.last_change = now

    def _see_pod(self, obj: dict[str, Any], now: float) -> PodRecord:
        meta = obj["metadata"]
        uid = meta["uid"]
        rec = self.m.pods.get(uid)
        labels = meta.get("labels") or {}
        if rec is None:
            rec = PodRecord(uid=uid, name=meta["name"], job=labels.get(JOB_LABEL, meta["name"]),
                            member=labels.get(MEMBER_LABEL, meta["name"]), group=group_of(obj),
                            queue=labels.get(QUEUE_LABEL), created=now, obj=obj)
            self.m.pods[uid] = rec
        rec.obj = obj
        node = (obj.get("spec") or {}).get("nodeName")
        if node and all(n != node for _, n in rec.binds):
            rec.binds.append((now, node))
            self.m.last_change = now
        if meta.get("deletionTimestamp") and rec.deleting is None:
            rec.deleting = now
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed") and rec.finished is None:
            rec.finished = now
        if rec.told is None and _pod_scheduled_false(obj):
            rec.told = now
        return rec

    # -- nodes ----------------------------------------------------------------------------

    def _nodes_listed(self, items: list[dict[str, Any]], now: float) -> None:
        seen = set()
        for obj in items:
            seen.add(obj["metadata"]["name"])
            self._see_node(obj, now)
        for name, rec in self.m.nodes.items():
            if name not in seen and rec.deleted is None:
                self._node_gone(rec, now)

    def _node_event(self, etype: str, obj: dict[str, Any], now: float) -> None:
        rec = self._see_node(obj, now)
        if etype == "DELETED":
            self._node_gone(rec, now)

    def _node_gone(self, rec: NodeRecord, now: float) -> None:
        rec.deleted = now
        spans = self.m.node_spans.setdefault(rec.name, [])
        if spans and spans[-1][1] is None:
            spans[-1] = (spans[-1][0], now)

    def _see_node(self, obj: dict[str, Any], now: float) -> NodeRecord:
        name = obj["metadata"]["name"]
        rec = self.m.nodes.get(name)
        uid = obj["metadata"].get("uid")
        if rec is None or (rec.deleted is not None and rec.obj["metadata"].get("uid") != uid):
            rec = NodeRecord(name=name, created=now, obj=obj)
            self.m.nodes[name] = rec
            self.m.node_spans.setdefault(name, []).append((now, None))
        rec.obj = obj
        closed = node_closed(obj)
        spans = rec.closed_spans
        if closed and (not spans or spans[-1][1] is not None):
            spans.append((now, None))
        elif not closed and spans and spans[-1][1] is None:
            spans[-1] = (spans[-1][0], now)
        return rec

    # -- groups, queues, events -------------------------------------------------------------------

    def _groups_listed(self, api: str, items: list[dict[str, Any]], now: float) -> None:
        """``api``'s PodGroups listed: they replace those of that API (the world's job
        names are unique, so one mapping by name holds both APIs)."""
        version = GROUP_APIS[api].removeprefix("/apis/")
        for o in items:
            o.setdefault("apiVersion", version)  # a built-in type's list items carry none
        self.m.groups = {n: o for n, o in self.m.groups.items() if api_of(o) != api}
        self.m.groups.update((o["metadata"]["name"], o) for o in items)

    def _group_event(self, etype: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            self.m.groups.pop(name, None)
        else:
            self.m.groups[name] = obj

    def _queues_listed(self, items: list[dict[str, Any]], now: float) -> None:
        self.m.queues = {o["metadata"]["name"]: o for o in items}

    def _queue_event(self, etype: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            self.m.queues.pop(name, None)
        else:
            self.m.queues[name] = obj

    def _events_listed(self, items: list[dict[str, Any]], now: float) -> None:
        for obj in items:
            self._event_event("ADDED", obj, now)

    def _event_event(self, etype: str, obj: dict[str, Any], now: float) -> None:
        if etype == "DELETED":
            return
        inv = obj.get("involvedObject") or {}
        if obj.get("reason") in ("FailedScheduling", "Unschedulable", "Preempted", "Waiting"):
            key = inv.get("uid") or inv.get("name") or ""
            self.m.told_by_event.setdefault(key, now)

    # -- for the harness --------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[Mirror]:
        with self.lock:
            yield self.m

    def mirror(self) -> Mirror:
        """The mirror itself: read it under :meth:`locked` when the read must be consistent."""
        return self.m

    def outage(self, start: float, end: float | None) -> None:
        """The control plane was down from ``start`` to ``end`` (None: still down)."""
        with self.lock:
            spans = self.m.outages
            if spans and spans[-1][0] == start:
                spans[-1] = (start, end)
            else:
                spans.append((start, end))

    def retire(self, job: str) -> None:
        with self.lock:
            self.m.retired.setdefault(job, time.time())

    def bound_now(self) -> dict[str, str]:
        """Pod name -> node, for every pod that exists, is bound and is not being deleted."""
        with self.lock:
            return {p.name: p.node for p in self.m.pods.values() if p.live and p.node}

    def member_of(self, pod: str) -> str:
        """The job member a pod plays (its own name when the recorder has not seen it)."""
        with self.lock:
            for rec in self.m.pods.values():
                if rec.name == pod:
                    return rec.member
        return pod

    def pods_now(self) -> list[PodRecord]:
        with self.lock:
            return [p for p in self.m.pods.values() if p.gone is None]

    def verdict(self) -> Verdict:
        with self.lock:
            self.checker.sample(self.m, time.time())
            v = self.checker.verdict
            out = Verdict(samples=v.samples, partial_seconds=dict(v.partial_seconds))
            for kind, items in v.findings.items():
                out.findings[kind] = dict(items)
            return out
