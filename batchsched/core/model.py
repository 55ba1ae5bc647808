"""The scheduler's view of Kubernetes objects: small immutable values parsed from JSON.

Only what scheduling needs is kept. Parsing never raises on a field it does not understand
in an object the apiserver accepted; a quantity that cannot be parsed makes the pod
:attr:`Pod.invalid` (it is reported, never placed).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NewType, Protocol, TypeVar, cast

import orjson

from batchsched.core.devices import (
    CardAsk,
    DeviceError,
    ask_requests,
    assignment,
    card_asks,
    policy_code,
)
from batchsched.core.quantity import QuantityError, to_units

PodUID = NewType("PodUID", str)
NodeName = NewType("NodeName", str)

GPU = "nvidia.com/gpu"
PODS = "pods"


@dataclass(slots=True, frozen=True)
class Requirement:
    """One ``key operator values`` of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class Term:
    """A node selector term: every expression and every field requirement must hold."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(slots=True, frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(slots=True, frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


@dataclass(slots=True, frozen=True)
class LabelSelector:
    """A ``metav1.LabelSelector``: ``matchLabels`` and ``matchExpressions`` ANDed."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels.items():
            if labels.get(k) != v:
                return False
        for req in self.expressions:
            op = req.operator
            if op == "In":
                if labels.get(req.key) not in req.values:
                    return False
            elif op == "NotIn":
                if req.key in labels and labels[req.key] in req.values:
                    return False
            elif op == "Exists":
                if req.key not in labels:
                    return False
            elif op == "DoesNotExist":
                if req.key in labels:
                    return False
            else:
                return False  # an operator the apiserver would not accept: select nothing
        return True


