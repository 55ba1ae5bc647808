"""The device book: DRA devices, their classes and claims, as scheduling reads them.

It mirrors ResourceSlices (grouped into pools, :class:`~batchsched.core.dra.objects.Pools`),
DeviceClasses and ResourceClaims, and keeps what is in use: every claim's
``status.allocation`` (so a restarted scheduler rebuilds each device's use from the claims
alone) plus the allocations this scheduler made and has not yet seen written back
(*assumed*, like a pod's binding in flight).

Placement sees devices the way it sees any resource, and the allocator has the last word:

- **nodes** get one extra allocatable column per DeviceClass
  (``deviceclass.resource.kubernetes.io/<class>``): how many devices of the class the node could
  hand out now (matching the class, not held by an allocated claim, not tainted
  ``NoSchedule``/``NoExecute``, their pool's shared counters still covering them alone),
  plus the devices the bound pods there hold;
- a **pending pod** asks, in those columns, for the whole devices of its unallocated
  claims' ``exactly`` requests of ``ExactCount`` (not ``All``, ``firstAvailable``, a
  request of capacity, or one of a class some device of which may be shared: a share is no
  whole device), and may only go to the nodes where its claims could be allocated on an
  empty cluster among those its node selector allows
  (:attr:`~batchsched.core.model.Pod.device_nodes`, found once per claim shape); a pod
  whose claim is allocated already (a claim it shares) may only go where that allocation is;
- a **bound pod** is charged, in those columns, with the whole devices its claims hold (a
  shared claim to the first pod it is reserved for): its queue's usage counts them, and
  evicting it frees them, in the cycle's reckoning;
- the **cycle** then allocates the claims of each pod it places, on the node chosen, with
  the structured allocator (:mod:`batchsched.core.dra.allocator`) over everything in use
  (:class:`DeviceCycle`). Where a member's claims cannot be allocated (a column counts
  free devices, not which of them a request's selectors or constraints accept), the unit
  is placed again without that node, a few times in the cycle, and the node is
  remembered for that claim shape (:attr:`DeviceBook.refused`) until what is allocated
  there changes, so later cycles do not try it again.

A pod whose claim does not exist yet (its template's claim not made yet), or cannot be
allocated on any node, waits and is told why; it is read again when a claim, a slice or a
class changes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from batchsched.core import explain
from batchsched.core.devices import NVIDIA_GPU, CardAsk, ask_requests
from batchsched.core.dra.allocator import (
    Allocated,
    InUse,
    SelectorCache,
    allocate,
    in_use_from_claims,
)
from batchsched.core.dra.cel import CelError, compile_selector
from batchsched.core.dra.extended import claim_body, claim_requests, resolve
from batchsched.core.dra.objects import (
    MAX_RESULTS_PER_CLAIM,
    CounterId,
    Device,
    DeviceClass,
    DeviceId,
    DeviceTaintRule,
    DraError,
    NodeDevices,
    NodeSelector,
    Pools,
    ResourceClaim,
    ResourceSlice,
    parse_resource_claim,
)
from batchsched.core.model import DEVICE_CLASS_PREFIX, Node, Pod, PodUID, and_terms
from batchsched.core.plan import Binding, ClaimWrite

__all__ = ["CLASS_COLUMN", "DeviceBook", "DeviceChange", "DeviceCycle", "class_column"]

#: the prefix of the per-DeviceClass columns (``deviceclass.resource.kubernetes.io/gpu.nvidia.com``):
#: each class's implicit extended resource name, so a pod asking for it by that name
#: (:mod:`batchsched.core.dra.extended`) asks in the same column
CLASS_COLUMN = DEVICE_CLASS_PREFIX
#: the in-flight key of the claim being made for a pod's extended resources (its name is
#: known once the apiserver made it): ``(namespace, EXTENDED_IN_FLIGHT + pod uid)``
EXTENDED_IN_FLIGHT = "<extended-resources>/"
_BLOCKING = ("NoSchedule", "NoExecute")
ClaimKey = tuple[str, str]


def class_column(name: str) -> str:
    """The resource column counting the devices of DeviceClass ``name``."""
    return CLASS_COLUMN + name


@dataclass(slots=True, frozen=True)
class DeviceChange:
    """What a change of devices, classes or claims concerns: the nodes whose free devices
    changed and the claims whose pods must be read again (None: every one)."""

    nodes: frozenset[str] | None = frozenset()
    claims: frozenset[ClaimKey] | None = frozenset()
    #: pods whose extended-resource claim changed (read again too)
    owners: frozenset[PodUID] = frozenset()

    @property
    def empty(self) -> bool:
        return self.nodes == frozenset() and self.claims == frozenset() and not self.owners


_EVERYTHING = DeviceChange(nodes=None, claims=None)


def _reservation(pod: Pod) -> Mapping[str, str]:
    """A ``reservedFor`` entry naming ``pod``."""
    return {"resource": "pods", "name": pod.name, "uid": pod.uid}


class DeviceBook:
    """Slices, classes and claims, the nodes they are offered on, and the allocations in
    flight. One writer: the event intake (and the step, for the assumed allocations)."""

    def __init__(self) -> None:
        self.slices: dict[str, ResourceSlice] = {}
        self.classes: dict[str, DeviceClass] = {}
        #: DeviceTaintRules by name: their taints are added to the devices they match
        self.taint_rules: dict[str, DeviceTaintRule] = {}
        self.claims: dict[ClaimKey, ResourceClaim] = {}
        #: the nodes as last seen (their labels decide which devices they may use; their
        #: allocatable, whether an extended resource is a device plugin's there)
        self.nodes: dict[str, Node] = {}
        #: pod -> the claim made for its extended resources (by its owner reference)
        self.extended_of: dict[PodUID, ClaimKey] = {}
        #: extended resource name -> the DeviceClass serving it, until the classes change
        self._served: dict[str, str] | None = None
        #: claim -> (the pod it was allocated for, what it holds), until its status shows it
        self.assumed: dict[ClaimKey, tuple[PodUID, InUse]] = {}
        self._pools: Pools | None = None
        #: node -> the devices it may use, until the devices or the node's labels change
        #: (finding them walks every pool: kept, they cost nothing per claim event or cycle)
        self._here: dict[str, NodeDevices] = {}
        self._confirmed: InUse | None = None
        #: claim shape -> the nodes where it could be allocated, or why nowhere
        self._feasible: dict[tuple[str, frozenset[str]], frozenset[str] | str] = {}
        #: the classes some device allowing multiple allocations matches, until devices change
        self._shareable: frozenset[str] | None = None
        #: (class, device) -> whether the device matches the class, for the class and device
        #: objects kept beside it: an entry holds while neither was replaced (a slice or class
        #: event elsewhere costs no selector run here; a 500-node cluster's were seconds)
        self._matches: dict[tuple[str, DeviceId], tuple[DeviceClass, Device, bool]] = {}
        #: (class, the values its selectors read) -> whether such a device matches it: one
        #: selector run serves every device alike in what it reads (every GPU of a model)
        self._shapes: dict[tuple[Any, ...], tuple[DeviceClass, bool]] = {}
        #: selectors compiled, and their outcome on each device, until the devices change
        self.selectors = SelectorCache()
        #: the last cycle's allocations, read when its bindings are assumed
        self._cycle: DeviceCycle | None = None
        #: bound pods -> (their node, the devices per class column their claims hold)
        self.holding: dict[PodUID, tuple[str, dict[str, int]]] = {}
        #: node -> the devices per class column the bound pods there hold
        self._held_on: dict[str, dict[str, int]] = {}
        #: nodes whose held devices changed since :meth:`take_held_nodes`
        self._held_nodes: set[str] = set()
        #: claim shape -> the nodes where a pod of that shape was placed and its claims could
        #: not be allocated, until what is allocated on the node changes (the class columns
        #: count a node's free devices, not which of them a request accepts: without this a
        #: pod may be placed, and refused, on the same node cycle after cycle)
        self.refused: dict[str, dict[str, str]] = {}

    # -- what is known -------------------------------------------------------------------------

    @property
    def pools(self) -> Pools:
        if self._pools is None:
            self._pools = Pools(self.slices.values(), self.taint_rules.values())
        return self._pools

    def confirmed(self) -> InUse:
        """What the claims' status says is in use."""
        if self._confirmed is None:
            self._confirmed = in_use_from_claims(self.claims.values(), self.pools)
        return self._confirmed

    def in_use(self) -> InUse:
        """What is in use, with the allocations in flight."""
        use = self.confirmed()
        for _, delta in self.assumed.values():
            use = use.plus(delta)
        return use

    def served(self) -> Mapping[str, str]:
        """Extended resource name -> the DeviceClass whose devices serve it where no device
        plugin offers it (:func:`~batchsched.core.dra.extended.resolve`)."""
        if self._served is None:
            self._served = resolve(self.classes.values()) if self.classes else {}
        return self._served

    def named(self, by_class: Mapping[str, int]) -> dict[str, int]:
        """What whole devices of classes that name an extended resource (``nvidia.com/gpu``)
        count as under that name, so that one quota on it covers GPUs a pod's own claims
        hold as well as those a device plugin or a claim made for the pod serves (and, for
        ``nvidia.com/gpu``, as whole GPUs handed out by count)."""
        out: dict[str, int] = {}
        served = self.served()
        for column, n in by_class.items():
            klass = self.classes.get(column[len(CLASS_COLUMN):]) if column.startswith(CLASS_COLUMN) else None
            if klass is None or n <= 0:
                continue
            name = klass.extended_resource_name
            if not name or served.get(name) != klass.name:
                continue
            for k, v in (by_count(n) if name == NVIDIA_GPU else {name: n}).items():
                out[k] = out.get(k, 0) + v
        return out

    def extended_here(self, pod: Pod, node: str) -> dict[str, str]:
        """The extended resources of ``pod`` that DRA devices serve on ``node`` (it does not
        offer them itself), with their classes."""
        served = self.served()
        if not served or not pod.extended:
            return {}
        offered = self.nodes[node].allocatable if node in self.nodes else {}
        return {
            r: served[r] for a in pod.extended for r, _ in a.extended
            if r in served and offered.get(r, 0) <= 0
        }

    def node_devices(self, name: str) -> NodeDevices:
        here = self._here.get(name)
        if here is None:
            node = self.nodes.get(name)
            here = self._here[name] = self.pools.for_node(name, node.labels if node is not None else {})
        return here

    # -- nodes ---------------------------------------------------------------------------------

    def node_event(self, kind: str, node: Node) -> Node:
        """``node`` with its free devices per class counted in its allocatable."""
        if kind == "DELETED":
            self.nodes.pop(node.name, None)
            self._here.pop(node.name, None)
            self._feasible.clear()
            return node
        old = self.nodes.get(node.name)
        if old is None or old.labels != node.labels:
            self._here.pop(node.name, None)
            self._feasible.clear()
            self._unrefuse(frozenset({node.name}))
        self.nodes[node.name] = node
        return self.with_devices(node)

    def replace_nodes(self, nodes: Sequence[Node]) -> list[Node]:
        self.nodes = {n.name: n for n in nodes}
        self._here.clear()
        self._feasible.clear()
        return [self.with_devices(n) for n in nodes]

    def with_devices(self, node: Node) -> Node:
        """``node`` with a column per DeviceClass: the devices it could hand out now, plus
        those the bound pods charged to it hold (so that evicting them frees them, in the
        cycle's reckoning)."""
        base = {k: v for k, v in node.allocatable.items() if not k.startswith(CLASS_COLUMN)}
        free = self.free_counts(node.name) if self.slices and self.classes else {}
        held = self._held_on.get(node.name, {})
        for column, n in held.items():
            if column.startswith(CLASS_COLUMN):
                free[column] = free.get(column, 0) + n
        # an extended resource a class names, where no device plugin offers it: the
        # devices of the class, as many as the class column counts
        for resource, klass in self.served().items():
            if resource.startswith(CLASS_COLUMN) or base.get(resource, 0) > 0:
                continue
            column = class_column(klass)
            if free.get(column, 0) > 0:
                free[resource] = free[column] - held.get(column, 0) + held.get(resource, 0)
        served = frozenset(r for r in self.served() if r in free and not r.startswith(CLASS_COLUMN))
        if not free and len(base) == len(node.allocatable) and served == node.dra_served:
            return node
        return replace(node, allocatable={**base, **free}, dra_served=served)

    def free_counts(self, name: str) -> dict[str, int]:
        """How many devices of each class the node could hand out now, one at a time."""
        here = self.node_devices(name)
        use = self.confirmed()
        left = _counters_left(here, use)
        out = {class_column(c): 0 for c in self.classes}
        for device in here.devices:
            if not _free(device, use, left):
                continue
            for c in self.classes.values():
                if self._matches_class(c, device):
                    out[class_column(c.name)] += 1
        return out

    def shareable_classes(self) -> frozenset[str]:
        """The classes that match a device allowing multiple allocations somewhere: a
        request of such a class may be served by a share of a device another request (of
        this claim or another) holds too, so it is not counted as a whole device."""
        if self._shareable is None:
            self._shareable = frozenset(
                c.name for p in self.pools.pools.values() if not p.problem
                for s in p.slices for d in s.devices if d.allow_multiple
                for c in self.classes.values() if self._matches_class(c, d)
            )
        return self._shareable

    def _matches_class(self, c: DeviceClass, device: Device) -> bool:
        shape = _device_shape(c, device)
        if shape is not None:
            seen = self._shapes.get(shape)
            if seen is not None and seen[0] is c:
                return seen[1]
        key = (c.name, device.id)
        known = self._matches.get(key)
        if known is not None and known[0] is c and known[1] is device:
            return known[2]
        try:
            hit = all(compile_selector(e).matches(device.env) for e in c.selectors)
        except CelError:
            hit = False  # the allocator says why, for a request that asks for this class
        self._matches[key] = (c, device, hit)
        if shape is not None:
            self._shapes[shape] = (c, hit)
        return hit

    # -- slices, classes, claims ---------------------------------------------------------------

    def _devices_changed(self, nodes: frozenset[str] | None = None, *, pools_kept: bool = False) -> DeviceChange:
        """Every cache of what devices there are dropped (the pools too, unless
        ``pools_kept``: brought up to date already); the nodes whose devices changed (None:
        any) and every pod with claims to be read again."""
        if not pools_kept:
            self._pools = None
        if nodes is None:
            self._here.clear()
        else:
            for name in nodes:
                self._here.pop(name, None)
        self._confirmed = None
        self._feasible.clear()
        self._shareable = None
        self._served = None
        self.selectors = SelectorCache()
        self.refused.clear()
        return _EVERYTHING if nodes is None else DeviceChange(nodes=nodes, claims=None)

    def replace_slices(self, slices: Iterable[ResourceSlice]) -> DeviceChange:
        self.slices = {s.name: s for s in slices}
        self._matches.clear()
        self._shapes.clear()
        return self._devices_changed()

    def slice_event(self, kind: str, rs: ResourceSlice) -> DeviceChange:
        """A slice changed: only the nodes it (and the version it replaces) publishes for
        are counted again. Walking every node's devices on every slice event made a
        cluster's slices coming or going cost nodes x pools each (a driver restarting on
        500 nodes stopped the replica past its lease deadline)."""
        old = self.slices.pop(rs.name, None) if kind == "DELETED" else self.slices.get(rs.name)
        if kind != "DELETED":
            self.slices[rs.name] = rs
        local = [s.node_name for s in (old, rs) if s is not None]
        nodes = frozenset(n for n in local if n is not None) if None not in local else None
        if self._pools is not None:
            for key in {(s.driver, s.pool) for s in (old, rs) if s is not None}:
                self._pools.update(key, [s for s in self.slices.values() if (s.driver, s.pool) == key])
        return self._devices_changed(nodes, pools_kept=True)

    def replace_classes(self, classes: Iterable[DeviceClass]) -> DeviceChange:
        self.classes = {c.name: c for c in classes}
        return self._devices_changed()

    def class_event(self, kind: str, dc: DeviceClass) -> DeviceChange:
        if kind == "DELETED":
            self.classes.pop(dc.name, None)
        else:
            self.classes[dc.name] = dc
        return self._devices_changed()

    def replace_taint_rules(self, rules: Iterable[DeviceTaintRule]) -> DeviceChange:
        self.taint_rules = {r.name: r for r in rules}
        return self._devices_changed()

    def taint_rule_event(self, kind: str, rule: DeviceTaintRule) -> DeviceChange:
        """A rule added, changed or deleted: the devices it matches now carry its taint, and
        those it no longer matches are free of it again."""
        if kind == "DELETED":
            self.taint_rules.pop(rule.name, None)
        else:
            self.taint_rules[rule.name] = rule
        return self._devices_changed()

    def replace_claims(self, claims: Iterable[ResourceClaim]) -> DeviceChange:
        self.claims = {(c.namespace, c.name): c for c in claims}
        self.extended_of = {PodUID(c.extended_for): (c.namespace, c.name) for c in self.claims.values() if c.extended_for}
        self.assumed = {k: v for k, v in self.assumed.items() if self._in_flight(k)}
        self._confirmed = None
        self.refused.clear()
        return DeviceChange(nodes=None, claims=None)

    def claim_event(self, kind: str, claim: ResourceClaim) -> DeviceChange:
        key = (claim.namespace, claim.name)
        old = self.claims.pop(key, None)
        if kind != "DELETED":
            self.claims[key] = claim
        owners = self._owner_event(kind, key, claim)
        if not self._in_flight(key):
            self.assumed.pop(key, None)
        for uid in owners:
            flight = (claim.namespace, EXTENDED_IN_FLIGHT + uid)
            if not self._in_flight(flight):
                self.assumed.pop(flight, None)
        held = (old.allocation if old is not None else None, claim.allocation if kind != "DELETED" else None)
        if held[0] is None and held[1] is None:
            return DeviceChange(claims=frozenset({key}), owners=owners)
        self._confirmed = self._newly_allocated(claim) if held[0] is None else None
        nodes = self._nodes_of(claim, old)
        self._unrefuse(nodes)
        return DeviceChange(nodes=nodes, claims=frozenset({key}), owners=owners)

    def _owner_event(self, kind: str, key: ClaimKey, claim: ResourceClaim) -> frozenset[PodUID]:
        """Keep :attr:`extended_of` for a claim event; the pod whose extended-resource
        claim it is (to read again)."""
        if not claim.extended_for:
            return frozenset()
        uid = PodUID(claim.extended_for)
        if kind == "DELETED":
            if self.extended_of.get(uid) == key:
                del self.extended_of[uid]
        else:
            self.extended_of[uid] = key
        return frozenset({uid})

    def refuse(self, claims: Sequence[ResourceClaim], node: str, why: str) -> None:
        """A pod whose unallocated ``claims`` could not be allocated on ``node`` (``why``):
        not placed there again until what is allocated there changes."""
        self.refused.setdefault(_shape(claims), {})[node] = why

    def refused_nodes(self, pod: Pod) -> Mapping[str, str]:
        """The nodes where a pod like ``pod`` (its unallocated claims) was refused, and why."""
        if not self.refused:
            return {}
        claims = [self.claims.get((pod.namespace, c.claim)) for c in pod.resource_claims]
        pending = [c for c in claims if c is not None and c.allocation is None]
        served = {r: k for a in pod.extended for r, _ in a.extended if (k := self.served().get(r)) is not None}
        made = _extended_claim(pod, served)
        if made is not None and not isinstance(made, str):
            pending.append(made[0])
        return self.refused.get(_shape(pending), {}) if pending else {}

    def _unrefuse(self, nodes: frozenset[str] | None) -> None:
        if nodes is None:
            self.refused.clear()
            return
        for refused in self.refused.values():
            for name in nodes:
                refused.pop(name, None)

    def _newly_allocated(self, claim: ResourceClaim) -> InUse | None:
        """What the claims' status says is in use once ``claim``, unallocated before, shows
        its allocation (the common event: a pod's claim written back): the use known so far
        plus its devices, when they are held whole and by no other claim (then it is what a
        rebuild from every claim would give); otherwise None, rebuilt when next asked. A
        rebuild per event costs time in the number of claims, for each claim bound."""
        base = self._confirmed
        if base is None or claim.allocation is None:
            return None
        if any(r.share_id is not None or r.admin_access for r in claim.allocation.results):
            return None
        delta = in_use_from_claims([claim], self.pools)
        if any(d in base.devices or d in base.shared for d in delta.devices):
            return None
        return base.plus(delta)

    def _in_flight(self, key: ClaimKey) -> bool:
        """Whether an assumed allocation of ``key`` is still to be seen in its status (for
        an extended-resource claim being made: until the claim made shows its allocation)."""
        if key[1].startswith(EXTENDED_IN_FLIGHT):
            made = self.extended_of.get(PodUID(key[1][len(EXTENDED_IN_FLIGHT):]))
            claim = self.claims.get(made) if made is not None else None
            return claim is None or claim.allocation is None
        claim = self.claims.get(key)
        return claim is not None and claim.allocation is None

    def _nodes_of(self, *claims: ResourceClaim | None) -> frozenset[str] | None:
        """The nodes whose free devices the claims' allocations change (None: any node,
        for a device not local to one)."""
        out: set[str] = set()
        for claim in claims:
            if claim is None or claim.allocation is None:
                continue
            for r in claim.allocation.results:
                node = self.pools.node_of(r.id)
                if node is None:
                    return None
                out.add(node)
        return frozenset(out)

    # -- pods ----------------------------------------------------------------------------------

    def apply(self, pod: Pod) -> Pod:
        """``pod`` as placement must see it: the devices its claims ask for in the class
        columns and the nodes it may go to; or invalid, with why it waits."""
        if pod.invalid:
            return pod
        if pod.extended and pod.uid in self.extended_of:
            pod = self._stale_extended(pod)
        if not pod.resource_claims:
            return pod
        terms = pod.required_terms
        asks: dict[str, int] = {}
        pending: list[ResourceClaim] = []
        for entry in pod.resource_claims:
            if not entry.claim:
                return replace(pod, invalid=explain.claim_not_made(entry.name, entry.template))
            claim = self.claims.get((pod.namespace, entry.claim))
            if claim is None:
                return replace(pod, invalid=explain.claim_missing(f"{pod.namespace}/{entry.claim}"))
            if claim.allocation is None:
                pending.append(claim)
                for column, n in _asks(claim, self.shareable_classes()).items():
                    asks[column] = asks.get(column, 0) + n
            elif claim.allocation.node_selector is not None:
                terms = and_terms(terms, claim.allocation.node_selector.terms)
        asks.update(self.named(asks))
        nodes = None
        if pending:
            where = self.feasible(pending, self._may_go(pod))
            if isinstance(where, str):
                return replace(pod, invalid=where)
            nodes = where
        return replace(pod, required_terms=terms, requests={**pod.requests, **asks}, device_nodes=nodes)

    def _stale_extended(self, pod: Pod) -> Pod:
        """A pending pod that has a claim made for its extended resources: made by an
        attempt whose Binding did not happen (a Binding in flight is not read here: the
        pod is assumed). The claim may hold devices on a node the pod will not go to: it
        is deleted before the pod is placed again, as kube-scheduler does."""
        key = self.extended_of[pod.uid]
        claim = self.claims.get(key)
        if claim is None:
            return pod
        return replace(pod, stale_claim=(claim.namespace, claim.name, claim.uid))

    def _may_go(self, pod: Pod) -> frozenset[str]:
        """The nodes the pod's nodeSelector and required node affinity allow: its claims
        are tried there only (a pod kept to a few nodes of a large cluster would otherwise
        have its claims tried on every node)."""
        terms = NodeSelector(pod.required_terms, {}) if pod.required_terms is not None else None
        return frozenset(
            name for name, node in self.nodes.items()
            if all(node.labels.get(k) == v for k, v in pod.node_selector.items())
            and (terms is None or terms.matches(name, node.labels))
        )

    def feasible(self, claims: Sequence[ResourceClaim], among: frozenset[str] | None = None) -> frozenset[str] | str:
        """The nodes of ``among`` (default: every node) where ``claims`` could be allocated
        if nothing were in use, or why none (the reason given on the first node that has
        devices of their classes)."""
        candidates = frozenset(self.nodes) if among is None else among
        shape = (_shape(claims), candidates)
        known = self._feasible.get(shape)
        if known is not None:
            return known
        nodes: set[str] = set()
        why, fatal = "", ""
        for name in sorted(candidates):
            got = allocate(claims, devices=self.node_devices(name), classes=self.classes, in_use=InUse(),
                           selector_cache=self.selectors)
            if isinstance(got, Allocated):
                nodes.add(name)
            elif got.fatal:
                # the claims are wrong as written: kube-scheduler fails the pod, not the node
                fatal = got.reason
                break
            elif not why or "no device" not in got.reason:
                why = got.reason
        result: frozenset[str] | str = (
            fatal or (frozenset(nodes) if nodes else explain.no_devices_anywhere(len(candidates), why))
        )
        self._feasible[shape] = result
        return result

    # -- bound pods: what their claims hold --------------------------------------------------

    def hold(self, pod: Pod) -> Pod:
        """A bound pod, with the devices its allocated claims hold in its requests (per
        class column), so that they count where it runs: its queue's usage, and what
        evicting it frees. A claim several pods share is charged to the first pod it is
        reserved for; a share of a device (consumable capacity) holds no whole device."""
        counts: dict[str, int] = {}
        for entry in pod.resource_claims:
            claim = self.claims.get((pod.namespace, entry.claim)) if entry.claim else None
            if claim is None or claim.allocation is None:
                continue
            first = next((r.get("uid") for r in claim.reserved_for), None)
            if first != pod.uid:
                continue
            for column, n in _held(claim).items():
                counts[column] = counts.get(column, 0) + n
        counts.update(self.named(counts))
        on_node = dict(counts)
        made = self.claims.get(self.extended_of[pod.uid]) if pod.uid in self.extended_of else None
        if made is not None and made.allocation is not None:
            # its containers' requests charge the extended resources already (the node
            # counts them beside the class's devices); the class columns are charged here
            asked = {r for a in pod.extended for r, _ in a.extended}
            by_class = {k: r for r, k in self.served().items() if r in asked}
            for column, n in _held(made).items():
                on_node[column] = on_node.get(column, 0) + n
                resource = by_class.get(column[len(CLASS_COLUMN):])
                if resource is not None and resource != column:
                    on_node[resource] = on_node.get(resource, 0) + n
                if resource != column:
                    counts[column] = counts.get(column, 0) + n
        self._set_holding(pod.uid, (pod.node_name, on_node) if on_node else None)
        return replace(pod, requests={**pod.requests, **counts}) if counts else pod

    def release_holder(self, uid: PodUID) -> None:
        """The bound pod ``uid`` is gone or finished: it holds nothing any more."""
        self._set_holding(uid, None)

    def forget_holders(self) -> None:
        """Before a relist of every pod: the holders are counted anew."""
        for uid in list(self.holding):
            self._set_holding(uid, None)

    def take_held_nodes(self) -> set[str]:
        """The nodes whose held devices changed since the last call."""
        out, self._held_nodes = self._held_nodes, set()
        return out

    def _set_holding(self, uid: PodUID, now: tuple[str, dict[str, int]] | None) -> None:
        old = self.holding.get(uid)
        if old == now:
            return
        for held, sign in ((old, -1), (now, 1)):
            if held is None:
                continue
            node, counts = held
            on = self._held_on.setdefault(node, {})
            for column, n in counts.items():
                on[column] = on.get(column, 0) + sign * n
            self._held_nodes.add(node)
        if now is None:
            self.holding.pop(uid, None)
        else:
            self.holding[uid] = now

    # -- the cycle ---------------------------------------------------------------------------

    def begin(self, units: Iterable[Any]) -> DeviceCycle | None:
        """The device use of a cycle over ``units`` (None when none of their pods has claims)."""
        if not any(p.resource_claims or (p.extended and self.served()) for u in units for p in u.pods):
            self._cycle = None
            return None
        self._cycle = DeviceCycle(self)
        return self._cycle

    def assume(self, b: Binding) -> None:
        """A binding handed to the binder: the allocations it writes are in use meanwhile."""
        if not b.claims or self._cycle is None:
            return
        for w in b.claims:
            delta = self._cycle.made.get((w.namespace, w.name))
            if delta is not None and w.allocation is not None:
                self.assumed[(w.namespace, w.name)] = (PodUID(b.uid), delta)

    def forget(self, uid: PodUID) -> None:
        """The pod ``uid`` was not bound: its allocations in flight are not in use (the
        nodes they were on may serve pods refused there)."""
        gone = [k for k, (u, _) in self.assumed.items() if u == uid]
        for key in gone:
            del self.assumed[key]
        if gone:
            self.refused.clear()


