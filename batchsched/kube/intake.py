"""The watches that feed the scheduling session.

Each collection batchsched mirrors is listed and watched (:class:`~batchsched.kube.watch.Reflector`);
its objects are parsed one by one and handed to the session's event intake. Two kinds of
failure are told apart:

- an object that cannot be read (a field of the wrong type, an unreadable value) is
  reported (a Warning Event on it, once per error) and skipped: one bad object never stops
  a watch;
- an error inside the session's intake means its books may be half-updated: the replica
  is stopped (``on_failure``) rather than left running on a broken mirror.

Deleted objects are also forgotten by the status writers here, so a recreated object with
the same name is written afresh.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from batchsched import procmem
from batchsched.core import explain
from batchsched.core.disruption import parse_pdb
from batchsched.core.dra.objects import (
    parse_device_class,
    parse_device_taint_rule,
    parse_resource_claim,
    parse_resource_slice,
)
from batchsched.core.gangs import K8S, VOLCANO, XK8S, PodGroup, parse_podgroup
from batchsched.core.model import Pod, parse_node, parse_pod, parse_priority_class
from batchsched.core.plan import ObjectRef
from batchsched.core.session import Session
from batchsched.core.volumes import parse_claim, parse_storage_class, parse_volume
from batchsched.kube.api import KubeAPI
from batchsched.kube.groupstatus import GroupStatusWriter
from batchsched.kube.queuestatus import QUEUES_PATH, QueueStatusWriter
from batchsched.kube.status import StatusWriter
from batchsched.kube.watch import Reflector
from batchsched.metrics import Metrics

__all__ = ["PODGROUP_PATHS", "Intake"]

log = logging.getLogger("batchsched")

PODGROUP_PATHS = {
    XK8S: "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
    VOLCANO: "/apis/scheduling.volcano.sh/v1beta1/podgroups",
    K8S: "/apis/scheduling.k8s.io/v1beta1/podgroups",  # Kubernetes 1.36+ (beta API, off by default)
}

#: dynamic resource allocation (GA in Kubernetes 1.34)
DRA_API = "/apis/resource.k8s.io/v1"


def _named(obj: dict[str, Any]) -> dict[str, Any]:
    """An object the session reads itself (Queues, Namespaces): only its name is checked."""
    if not isinstance(obj.get("metadata"), dict) or not isinstance(obj["metadata"].get("name"), str):
        raise ValueError("it has no metadata.name")
    return obj


class Intake:
    """The reflectors of every collection, wired to ``session``."""

    def __init__(
        self,
        client: KubeAPI,
        session: Session,
        *,
        status: StatusWriter,
        group_status: GroupStatusWriter,
        queue_status: QueueStatusWriter,
        metrics: Metrics,
        on_change: Callable[[], None],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.client, self.session, self.metrics = client, session, metrics
        self.status, self.group_status, self.queue_status = status, group_status, queue_status
        self.on_change, self.on_failure = on_change, on_failure
        #: uid -> the error last told about an object that could not be read
        self._told: dict[str, str] = {}
        s = session
        self._schedulers = frozenset(s.settings.scheduler_names)
        self.reflectors = [
            self._feed("/api/v1/nodes", "nodes", "Node", parse_node, s.on_nodes_listed, s.on_node),
            self._feed("/api/v1/pods", "pods", "Pod", self._parse_pod, s.on_pods_listed, self._pod),
            self._feed("/apis/scheduling.k8s.io/v1/priorityclasses", "priorityclasses", "PriorityClass",
                       parse_priority_class,
                       lambda items: s.on_priority_classes_listed(
                           {pc.name: pc.value for pc in items}, [pc.name for pc in items if pc.never_preempts]),
                       lambda kind, pc: s.on_priority_class(kind, pc.name, pc.value, pc.never_preempts)),
            self._feed(QUEUES_PATH, "queues", "Queue", _named, self._queues_listed, self._queue),
            self._feed("/api/v1/namespaces", "namespaces", "Namespace", _named,
                       s.on_namespaces_listed, s.on_namespace),
            self._feed("/apis/policy/v1/poddisruptionbudgets", "poddisruptionbudgets", "PodDisruptionBudget",
                       parse_pdb, s.on_budgets_listed, s.on_budget),
            self._feed("/api/v1/persistentvolumeclaims", "persistentvolumeclaims", "PersistentVolumeClaim",
                       parse_claim, s.on_claims_listed, s.on_claim),
            self._feed("/api/v1/persistentvolumes", "persistentvolumes", "PersistentVolume",
                       parse_volume, s.on_volumes_listed, s.on_volume),
            self._feed("/apis/storage.k8s.io/v1/storageclasses", "storageclasses", "StorageClass",
                       parse_storage_class, s.on_storage_classes_listed, s.on_storage_class),
            # dynamic resource allocation: the devices drivers publish, their classes, the taints
            # administrators put on devices, the claims
            self._feed(f"{DRA_API}/resourceslices", "resourceslices", "ResourceSlice",
                       parse_resource_slice, s.on_resource_slices_listed, s.on_resource_slice),
            self._feed(f"{DRA_API}/deviceclasses", "deviceclasses", "DeviceClass",
                       parse_device_class, s.on_device_classes_listed, s.on_device_class),
            self._feed(f"{DRA_API}/devicetaintrules", "devicetaintrules", "DeviceTaintRule",
                       parse_device_taint_rule, s.on_device_taint_rules_listed, s.on_device_taint_rule),
            self._feed(f"{DRA_API}/resourceclaims", "resourceclaims", "ResourceClaim",
                       parse_resource_claim, s.on_resource_claims_listed, s.on_resource_claim),
        ]
        for api, path in PODGROUP_PATHS.items():
            self.reflectors.append(self._feed(
                path, f"podgroups.{api}", "PodGroup", partial(parse_podgroup, api),
                partial(self._groups_listed, api), self._group,
            ))

    def _parse_pod(self, obj: dict[str, Any]) -> Pod:
        return parse_pod(obj, self._schedulers)

    def _feed(
        self, path: str, name: str, kind: str, parse: Callable[[dict[str, Any]], Any],
        listed: Callable[[list[Any]], Any], event: Callable[[str, Any], Any],
    ) -> Reflector:
        def on_list(values: list[Any]) -> None:
            with procmem.collector_paused(kept=True):  # a list of every pod: the mirror, long-lived
                self.guard(listed, values)

        def on_event(etype: str, obj: dict[str, Any]) -> None:
            self.metrics.watch_events.labels(name).inc()
            value = self._parsed(kind, parse, obj)
            if value is not None:
                self.guard(event, etype, value)

        return Reflector(self.client, path, on_list=on_list, on_event=on_event, name=name,
                         read=partial(self._parsed, kind, parse))

    def _parsed(self, kind: str, parse: Callable[[dict[str, Any]], Any], obj: dict[str, Any]) -> Any:
        try:
            return parse(obj)
        except Exception as exc:  # one bad object must not stop the watch
            self._unreadable(kind, obj, exc)
            return None

    def guard(self, intake: Callable[..., Any], *args: Any) -> None:
        """Hand something to the session; an error there stops the replica."""
        try:
            intake(*args)
        except Exception as exc:
            self.on_failure(exc)
            return
        self.on_change()

    def pod(self, kind: str, obj: dict[str, Any]) -> None:
        """A pod read outside the watch (a resync): the session keeps a later version the
        watch showed meanwhile."""
        pod = self._parsed("Pod", self._parse_pod, obj)
        if pod is not None:
            self.guard(self._pod, kind, pod, True)

    def _unreadable(self, kind: str, obj: dict[str, Any], exc: Exception) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            log.warning("skipped a %s without a name: %s", kind, exc)
            return
        ref = ObjectRef.of(obj, kind=kind)
        message = explain.unreadable_object(kind, str(exc))
        if self._told.get(ref.uid) == message:
            return
        self._told[ref.uid] = message
        log.warning("%s %s/%s: %s", kind, ref.namespace, ref.name, message)
        self.status.event(ref, type="Warning", reason="Unreadable", message=message)

    # -- intake that also keeps the writers' books

    def _pod(self, kind: str, pod: Pod, read: bool = False) -> None:
        self.session.on_pod(kind, pod, read=read)
        if kind == "DELETED":
            self.status.forget(pod.uid)
            self._told.pop(pod.uid, None)

    def _groups_listed(self, api: str, groups: list[PodGroup]) -> None:
        for key in self.session.on_groups_listed(api, groups):
            self.group_status.forget(key)

    def _group(self, kind: str, group: PodGroup) -> None:
        self.session.on_podgroup(kind, group)
        if kind == "DELETED":
            self.group_status.forget(group.key)

    def _queues_listed(self, items: list[dict[str, Any]]) -> None:
        for name in self.session.on_queues_listed(items):
            self.queue_status.forget(name)

    def _queue(self, kind: str, obj: dict[str, Any]) -> None:
        self.session.on_queue(kind, obj)
        if kind == "DELETED":
            self.queue_status.forget(str(obj["metadata"]["name"]))