@dataclass(slots=True, frozen=True)
class SpreadConstraint:
    """One of ``spec.topologySpreadConstraints``."""

    max_skew: int
    topology_key: str
    #: DoNotSchedule (a filter) or ScheduleAnyway (a score)
    when_unsatisfiable: str
    selector: LabelSelector | None
    min_domains: int = 1
    #: Honor (default) or Ignore: whether the pod's node affinity limits the domains counted
    node_affinity_policy: str = "Honor"
    #: Honor or Ignore (default): whether untolerated tainted nodes are counted
    node_taints_policy: str = "Ignore"
    match_label_keys: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class PodAffinityTerm:
    """A required inter-pod (anti-)affinity term: pods matching ``selector`` in
    ``namespaces`` (the pod's own when empty and no ``namespace_selector``), counted per
    domain of ``topology_key``."""

    selector: LabelSelector | None
    topology_key: str
    namespaces: tuple[str, ...] = ()
    namespace_selector: LabelSelector | None = None
    match_label_keys: tuple[str, ...] = ()
    mismatch_label_keys: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims``: the ResourceClaim it uses, named in the
    pod (``resourceClaimName``) or made for it from a template by kube-controller-manager
    (``resourceClaimTemplateName``; the pod's ``status.resourceClaimStatuses`` names the
    claim made)."""

    #: the entry's name (what containers' ``resources.claims`` refer to)
    name: str
    #: the ResourceClaim's name; "" while the claim of a template is not made yet
    claim: str
    #: the ResourceClaimTemplate it is made from ("" for a claim named in the pod)
    template: str = ""


@dataclass(slots=True, frozen=True)
class ContainerAsk:
    """What one container asks of extended resources (``nvidia.com/gpu: 2``), kept for
    the ones a DRA DeviceClass may serve (:mod:`batchsched.core.dra.extended`)."""

    #: its index among the init containers, then the containers
    index: int
    name: str
    #: an init container that runs to completion before the others start (not a sidecar)
    runs_to_completion: bool
    #: every resource name of its requests, in order (a request's name counts in them)
    request_names: tuple[str, ...]
    #: the extended resources it asks for, with their whole counts
    extended: tuple[tuple[str, int], ...]


@dataclass(slots=True, frozen=True)
class Owner:
    """The ownerReference of a pod marked ``controller: true``: the object that made it
    (a Job, a RayCluster...), named so that what is said of the pod can be said to it."""

    api_version: str
    kind: str
    name: str
    uid: str


#: the implicit extended resource name of a DeviceClass (``<prefix><class>``)
DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"


def extended_resource(name: str) -> bool:
    """Whether ``name`` is an extended resource (``vendor.example/thing``), as Kubernetes
    tells them from its own (``cpu``, ``kubernetes.io/...``), or a DeviceClass's implicit
    name."""
    if name.startswith(DEVICE_CLASS_PREFIX):
        return True
    domain, slash, _ = name.partition("/")
    return bool(slash) and not domain.endswith("kubernetes.io") and not name.startswith("requests.")


@dataclass(slots=True, frozen=True)
class Pod:
    uid: PodUID
    namespace: str
    name: str
    scheduler_name: str = "batchsched"
    node_name: str = ""
    phase: str = "Pending"
    priority: int = 0
    #: ``spec.preemptionPolicy: Never`` (copied from its PriorityClass at creation): it
    #: waits for room and never evicts anyone to make it
    never_preempts: bool = False
    created: float = 0.0
    deleting: bool = False
    gated: bool = False
    requests: Mapping[str, int] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[Term, ...] | None = None
    preferred_terms: tuple[tuple[int, Term], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: ``spec.schedulingGroup.podGroupName``: the ``scheduling.k8s.io`` PodGroup it joins
    scheduling_group: str = ""
    resource_version: str = ""
    #: the order the watch delivered it in, among pods created in the same second: the
    #: resourceVersion it was first seen with, as an integer (:func:`arrival_of`); the
    #: session keeps the first one across updates (a status write changes the version)
    #: and numbers pods whose version is not an integer in the order they came
    arrival: int = 0
    invalid: str = ""
    nominated_node: str = ""
    #: the (reason, message) of its ``PodScheduled=False`` condition, as the pod shows it
    #: (None when it has none): a restarted scheduler does not tell a pod what it already says
    shows: tuple[str, str] | None = None
    #: ``status.startTime`` (Unix seconds), 0 while the pod has not started
    started: float = 0.0
    #: ``spec.activeDeadlineSeconds``, 0 when not set
    active_deadline: float = 0.0
    spread: tuple[SpreadConstraint, ...] = ()
    #: required inter-pod affinity and anti-affinity terms
    affinity_terms: tuple[PodAffinityTerm, ...] = ()
    anti_affinity_terms: tuple[PodAffinityTerm, ...] = ()
    #: PersistentVolumeClaims its volumes use (generic ephemeral volumes included, by the
    #: claim name Kubernetes gives them: ``<pod>-<volume>``)
    claims: tuple[str, ...] = ()
    #: ``spec.resourceClaims`` (dynamic resource allocation): the ResourceClaim each names
    resource_claims: tuple[PodClaim, ...] = ()
    #: the nodes where its ResourceClaims can be allocated (None: it has none to allocate;
    #: set by :mod:`batchsched.core.dra`)
    device_nodes: frozenset[str] | None = None
    #: what its containers ask of GPU cards (see :mod:`batchsched.core.devices`)
    card_asks: tuple[CardAsk, ...] = ()
    #: the cards each ask holds, as its annotations record them (None: not recorded)
    cards: tuple[tuple[int, ...], ...] | None = None
    #: the containers that ask for extended resources, and what (a DeviceClass may serve
    #: them by DRA devices on nodes that do not offer them: :mod:`batchsched.core.dra.extended`)
    extended: tuple[ContainerAsk, ...] = ()
    #: set by :mod:`batchsched.core.dra`: a ResourceClaim made for the pod's extended
    #: resources by an attempt that did not bind it, to be deleted before it is placed
    #: again (namespace, name, uid)
    stale_claim: tuple[str, str, str] | None = None
    #: the ownerReference marked controller (None: it has none)
    controller: Owner | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def may_claim_devices(self) -> bool:
        """Whether placing it may allocate DRA devices: it has ResourceClaims, or asks for
        extended resources a DeviceClass may serve."""
        return bool(self.resource_claims or self.extended)

    @property
    def holds_resources(self) -> bool:
        """Bound and not finished: its requests count against its node."""
        return bool(self.node_name) and not self.terminal

    def constraint_key(self) -> tuple[Any, ...]:
        """Everything that decides which nodes a pod may use, apart from free capacity and
        where other pods are. An invalid pod shares its key with no other pod (it is
        reported on its own); one with spread constraints or inter-pod terms only with pods
        of its namespace and labels that carry the same (their terms hold dicts: by repr)."""
        topology: tuple[Any, ...] = ()
        if self.spread or self.affinity_terms or self.anti_affinity_terms:
            topology = (
                repr((self.spread, self.affinity_terms, self.anti_affinity_terms)),
                self.namespace,
                tuple(sorted(self.labels.items())),
            )
        selector = self.node_selector
        return (
            tuple(sorted(selector.items())) if selector else (),
            self.required_terms,
            self.preferred_terms,
            self.tolerations,
            self.uid if self.invalid else "",
            self.device_nodes,
            bool(self.card_asks) and any(a.recorded for a in self.card_asks),
            *topology,
        )


@dataclass(slots=True, frozen=True)
class Node:
    name: NodeName
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Mapping[str, int] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True
    deleting: bool = False
    resource_version: str = ""
    #: allocatable resources that could not be read, with why: treated as absent (unusable)
    unreadable: Mapping[str, str] = field(default_factory=dict)
    #: extended resources its allocatable counts in DRA devices (no device plugin offers
    #: them here; set by :mod:`batchsched.core.dra`)
    dra_served: frozenset[str] = frozenset()


# -- parsing ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def arrival_of(resource_version: str) -> int:
    """A resourceVersion as an arrival number: the integer it is (etcd's revision, which
    grows with every write), 0 when it is not one (the apiserver promises nothing of its
    form; the session then numbers the object in the order it came)."""
    return int(resource_version) if resource_version.isascii() and resource_version.isdigit() else 0


class _Arriving(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def arrival(self) -> int: ...


_A = TypeVar("_A", bound=_Arriving)


class Arrivals:
    """Places in line, first come, first served: an object keeps the arrival it was first
    seen with (a status write changes its resourceVersion, not its place in line), and one
    whose version is not an integer is numbered in the order it came."""

    def __init__(self) -> None:
        self._count = 0

    def first_seen(self, obj: _A, known: _A | None) -> _A:
        """``obj`` with its place in line; ``known``: the version seen before, if any."""
        if known is not None and known.uid == obj.uid:
            arrival = known.arrival
        elif obj.arrival:
            return obj
        else:
            self._count += 1
            arrival = self._count
        return obj if obj.arrival == arrival else cast(_A, replace(cast(Any, obj), arrival=arrival))


def parse_time(value: str | None) -> float:
    if not value:
        return 0.0
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def format_time(ts: float) -> str:
    """A ``metav1.Time`` string (whole seconds, UTC) for a Unix time."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _units(resources: Mapping[str, Any] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in (resources or {}).items():
        out[name] = to_units(name, value)
    return out


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        if v > into.get(k, 0):
            into[k] = v


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """What a pod needs on a node, by the rules kube-scheduler uses.

    The sum of its containers, then the init containers: a regular init container needs
    its own request plus the restartable (sidecar) init containers started before it; a
    sidecar keeps running, so it adds to the steady-state sum. The larger of the two wins
    per resource. Pod-level ``spec.resources.requests`` replace the container sum for the
    resources they name. ``spec.overhead`` is added, and one ``pods`` slot.
    """
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        _add(total, _units((c.get("resources") or {}).get("requests")))
    sidecars: dict[str, int] = {}
    init_need: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        req = _units((c.get("resources") or {}).get("requests"))
        if c.get("restartPolicy") == "Always":
            _add(sidecars, req)
            _max(init_need, sidecars)
        else:
            need = dict(sidecars)
            _add(need, req)
            _max(init_need, need)
    _add(total, sidecars)
    _max(total, init_need)
    pod_level = _units((spec.get("resources") or {}).get("requests"))
    total.update(pod_level)
    _add(total, _units(spec.get("overhead")))
    total = {k: v for k, v in total.items() if v > 0}
    total[PODS] = 1
    return total