class DeviceCycle:
    """One cycle's use of the devices: what is in use when it starts, plus what it
    allocated so far (given back when an attempt is discarded)."""

    def __init__(self, book: DeviceBook) -> None:
        self.book = book
        self.base = book.in_use()
        self.use = self.base
        #: claim -> what the allocation made in this cycle holds
        self.made: dict[ClaimKey, InUse] = {}

    def allocate(self, pod: Pod, node: str) -> tuple[ClaimWrite, ...] | str:
        """``pod``'s claims allocated on ``node`` (and reserved for it), or why not."""
        book, claims = self.book, []
        for entry in pod.resource_claims:
            claim = book.claims.get((pod.namespace, entry.claim))
            if claim is None:
                return explain.claim_missing(f"{pod.namespace}/{entry.claim}")
            claims.append(claim)
        made = _extended_claim(pod, book.extended_here(pod, node))
        if isinstance(made, str):
            return made
        if made is not None:
            claims.append(made[0])
        if not claims:
            return ()
        got = allocate(claims, devices=book.node_devices(node), classes=book.classes, in_use=self.use,
                       pod_uid=pod.uid, selector_cache=book.selectors)
        if not isinstance(got, Allocated):
            book.refuse([c for c in claims if c.allocation is None], node, got.reason)
            return got.reason
        self.use = self.use.plus(got.delta)
        writes = []
        for claim, result in zip(claims, got.claims, strict=True):
            key = (claim.namespace, claim.name)
            if result.new:
                self.made[key] = _delta_of(got.delta, result, book, node)
            if made is not None and claim is made[0]:
                writes.append(ClaimWrite(
                    namespace=claim.namespace, name=claim.name, uid="", resource_version="",
                    allocation=result.allocation, reserved_for=(_reservation(pod),),
                    create=made[1], mappings=made[2],
                ))
                continue
            mine = any(r.get("uid") == pod.uid for r in claim.reserved_for)
            writes.append(ClaimWrite(
                namespace=claim.namespace, name=claim.name, uid=claim.uid,
                resource_version=claim.resource_version,
                allocation=result.allocation if result.new else None,
                reserved_for=claim.reserved_for if mine else (*claim.reserved_for, _reservation(pod)),
                reserved_before=claim.reserved_for,
            ))
        return tuple(writes)

    def release(self, writes: Sequence[ClaimWrite]) -> None:
        """Give back what :meth:`allocate` took for ``writes``."""
        for w in writes:
            self.made.pop((w.namespace, w.name), None)
        use = self.base
        for delta in self.made.values():
            use = use.plus(delta)
        self.use = use


