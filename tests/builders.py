"""Fluent builders for the Kubernetes objects tests hand to the scheduler.

``make_pod("p").req(cpu="2", gpu=1).selector(pool="a").obj()`` is the pod as the apiserver
would return it (a JSON dict); ``.build()`` is the same pod parsed by
:func:`batchsched.core.model.parse_pod`. Nodes alike with ``make_node("n1")``, PodGroups
with ``make_group("g").min_member(8)`` (scheduler-plugins) or ``.volcano()``.

Every method returns the builder, so chains read like the object they describe. Keyword
arguments cover the common names (``gpu`` means ``nvidia.com/gpu``, ``ephemeral_storage``
``ephemeral-storage``); a mapping passed first covers names that are not identifiers:
``.label({"topology.kubernetes.io/zone": "a"}, pool="x")``. Builders are mutable: call
:meth:`copy` before branching one into two objects.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Self

from batchsched.core.gangs import (
    ANNOTATION_GROUP,
    ANNOTATION_TASK,
    LABEL_VOLCANO,
    LABEL_XK8S,
    VOLCANO,
    XK8S,
    PodGroup,
    parse_podgroup,
)
from batchsched.core.model import GPU, Node, Pod, Requirement, parse_node, parse_pod

__all__ = ["GroupBuilder", "NodeBuilder", "PodBuilder", "make_group", "make_node", "make_pod"]

Quantity = str | int | float
# A node selector requirement: ``("zone", "In", "a", "b")``, ``("gpu", "Exists")``, or a
# model Requirement.
Expr = tuple[str, ...] | Requirement

_RESOURCE_ALIASES = {"gpu": GPU, "ephemeral_storage": "ephemeral-storage"}


def _merged(mapping: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(mapping or {})
    out.update(kwargs)
    return out


def _resources(
    mapping: Mapping[str, Quantity] | None, kwargs: Mapping[str, Quantity]
) -> dict[str, str]:
    return {_RESOURCE_ALIASES.get(k, k): str(v) for k, v in _merged(mapping, kwargs).items()}


def _timestamp(when: float | str | dt.datetime) -> str:
    if isinstance(when, str):
        return when
    if not isinstance(when, dt.datetime):
        when = dt.datetime.fromtimestamp(when, tz=dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _requirement(expr: Expr) -> dict[str, Any]:
    if isinstance(expr, Requirement):
        key, op, values = expr.key, expr.operator, list(expr.values)
    else:
        if len(expr) < 2:
            raise ValueError(f"a requirement needs a key and an operator: {expr!r}")
        key, op, values = expr[0], expr[1], list(expr[2:])
    out: dict[str, Any] = {"key": key, "operator": op}
    if values:
        out["values"] = values
    return out


def _term(exprs: Sequence[Expr], fields: Sequence[Expr]) -> dict[str, Any]:
    term: dict[str, Any] = {}
    if exprs:
        term["matchExpressions"] = [_requirement(e) for e in exprs]
    if fields:
        term["matchFields"] = [_requirement(f) for f in fields]
    return term


class PodBuilder:
    """A pod with one container ``main``; ``req`` and ``limit`` shape that container."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self._uid: str | None = None
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "schedulerName": "batchsched",
                "containers": [{"name": "main", "image": "busybox", "resources": {}}],
            },
            "status": {"phase": "Pending"},
        }

    # -- helpers

    @property
    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self._obj["metadata"]
        return meta

    @property
    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._obj["spec"]
        return spec

    def _node_affinity(self) -> dict[str, Any]:
        affinity = self._spec.setdefault("affinity", {})
        node_affinity: dict[str, Any] = affinity.setdefault("nodeAffinity", {})
        return node_affinity

    def copy(self) -> PodBuilder:
        return copy.deepcopy(self)

    # -- identity and metadata

    def namespace(self, namespace: str) -> Self:
        self._meta["namespace"] = namespace
        return self

    def uid(self, uid: str) -> Self:
        self._uid = uid
        return self

    def label(self, labels: Mapping[str, str] | None = None, /, **kw: str) -> Self:
        self._meta.setdefault("labels", {}).update(_merged(labels, kw))
        return self

    def annotate(self, annotations: Mapping[str, str] | None = None, /, **kw: str) -> Self:
        self._meta.setdefault("annotations", {}).update(_merged(annotations, kw))
        return self

    def created(self, when: float | str | dt.datetime) -> Self:
        """``creationTimestamp`` from epoch seconds, a datetime or an RFC 3339 string."""
        self._meta["creationTimestamp"] = _timestamp(when)
        return self

    def deleting(self, when: float | str | dt.datetime = 0.0) -> Self:
        self._meta["deletionTimestamp"] = _timestamp(when)
        return self

    def group(self, name: str, *, via: str = "x-k8s") -> Self:
        """Member of a gang: ``via`` is ``"x-k8s"`` (the scheduler-plugins label),
        ``"volcano"`` (Volcano's label) or ``"annotation"`` (``scheduling.k8s.io/group-name``)."""
        if via == "x-k8s":
            return self.label({LABEL_XK8S: name})
        if via == "volcano":
            return self.label({LABEL_VOLCANO: name})
        if via == "annotation":
            return self.annotate({ANNOTATION_GROUP: name})
        raise ValueError(f"unknown group reference {via!r}")

    def task(self, name: str) -> Self:
        """Volcano's task name (``volcano.sh/task-spec``)."""
        return self.annotate({ANNOTATION_TASK: name})

    def rv(self, resource_version: str | int) -> Self:
        self._meta["resourceVersion"] = str(resource_version)
        return self

    # -- resources

    def req(self, resources: Mapping[str, Quantity] | None = None, /, **kw: Quantity) -> Self:
        """Add requests to the main container: ``.req(cpu="2", memory="4Gi", gpu=1)``."""
        main = self._spec["containers"][0]["resources"]
        main.setdefault("requests", {}).update(_resources(resources, kw))
        return self

    def limit(self, resources: Mapping[str, Quantity] | None = None, /, **kw: Quantity) -> Self:
        main = self._spec["containers"][0]["resources"]
        main.setdefault("limits", {}).update(_resources(resources, kw))
        return self

    def container(self, resources: Mapping[str, Quantity] | None = None, /, **kw: Quantity) -> Self:
        """Add another container with these requests."""
        containers = self._spec["containers"]
        containers.append(
            {
                "name": f"c{len(containers)}",
                "image": "busybox",
                "resources": {"requests": _resources(resources, kw)},
            }
        )
        return self

    def init_container(
        self,
        resources: Mapping[str, Quantity] | None = None,
        /,
        *,
        sidecar: bool = False,
        **kw: Quantity,
    ) -> Self:
        """Add an init container; ``sidecar=True`` makes it restartable (``Always``)."""
        inits = self._spec.setdefault("initContainers", [])
        container: dict[str, Any] = {
            "name": f"init{len(inits)}",
            "image": "busybox",
            "resources": {"requests": _resources(resources, kw)},
        }
        if sidecar:
            container["restartPolicy"] = "Always"
        inits.append(container)
        return self

    def pod_requests(
        self, resources: Mapping[str, Quantity] | None = None, /, **kw: Quantity
    ) -> Self:
        """Pod-level ``spec.resources.requests``."""
        self._spec.setdefault("resources", {}).setdefault("requests", {}).update(
            _resources(resources, kw)
        )
        return self

    def overhead(self, resources: Mapping[str, Quantity] | None = None, /, **kw: Quantity) -> Self:
        self._spec.setdefault("overhead", {}).update(_resources(resources, kw))
        return self

    # -- scheduling

    def scheduler(self, name: str) -> Self:
        self._spec["schedulerName"] = name
        return self

    def priority(self, priority: int) -> Self:
        self._spec["priority"] = priority
        return self

    def preemption_policy(self, policy: str) -> Self:
        """``spec.preemptionPolicy`` (``Never`` or ``PreemptLowerPriority``)."""
        self._spec["preemptionPolicy"] = policy
        return self

    def started(self, when: float | str | dt.datetime) -> Self:
        """``status.startTime``."""
        self._obj["status"]["startTime"] = _timestamp(when)
        return self

    def node(self, node_name: str) -> Self:
        """Bound to ``node_name`` (``spec.nodeName``); the phase is left as it is."""
        self._spec["nodeName"] = node_name
        return self

    def running(self, node_name: str) -> Self:
        return self.node(node_name).phase("Running")

    def phase(self, phase: str) -> Self:
        self._obj["status"]["phase"] = phase
        return self

    def nominated(self, node_name: str) -> Self:
        self._obj["status"]["nominatedNodeName"] = node_name
        return self

    def gate(self, name: str = "example.com/gate") -> Self:
        self._spec.setdefault("schedulingGates", []).append({"name": name})
        return self

    def selector(self, labels: Mapping[str, str] | None = None, /, **kw: str) -> Self:
        """``nodeSelector`` entries."""
        self._spec.setdefault("nodeSelector", {}).update(_merged(labels, kw))
        return self

    def require(self, *exprs: Expr, fields: Sequence[Expr] = ()) -> Self:
        """Add one required node affinity term (terms are ORed, its requirements ANDed).

        ``.require(("zone", "In", "a", "b"), ("gpu", "Exists"))``;
        ``.require(fields=[("metadata.name", "In", "n1")])``. With no arguments the term is
        empty (it matches no node).
        """
        required = self._node_affinity().setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
        )
        required.setdefault("nodeSelectorTerms", []).append(_term(exprs, fields))
        return self

    def require_nothing(self) -> Self:
        """Required node affinity given with no terms at all (matches no node)."""
        self._node_affinity()["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": []
        }
        return self

    def prefer(self, weight: int, *exprs: Expr, fields: Sequence[Expr] = ()) -> Self:
        """Add a preferred node affinity term with ``weight``."""
        preferred = self._node_affinity().setdefault(
            "preferredDuringSchedulingIgnoredDuringExecution", []
        )
        preferred.append({"weight": weight, "preference": _term(exprs, fields)})
        return self

    def tolerate(
        self,
        key: str = "",
        value: str | None = None,
        *,
        effect: str = "",
        operator: str | None = None,
        seconds: int | None = None,
    ) -> Self:
        """Add a toleration. Without ``operator`` it is ``Equal`` when a value is given,
        else ``Exists``: ``.tolerate()`` tolerates everything, ``.tolerate("gpu")`` every
        ``gpu`` taint, ``.tolerate("gpu", "broken", effect="NoSchedule")`` one taint.
        """
        op = operator if operator is not None else ("Equal" if value is not None else "Exists")
        toleration: dict[str, Any] = {"operator": op}
        if key:
            toleration["key"] = key
        if value is not None:
            toleration["value"] = value
        if effect:
            toleration["effect"] = effect
        if seconds is not None:
            toleration["tolerationSeconds"] = seconds
        self._spec.setdefault("tolerations", []).append(toleration)
        return self

    def _pod_term(self, kind: str, topology_key: str, match: Mapping[str, str]) -> Self:
        affinity = self._spec.setdefault("affinity", {}).setdefault(kind, {})
        affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
            {"labelSelector": {"matchLabels": dict(match)}, "topologyKey": topology_key}
        )
        return self

    def pod_affinity(
        self,
        match: Mapping[str, str] | None = None,
        /,
        *,
        topology_key: str = "kubernetes.io/hostname",
        **kw: str,
    ) -> Self:
        """A required inter-pod affinity term towards pods with these labels."""
        return self._pod_term("podAffinity", topology_key, _merged(match, kw))

    def pod_anti_affinity(
        self,
        match: Mapping[str, str] | None = None,
        /,
        *,
        topology_key: str = "kubernetes.io/hostname",
        **kw: str,
    ) -> Self:
        """A required inter-pod anti-affinity term against pods with these labels."""
        return self._pod_term("podAntiAffinity", topology_key, _merged(match, kw))

    # -- results

    def obj(self) -> dict[str, Any]:
        """The pod as JSON (a fresh copy each time)."""
        out = copy.deepcopy(self._obj)
        meta = out["metadata"]
        meta["uid"] = self._uid or f"uid-{meta['namespace']}-{meta['name']}"
        return out

    def build(self) -> Pod:
        return parse_pod(self.obj())