def _requirements(items: Any) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(
            key=str(r.get("key", "")),
            operator=str(r.get("operator", "")),
            values=tuple(str(v) for v in (r.get("values") or [])),
        )
        for r in (items or [])
    )


def parse_selector(raw: Any) -> LabelSelector | None:
    """A label selector, None when absent (which selects nothing where it is optional)."""
    if not isinstance(raw, Mapping):
        return None
    return LabelSelector(
        match_labels={str(k): str(v) for k, v in (raw.get("matchLabels") or {}).items()},
        expressions=_requirements(raw.get("matchExpressions")),
    )


def _spread(items: Any) -> tuple[SpreadConstraint, ...]:
    return tuple(
        SpreadConstraint(
            max_skew=int(c.get("maxSkew") or 1),
            topology_key=str(c.get("topologyKey") or ""),
            when_unsatisfiable=str(c.get("whenUnsatisfiable") or "DoNotSchedule"),
            selector=parse_selector(c.get("labelSelector")),
            min_domains=int(c.get("minDomains") or 1),
            node_affinity_policy=str(c.get("nodeAffinityPolicy") or "Honor"),
            node_taints_policy=str(c.get("nodeTaintsPolicy") or "Ignore"),
            match_label_keys=tuple(str(k) for k in (c.get("matchLabelKeys") or [])),
        )
        for c in (items or [])
    )