def by_count(gpus: int) -> dict[str, int]:
    """The columns ``gpus`` whole ``nvidia.com/gpu`` handed out by count take."""
    return {NVIDIA_GPU: gpus, **ask_requests((CardAsk("", whole=gpus),), 0)}


def _extended_claim(
    pod: Pod, served: Mapping[str, str],
) -> tuple[ResourceClaim, Mapping[str, Any], tuple[Mapping[str, str], ...]] | str | None:
    """The claim to make for ``pod``'s extended resources that DRA devices serve
    (``served``: resource -> class), as the allocator reads it (named by its in-flight
    key), its body to create, and the request mappings; None when none is needed; why
    not, when no such claim could be made (more devices than a claim may hold)."""
    if not served:
        return None
    requests, mappings = claim_requests(pod.extended, served)
    if not requests:
        return None
    total = sum(int(r["exactly"]["count"]) for r in requests)
    if total > MAX_RESULTS_PER_CLAIM:
        return explain.extended_too_many(total, MAX_RESULTS_PER_CLAIM)
    body = claim_body(pod.namespace, pod.name, pod.uid, requests)
    readable = {**body, "metadata": {"name": EXTENDED_IN_FLIGHT + pod.uid, "namespace": pod.namespace}}
    try:
        return parse_resource_claim(readable), body, tuple(mappings)
    except DraError as exc:
        return str(exc)