class NodeBuilder:
    """A Ready, schedulable node with room for 110 pods and nothing else until ``cap``."""

    def __init__(self, name: str) -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-node-{name}", "labels": {}},
            "spec": {},
            "status": {
                "capacity": {"pods": "110"},
                "allocatable": {"pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    @property
    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self._obj["metadata"]
        return meta

    @property
    def _status(self) -> dict[str, Any]:
        status: dict[str, Any] = self._obj["status"]
        return status

    def copy(self) -> NodeBuilder:
        return copy.deepcopy(self)

    def uid(self, uid: str) -> Self:
        self._meta["uid"] = uid
        return self

    def rv(self, resource_version: str | int) -> Self:
        self._meta["resourceVersion"] = str(resource_version)
        return self

    def cap(self, resources: Mapping[str, Quantity] | None = None, /, **kw: Quantity) -> Self:
        """Capacity and allocatable alike: ``.cap(cpu="8", memory="32Gi", gpu=8)``."""
        values = _resources(resources, kw)
        self._status["capacity"].update(values)
        self._status["allocatable"].update(values)
        return self

    def alloc(self, resources: Mapping[str, Quantity] | None = None, /, **kw: Quantity) -> Self:
        """Allocatable only (capacity unchanged), for nodes with reserved resources."""
        self._status["allocatable"].update(_resources(resources, kw))
        return self

    def label(self, labels: Mapping[str, str] | None = None, /, **kw: str) -> Self:
        self._meta["labels"].update(_merged(labels, kw))
        return self

    def annotate(self, annotations: Mapping[str, str] | None = None, /, **kw: str) -> Self:
        self._meta.setdefault("annotations", {}).update(_merged(annotations, kw))
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> Self:
        taint: dict[str, Any] = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        self._obj["spec"].setdefault("taints", []).append(taint)
        return self

    def unschedulable(self, flag: bool = True) -> Self:
        """Cordoned (``spec.unschedulable``)."""
        self._obj["spec"]["unschedulable"] = flag
        return self

    def ready(self, flag: bool = True) -> Self:
        for condition in self._status["conditions"]:
            if condition["type"] == "Ready":
                condition["status"] = "True" if flag else "False"
        return self

    def not_ready(self) -> Self:
        return self.ready(False)

    def deleting(self, when: float | str | dt.datetime = 0.0) -> Self:
        self._meta["deletionTimestamp"] = _timestamp(when)
        return self

    def obj(self) -> dict[str, Any]:
        """The node as JSON (a fresh copy each time)."""
        return copy.deepcopy(self._obj)

    def build(self) -> Node:
        return parse_node(self.obj())


class GroupBuilder:
    """A PodGroup of the scheduler-plugins API (``.volcano()`` for Volcano's), minMember 1."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self._api = XK8S
        self._obj: dict[str, Any] = {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-pg-{namespace}-{name}"},
            "spec": {"minMember": 1},
        }

    @property
    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._obj["spec"]
        return spec

    def copy(self) -> GroupBuilder:
        return copy.deepcopy(self)

    def volcano(self) -> Self:
        self._api = VOLCANO
        self._obj["apiVersion"] = "scheduling.volcano.sh/v1beta1"
        return self

    def uid(self, uid: str) -> Self:
        self._obj["metadata"]["uid"] = uid
        return self

    def created(self, when: float | str | dt.datetime) -> Self:
        self._obj["metadata"]["creationTimestamp"] = _timestamp(when)
        return self

    def annotate(self, annotations: Mapping[str, str] | None = None, /, **kw: str) -> Self:
        self._obj["metadata"].setdefault("annotations", {}).update(_merged(annotations, kw))
        return self

    def min_member(self, value: Any) -> Self:
        """Any JSON value, so malformed groups can be built too; ``None`` removes it."""
        if value is None:
            self._spec.pop("minMember", None)
        else:
            self._spec["minMember"] = value
        return self

    def min_resources(self, resources: Mapping[str, Any] | None = None, /, **kw: Any) -> Self:
        self._spec.setdefault("minResources", {}).update(
            {_RESOURCE_ALIASES.get(k, k): v for k, v in _merged(resources, kw).items()}
        )
        return self

    def tasks(self, tasks: Mapping[str, Any] | None = None, /, **kw: Any) -> Self:
        """Volcano's ``minTaskMember``."""
        self._spec.setdefault("minTaskMember", {}).update(_merged(tasks, kw))
        return self

    def timeout(self, seconds: Any) -> Self:
        self._spec["scheduleTimeoutSeconds"] = seconds
        return self

    def priority_class(self, name: str) -> Self:
        self._spec["priorityClassName"] = name
        return self

    def queue(self, name: str) -> Self:
        self._spec["queue"] = name
        return self

    def status(self, **status: Any) -> Self:
        self._obj["status"] = status
        return self

    def spec(self, spec: Any) -> Self:
        self._obj["spec"] = spec
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)

    def build(self) -> PodGroup:
        return parse_podgroup(self._api, self.obj())


def make_group(name: str, namespace: str = "default") -> GroupBuilder:
    return GroupBuilder(name, namespace)


def make_pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)