def _affinity_terms(items: Any) -> tuple[PodAffinityTerm, ...]:
    return tuple(
        PodAffinityTerm(
            selector=parse_selector(t.get("labelSelector")),
            topology_key=str(t.get("topologyKey") or ""),
            namespaces=tuple(str(n) for n in (t.get("namespaces") or [])),
            namespace_selector=parse_selector(t.get("namespaceSelector")),
            match_label_keys=tuple(str(k) for k in (t.get("matchLabelKeys") or [])),
            mismatch_label_keys=tuple(str(k) for k in (t.get("mismatchLabelKeys") or [])),
        )
        for t in (items or [])
    )


def _claims(name: str, volumes: Any) -> tuple[str, ...]:
    out: list[str] = []
    for v in volumes or ():
        pvc = v.get("persistentVolumeClaim")
        if isinstance(pvc, Mapping) and pvc.get("claimName"):
            out.append(str(pvc["claimName"]))
        elif isinstance(v.get("ephemeral"), Mapping):
            out.append(f"{name}-{v.get('name', '')}")
    return tuple(out)


def and_terms(a: tuple[Term, ...] | None, b: tuple[Term, ...] | None) -> tuple[Term, ...] | None:
    """Two required node affinities (each an OR of terms, None: any node) that must both hold."""
    if a is None:
        return b
    if b is None:
        return a
    return tuple(
        Term(expressions=x.expressions + y.expressions, fields=x.fields + y.fields) for x in a for y in b
    )


def parse_node_terms(items: Any) -> tuple[Term, ...]:
    """``nodeSelectorTerms`` (of a pod's required node affinity, or a volume's)."""
    return tuple(_term(t) for t in (items or []))


def _term(t: Mapping[str, Any]) -> Term:
    return Term(
        expressions=_requirements(t.get("matchExpressions")),
        fields=_requirements(t.get("matchFields")),
    )


def _unscheduled(status: Mapping[str, Any]) -> tuple[str, str] | None:
    """The reason and message of a ``PodScheduled=False`` condition, if the pod has one."""
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("reason") or ""), str(c.get("message") or "")
    return None


def _strings(raw: Any) -> dict[str, str]:
    """Labels as strings, as the apiserver holds them (a value of another type, which it
    never holds, would otherwise reach every map keyed by labels)."""
    return {str(k): str(v) for k, v in (raw or {}).items()}