def _delta_of(delta: InUse, result: Any, book: DeviceBook, node: str) -> InUse:
    """What one claim's new allocation holds (the allocator's delta is the pod's, over all
    its claims): rebuilt from the allocation written, as a restart would."""
    from batchsched.core.dra.objects import parse_allocation

    allocation = parse_allocation(result.allocation, f"claim {result.claim}")
    fake = ResourceClaim(namespace="", name=result.claim, uid="", requests=(), allocation=allocation)
    return in_use_from_claims([fake], book.pools)


def _shape(claims: Sequence[ResourceClaim]) -> str:
    """What decides where unallocated ``claims`` may go: their requests, constraints and
    configuration (claims made from one template share it)."""
    return repr([(c.requests, c.constraints, c.config) for c in claims])


def _asks(claim: ResourceClaim, shareable: frozenset[str]) -> dict[str, int]:
    """The devices an unallocated claim asks for, per class column: its ``exactly``
    requests of ``ExactCount`` for whole devices. Not a request of capacity, nor one of a
    class of ``shareable`` (either may be served by a share of a device several claims
    use, which a count of devices cannot tell: :func:`_held` counts no share either, and
    two requests of one claim may both be served by shares of one device). Nor a request
    with tolerations: it may get a tainted device, which the columns never count free."""
    out: dict[str, int] = {}
    for r in claim.requests:
        if r.first_available or len(r.choices) != 1:
            continue
        c = r.choices[0]
        if c.all_devices or c.admin_access or c.capacity is not None or c.class_name in shareable or c.tolerations:
            continue
        out[class_column(c.class_name)] = out.get(class_column(c.class_name), 0) + c.count
    return out


