"""A discrete-event loop around the production :class:`~batchsched.core.session.Session`.

The simulator feeds the session the objects a watch would (pods and nodes as Kubernetes JSON,
parsed by the same parsers), steps it at virtual times, and carries out its decisions at
once: a binding succeeds (the pod comes back bound, with the annotations the binder would
have written), an eviction succeeds (the pod is gone). Nothing here decides where a pod goes;
every placement is the session's. Deterministic: no wall clock, no randomness.

Pods with DRA ResourceClaims (``spec.resourceClaims``) need what kube-controller-manager
does around the scheduler, so the simulation does it too (:class:`Claims`): it makes a pod's
claim from its ResourceClaimTemplate and names it in the pod's status, writes a Binding's
claim allocations and reservations before the pod is bound (as the binder does), and once a
pod is gone or done drops it from its claims' ``reservedFor``, deallocates a claim reserved
for nobody and deletes the claim made for that pod.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from batchsched.core.decisions import Decisions
from batchsched.core.dra.objects import (
    parse_device_class,
    parse_device_taint_rule,
    parse_resource_claim,
    parse_resource_slice,
)
from batchsched.core.model import Pod, parse_node, parse_pod
from batchsched.core.plan import ClaimWrite
from batchsched.core.session import Session
from batchsched.core.settings import SessionSettings

JSON = dict[str, Any]
#: the annotation kube-controller-manager puts on a claim it made: the pod's entry it is for
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


@dataclass(slots=True)
class Placed:
    """A pod the session bound: where, when, the cards it got, and the DRA devices its
    claims were allocated (``<pool>/<device>``, the claims this Binding allocated)."""

    node: str
    at: float
    cards: tuple[tuple[int, ...], ...] | None = None
    devices: tuple[str, ...] = ()


@dataclass
class Simulation:
    """One cluster and one session; time only moves when :meth:`step` is told ``now``."""

    settings: SessionSettings
    use_jit: bool = True
    session: Session = field(init=False)
    #: pod JSON by uid, as the apiserver would hold it now
    objects: dict[str, JSON] = field(default_factory=dict)
    placed: dict[str, Placed] = field(default_factory=dict)
    evicted: set[str] = field(default_factory=set)

    claims: Claims = field(init=False)

    def __post_init__(self) -> None:
        # every unit handed over is tried in each step: a simulation's result must not depend
        # on how fast the machine running it walks
        self.settings = replace(self.settings, walk_budget=None)
        self.session = Session(self.settings, use_jit=self.use_jit)
        self.claims = Claims(self.session)

    # -- inputs ----------------------------------------------------------------------------

    def add_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        self.session.on_nodes_listed([parse_node(n) for n in nodes])

    def add_devices(self, *, slices: Iterable[Mapping[str, Any]] = (),
                    classes: Iterable[Mapping[str, Any]] = (),
                    taint_rules: Iterable[Mapping[str, Any]] = ()) -> None:
        """ResourceSlices, DeviceClasses and DeviceTaintRules (``resource.k8s.io/v1`` JSON), listed."""
        self.session.on_resource_slices_listed([parse_resource_slice(o) for o in slices])
        self.session.on_device_classes_listed([parse_device_class(o) for o in classes])
        self.session.on_device_taint_rules_listed([parse_device_taint_rule(o) for o in taint_rules])

    def add_pod(self, obj: Mapping[str, Any]) -> Pod:
        """A pod created; the claims its templates stand for are made first (as
        kube-controller-manager does within moments of the pod's creation)."""
        body = copy.deepcopy(dict(obj))
        self.claims.make_for(body)
        pod = parse_pod(body)
        self.objects[pod.uid] = body
        self.session.on_pod("ADDED", pod)
        return pod

    def delete_pod(self, uid: str) -> None:
        body = self.objects.pop(uid, None)
        if body is not None:
            self.session.on_pod("DELETED", parse_pod(body))
            self.claims.release(body)

    def finish_pod(self, uid: str) -> None:
        """The pod ran to completion (phase Succeeded): its resources are free."""
        body = self.objects.get(uid)
        if body is not None:
            body.setdefault("status", {})["phase"] = "Succeeded"
            self.session.on_pod("MODIFIED", parse_pod(body))
            self.claims.release(body)

    # -- the loop --------------------------------------------------------------------------

    def step(self, now: float) -> Decisions:
        """One session step at ``now``, its decisions carried out."""
        d = self.session.step(now)
        for b in d.binds:
            body = self.objects.get(b.uid)
            if body is None:
                continue
            meta = body.setdefault("metadata", {})
            if b.annotations:
                meta["annotations"] = {**(meta.get("annotations") or {}), **dict(b.annotations)}
            if b.labels:
                meta["labels"] = {**(meta.get("labels") or {}), **dict(b.labels)}
            self.claims.write(b.claims)
            body.setdefault("spec", {})["nodeName"] = b.node
            body.setdefault("status", {})["phase"] = "Running"
            self.session.on_bind_result(b, "bound", now=now)
            self.session.on_pod("MODIFIED", parse_pod(body))
            self.placed[b.uid] = Placed(b.node, now, b.cards, _devices(b.claims))
        for e in d.evictions:
            self.session.on_evict_result(e, "evicted")
            self.evicted.add(e.uid)
            self.delete_pod(e.uid)
        for ref, notes, labels in d.cleanups:
            body = self.objects.get(ref.uid)
            if body is not None:
                meta = body.setdefault("metadata", {})
                for k in notes:
                    (meta.get("annotations") or {}).pop(k, None)
                for k in labels:
                    (meta.get("labels") or {}).pop(k, None)
                self.session.on_pod("MODIFIED", parse_pod(body))
        for namespace, name, uid in d.claim_deletes:
            self.claims.delete(namespace, name, uid)
        return d

    def pending(self) -> list[str]:
        return [str(uid) for uid in self.session.state.pending]


@dataclass
class Claims:
    """The ResourceClaims of a simulated cluster, and kube-controller-manager's part in them."""

    session: Session
    #: claim JSON by (namespace, name), as the apiserver would hold it now
    objects: dict[tuple[str, str], JSON] = field(default_factory=dict)
    #: ResourceClaimTemplate JSON by (namespace, name)
    templates: dict[tuple[str, str], JSON] = field(default_factory=dict)
    version: int = 0

    def _stamp(self, claim: JSON) -> None:
        self.version += 1
        claim.setdefault("metadata", {})["resourceVersion"] = f"sim-{self.version}"

    def add(self, claims: Iterable[Mapping[str, Any]], templates: Iterable[Mapping[str, Any]] = ()) -> None:
        """Claims and templates as listed from a cluster (a claim keeps its status)."""
        for t in templates:
            meta = t.get("metadata") or {}
            self.templates[(str(meta.get("namespace") or "default"), str(meta.get("name")))] = copy.deepcopy(dict(t))
        for c in claims:
            meta = c.get("metadata") or {}
            self.objects[(str(meta.get("namespace") or "default"), str(meta.get("name")))] = copy.deepcopy(dict(c))
        self.session.on_resource_claims_listed([parse_resource_claim(o) for o in self.objects.values()])

    def make_for(self, pod: JSON) -> None:
        """The claim of each of ``pod``'s template entries not made yet, made from its template
        and named in ``status.resourceClaimStatuses``. A template that does not exist makes
        nothing: the pod waits for it, told so by the session, as it would in a cluster."""
        meta = pod.setdefault("metadata", {})
        namespace = str(meta.get("namespace") or "default")
        status = pod.setdefault("status", {})
        made = {str(s.get("name")) for s in status.get("resourceClaimStatuses") or ()}
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            if not isinstance(entry, Mapping):
                continue  # not an entry a claim can be made for
            template = self.templates.get((namespace, str(entry.get("resourceClaimTemplateName") or "")))
            if template is None or entry.get("name") in made:
                continue
            name = _claim_name(meta, str(entry["name"]))
            claim: JSON = {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace, "uid": f"claim-{namespace}-{name}",
                             "annotations": {POD_CLAIM_NAME: str(entry["name"])},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"),
                                                  "uid": meta.get("uid"), "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {}), "status": {},
            }
            self._stamp(claim)
            self.objects[(namespace, name)] = claim
            self.session.on_resource_claim("ADDED", parse_resource_claim(claim))
            status.setdefault("resourceClaimStatuses", []).append({"name": entry["name"], "resourceClaimName": name})

    def write(self, writes: Iterable[ClaimWrite]) -> None:
        """A Binding's claim writes applied, as the binder writes them before the Binding."""
        for w in writes:
            if w.create is not None:
                w = self._create(w)
            claim = self.objects.get((w.namespace, w.name))
            if claim is None or claim["metadata"].get("uid") != w.uid:
                continue  # gone or made again meanwhile: the binder's precondition would fail
            status = claim.setdefault("status", {})
            if w.allocation is not None:
                status["allocation"] = copy.deepcopy(dict(w.allocation))
            status["reservedFor"] = [dict(r) for r in w.reserved_for]
            self._stamp(claim)
            self.session.on_resource_claim("MODIFIED", parse_resource_claim(claim))

    def delete(self, namespace: str, name: str, uid: str) -> None:
        """A claim deleted (if it is still the one of ``uid``)."""
        claim = self.objects.get((namespace, name))
        if claim is not None and claim["metadata"].get("uid") == uid:
            del self.objects[(namespace, name)]
            self.session.on_resource_claim("DELETED", parse_resource_claim(claim))

    def _create(self, w: ClaimWrite) -> ClaimWrite:
        """The claim made for a pod's extended resources, created as the binder creates it
        (named by the apiserver: here after the pod's UID, so runs repeat)."""
        body: JSON = copy.deepcopy(dict(w.create or {}))
        meta = body["metadata"]
        owner = str(meta["ownerReferences"][0]["uid"])
        name = meta.pop("generateName") + hashlib.sha256(owner.encode()).hexdigest()[:5]
        meta.update(name=name, uid=f"claim-{w.namespace}-{name}")
        self._stamp(body)
        self.objects[(w.namespace, name)] = body
        self.session.on_resource_claim("ADDED", parse_resource_claim(body))
        return replace(w, name=name, uid=meta["uid"], create=None)

    def release(self, pod: Mapping[str, Any]) -> None:
        """``pod`` is gone or done: dropped from its claims' ``reservedFor``; a claim reserved
        for nobody is deallocated, and deleted when it was made for this pod."""
        uid = (pod.get("metadata") or {}).get("uid")
        for key, claim in list(self.objects.items()):
            status = claim.setdefault("status", {})
            reserved = status.get("reservedFor") or []
            mine = any(r.get("uid") == uid for r in reserved)
            owned = any(o.get("uid") == uid and o.get("controller") for o in claim["metadata"].get("ownerReferences") or [])
            if not mine and not owned:
                continue
            status["reservedFor"] = [r for r in reserved if r.get("uid") != uid]
            if not status["reservedFor"]:
                status.pop("reservedFor")
                status.pop("allocation", None)
            self._stamp(claim)
            if owned and "reservedFor" not in status:
                del self.objects[key]
                self.session.on_resource_claim("DELETED", parse_resource_claim(claim))
            else:
                self.session.on_resource_claim("MODIFIED", parse_resource_claim(claim))


def _devices(writes: Iterable[ClaimWrite]) -> tuple[str, ...]:
    return tuple(f"{r.get('pool')}/{r.get('device')}" for w in writes if w.allocation is not None
                 for r in (w.allocation.get("devices") or {}).get("results") or ())


def _claim_name(pod_meta: Mapping[str, Any], entry: str) -> str:
    """``<pod>-<entry>-<5 characters>``, as kube-controller-manager names a claim it makes
    (its suffix is random; here it comes from the pod's UID, so runs repeat)."""
    suffix = hashlib.sha256(str(pod_meta.get("uid")).encode()).hexdigest()[:5]
    return f"{pod_meta.get('name')}-{entry}-{suffix}"