def parse_pod(obj: Mapping[str, Any], schedulers: frozenset[str] | None = None) -> Pod:
    """A pod as the scheduler sees it. ``schedulers``: the names it schedules for; a pod of
    another scheduler that is not bound takes no capacity and is never placed by us, so
    only what identifies it (and its gang) is read (:func:`_foreign_pod`)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    name = spec.get("schedulerName") or "default-scheduler"
    if schedulers is not None and name not in schedulers and not spec.get("nodeName"):
        return _foreign_pod(meta, status, str(name), _scheduling_group(spec))
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    requests, invalid, asks, extended, tolerations = _spec_asks(spec, annotations)
    affinity = spec.get("affinity") or {}
    required_terms, preferred = _node_affinity(affinity.get("nodeAffinity") or {})
    return Pod(
        uid=PodUID(str(meta.get("uid", ""))),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        priority=int(spec.get("priority") or 0),
        never_preempts=spec.get("preemptionPolicy") == "Never",
        created=parse_time(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
        gated=bool(spec.get("schedulingGates")),
        requests=requests,
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        required_terms=required_terms,
        preferred_terms=preferred,
        tolerations=tolerations,
        labels=_strings(meta.get("labels")),
        annotations=annotations,
        scheduling_group=_scheduling_group(spec),
        resource_version=str(meta.get("resourceVersion", "")),
        arrival=arrival_of(str(meta.get("resourceVersion", ""))),
        invalid=invalid,
        card_asks=asks,
        cards=assignment(asks, annotations) if asks else None,
        nominated_node=str(status.get("nominatedNodeName") or ""),
        shows=_unscheduled(status),
        started=parse_time(status.get("startTime")),
        spread=_spread(spec.get("topologySpreadConstraints")),
        affinity_terms=_affinity_terms(
            (affinity.get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        ),
        anti_affinity_terms=_affinity_terms(
            (affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        ),
        claims=_claims(str(meta.get("name", "")), spec.get("volumes")),
        resource_claims=_resource_claims(spec, status),
        active_deadline=float(spec.get("activeDeadlineSeconds") or 0),
        extended=extended,
        controller=_controller(meta.get("ownerReferences")),
    )


_SpecAsks = tuple[dict[str, int], str, tuple[CardAsk, ...], tuple["ContainerAsk", ...], tuple[Toleration, ...]]
#: :func:`_spec_asks` by the JSON of what it reads: the pods of one template read once
_SPEC_ASKS: dict[bytes, _SpecAsks] = {}
#: distinct specs kept; beyond, the memo starts again (it only saves work)
SPEC_ASKS_KEPT = 4096


def _spec_asks(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> _SpecAsks:
    """``(requests, invalid, card asks, extended-resource asks, tolerations)`` of a pod:
    read once per distinct containers, pod-level resources, overhead, tolerations and
    annotations (the pods of one job share them; reading them was half of taking in a
    list of pods). Each pod gets its own copy of the requests."""
    key = orjson.dumps((_read_of(spec.get("containers")), _read_of(spec.get("initContainers")),
                        spec.get("resources"), spec.get("overhead"), spec.get("tolerations"), annotations))
    found = _SPEC_ASKS.get(key)
    if found is None:
        requests, invalid, asks = _pod_requests(spec, annotations)
        tolerations = tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in (spec.get("tolerations") or [])
        )
        found = (requests, invalid, asks, _extended_asks(spec) if not invalid else (), tolerations)
        if len(_SPEC_ASKS) >= SPEC_ASKS_KEPT:
            _SPEC_ASKS.clear()
        _SPEC_ASKS[key] = found
    return dict(found[0]), *found[1:]


def _read_of(containers: Any) -> Any:
    """What :func:`_spec_asks` reads of each container: its name, resources and restart
    policy. Not the rest (every pod mounts its own service account token under a name of
    its own, which would make each pod of a template a spec of its own)."""
    if not isinstance(containers, list):
        return containers
    return [(c.get("name"), c.get("resources"), c.get("restartPolicy")) if isinstance(c, dict) else c
            for c in containers]


def _controller(refs: Any) -> Owner | None:
    """The ownerReference marked ``controller: true`` (the apiserver allows one), or None."""
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return Owner(api_version=str(ref.get("apiVersion") or ""), kind=str(ref.get("kind") or ""),
                         name=str(ref.get("name") or ""), uid=str(ref.get("uid") or ""))
    return None


def _extended_asks(spec: Mapping[str, Any]) -> tuple[ContainerAsk, ...]:
    """The containers asking for extended resources (whole counts), init containers first."""
    out: list[ContainerAsk] = []
    init = list(spec.get("initContainers") or [])
    for i, c in enumerate([*init, *(spec.get("containers") or [])]):
        if not isinstance(c, Mapping):
            continue
        requests = (c.get("resources") or {}).get("requests") or {}
        if not isinstance(requests, Mapping):
            continue
        asked = tuple(
            (str(k), n) for k, v in sorted(requests.items())
            if extended_resource(str(k)) and (n := _whole(str(k), v)) > 0
        )
        if asked:
            out.append(ContainerAsk(
                index=i, name=str(c.get("name") or ""),
                runs_to_completion=i < len(init) and c.get("restartPolicy") != "Always",
                request_names=tuple(sorted(str(k) for k in requests)), extended=asked,
            ))
    return tuple(out)


def _whole(name: str, value: Any) -> int:
    try:
        return to_units(name, value)
    except QuantityError:
        return 0


def _resource_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[PodClaim, ...]:
    """``spec.resourceClaims``, each with the ResourceClaim it uses (a template's, from
    ``status.resourceClaimStatuses`` once made)."""
    made = {
        str(s.get("name") or ""): str(s.get("resourceClaimName") or "")
        for s in (status.get("resourceClaimStatuses") or ()) if isinstance(s, Mapping)
    }
    out = []
    for c in spec.get("resourceClaims") or ():
        if not isinstance(c, Mapping):
            continue
        name, template = str(c.get("name") or ""), str(c.get("resourceClaimTemplateName") or "")
        claim = made.get(name, "") if template else str(c.get("resourceClaimName") or "")
        out.append(PodClaim(name=name, claim=claim, template=template))
    return tuple(out)


def _scheduling_group(spec: Mapping[str, Any]) -> str:
    """The ``scheduling.k8s.io`` PodGroup a pod joins (``spec.schedulingGroup``), or ""."""
    group = spec.get("schedulingGroup")
    return str(group.get("podGroupName") or "") if isinstance(group, Mapping) else ""


def _foreign_pod(meta: Mapping[str, Any], status: Mapping[str, Any], scheduler: str, group: str) -> Pod:
    """A pod another scheduler places, not bound yet: only what identifies it and its
    gang (its labels and annotations), its phase and age; it asks for nothing."""
    return Pod(
        uid=PodUID(str(meta.get("uid", ""))), namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")), scheduler_name=scheduler,
        phase=str(status.get("phase") or "Pending"), created=parse_time(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")), labels=_strings(meta.get("labels")),
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        scheduling_group=group,
        resource_version=str(meta.get("resourceVersion", "")),
        arrival=arrival_of(str(meta.get("resourceVersion", ""))),
    )


def _pod_requests(
    spec: Mapping[str, Any], annotations: Mapping[str, str],
) -> tuple[dict[str, int], str, tuple[CardAsk, ...]]:
    """``(requests, invalid, card asks)``: what the pod asks for, GPU cards included. A
    request that cannot be read or a GPU ask refused makes the pod invalid: it then asks
    for one pod slot only, so it is reported, never placed."""
    try:
        requests = pod_requests(spec)
    except QuantityError as exc:
        return {PODS: 1}, f"unreadable resource request: {exc}", ()
    try:
        asks = card_asks(spec, annotations)
        requests.update(ask_requests(asks, policy_code(annotations)))
    except DeviceError as exc:
        return {PODS: 1}, f"GPU request refused: {exc}", ()
    return requests, "", asks


def _node_affinity(
    node_aff: Mapping[str, Any],
) -> tuple[tuple[Term, ...] | None, tuple[tuple[int, Term], ...]]:
    """The required node selector terms (None when the pod requires none) and the
    weighted preferred ones of a pod's ``nodeAffinity``."""
    required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
    required_terms = (
        parse_node_terms(required.get("nodeSelectorTerms"))
        if required is not None
        else None
    )
    preferred = tuple(
        (int(p.get("weight", 0)), _term(p.get("preference") or {}))
        for p in (node_aff.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    )
    return required_terms, preferred


@dataclass(slots=True, frozen=True)
class PriorityClass:
    """What the scheduler reads of a PriorityClass: a PodGroup naming it takes its value,
    and its ``preemptionPolicy`` (``Never``: the group waits, never evicts)."""

    name: str
    value: int
    never_preempts: bool = False


def parse_priority_class(obj: Mapping[str, Any]) -> PriorityClass:
    return PriorityClass(
        name=str(obj["metadata"]["name"]), value=int(obj.get("value") or 0),
        never_preempts=obj.get("preemptionPolicy") == "Never",
    )


def parse_node(obj: Mapping[str, Any]) -> Node:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allocatable: dict[str, int] = {}
    unreadable: dict[str, str] = {}
    for name, value in (status.get("allocatable") or {}).items():
        try:
            allocatable[name] = to_units(name, value)
        except QuantityError as exc:
            unreadable[str(name)] = str(exc)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (status.get("conditions") or [])
    )
    taints = tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value") or ""), effect=str(t.get("effect", "")))
        for t in (spec.get("taints") or [])
    )
    return Node(
        name=NodeName(str(meta.get("name", ""))),
        uid=str(meta.get("uid", "")),
        labels=_strings(meta.get("labels")),
        taints=taints,
        allocatable=allocatable,
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        resource_version=str(meta.get("resourceVersion", "")),
        unreadable=unreadable,
    )