def _held(claim: ResourceClaim) -> dict[str, int]:
    """The whole devices an allocated claim holds, per class column (from the class of the
    request, or subrequest, each result answers)."""
    classes = {c.name: c.class_name for r in claim.requests for c in r.choices}
    out: dict[str, int] = {}
    for r in claim.allocation.results if claim.allocation is not None else ():
        name = classes.get(r.request)
        if name is None or r.share_id is not None or r.admin_access:
            continue
        out[class_column(name)] = out.get(class_column(name), 0) + 1
    return out


#: what a selector may read of a device for :func:`_shape` to know it: the driver, whether it
#: allows multiple allocations, and attributes named in full (``device.attributes["d"].n``)
_READ = re.compile(
    r"""\bdevice\s*\.\s*(?:(driver|allowMultipleAllocations)\b|attributes\s*\[\s*(["'])([^"'\\]+)\2\s*\]\s*\.\s*([A-Za-z_][A-Za-z0-9_]*))"""
)
_DEVICE = re.compile(r"\bdevice\b")


@functools.lru_cache(maxsize=1024)
def _reads(expression: str) -> tuple[str, ...] | None:
    """What ``expression`` reads of a device (``driver``, ``allowMultipleAllocations``, or a
    fully qualified attribute name), when that is all it reads; None when it reads more
    (capacity, the attribute maps whole, anything not named in full)."""
    found = [m.group(1) or f"{m.group(3)}/{m.group(4)}" for m in _READ.finditer(expression)]
    if len(found) != len(_DEVICE.findall(expression)):
        return None
    return tuple(sorted(set(found)))


def _device_shape(c: DeviceClass, device: Device) -> tuple[Any, ...] | None:
    """The class and the values of ``device`` its selectors read, or None when they read
    what :func:`_reads` cannot tell."""
    names: set[str] = set()
    for e in c.selectors:
        read = _reads(e)
        if read is None:
            return None
        names.update(read)
    values: list[Any] = [c.name]
    for name in sorted(names):
        if name == "driver":
            values.append(device.driver)
        elif name == "allowMultipleAllocations":
            values.append(device.allow_multiple)
        else:
            value = device.attributes.get(name)
            values.append(tuple(sorted(value.items())) if value is not None else None)
    return tuple(values)


def _counters_left(here: NodeDevices, use: InUse) -> dict[CounterId, Decimal]:
    left: dict[CounterId, Decimal] = {}
    for (driver, pool), sets in here.counter_sets.items():
        for set_name, counters in sets.items():
            for name, total in counters.items():
                key = CounterId(driver, pool, set_name, name)
                left[key] = total - use.counters.get(key, Decimal(0))
    return left


def _free(device: Device, use: InUse, left: Mapping[CounterId, Decimal]) -> bool:
    """Whether ``device`` could be handed out now, alone."""
    if device.id in use.devices or device.binding_conditions:
        return False
    if any(t.effect in _BLOCKING for t in device.taints):
        return False
    if device.id in use.shared:
        return device.allow_multiple
    for u in device.consumes:
        for name, need in u.counters.items():
            if left.get(CounterId(device.driver, device.pool, u.counter_set, name), Decimal(0)) < need:
                return False
    return True
