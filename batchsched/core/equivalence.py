"""Equivalence classes: pods (and gangs) the scheduler may decide for all at once.

Two pending single pods are *equivalent* when everything placement reads of them is the
same: namespace (which queue it defaults to), priority and preemption policy, requests,
what decides the nodes it may use (:meth:`Pod.constraint_key`: selectors, affinity, tolerations, spread and inter-pod
terms with the labels they read), its card asks, its deadline and the annotations placement
reads (:data:`READ_ANNOTATIONS`), and its ``batchsched.io/queue`` label. Pods from one
template (a Job's, a PyTorchJob replica's, a RayCluster worker group's) are equivalent; two
pods whose only difference is a completion index or a name are too.

What that buys, with usage only growing along a cycle's walk:

- **in a cycle**: once one member of a class fails to fit (and could not preempt), every
  later member would fail the same way: the rest of the class is told the same message
  (built once), without a kernel call or a victim search;
- **between cycles**: a class that failed sleeps as one entry (:mod:`batchsched.core.requeue`);
  a new pod joining it waits with it (it is behind the members that failed: same priority,
  later or equal age), and only the members that could fit in the free capacity are handed
  to the next cycle (:func:`fit_count`).

A pod's labels are read by other pods' rules too: a required anti-affinity term of a pod
placed (or placed earlier in the cycle) forbids the domains around it to every pod its
selector matches, whatever rules that pod has of its own. So the class holds a pod's values
of every label key such a term selects on (:class:`SingleIndex` keeps the keys read by the
anti-affinity of every pod seen, and keys its classes anew when a new key appears: a pass
over the pending pods, once per new key, not per event). Other pods' spread constraints
read a pod's labels only when *they* are placed (a pod is never refused for another pod's
spread), so they split no class.

A pod that is invalid, gated, or has volume or resource claims (each decided against its
own claims) is a class of its own. Gangs are compared member by member (:func:`unit_class`):
identical gangs (the same job submitted many times) are one class too; a gang with members
already placed, or blocked before placement, is its own.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from sortedcontainers import SortedKeyList

from batchsched.core.devices import POLICY_ANNOTATION
from batchsched.core.gangs.podgroup import ANNOTATION_TASK
from batchsched.core.model import Pod, PodUID
from batchsched.core.placement.podtopology import constrained
from batchsched.core.placement.topology import TOPOLOGY_ANNOTATION, TOPOLOGY_PREFERRED_ANNOTATION
from batchsched.core.plan import Unit
from batchsched.core.queues import QUEUE_LABEL
from batchsched.core.reservation import RUNTIME_ANNOTATION

__all__ = [
    "READ_ANNOTATIONS", "ClassKey", "SingleIndex", "arrival_order", "fit_count", "gang_like", "label_keys_read",
    "own_class", "pod_class", "unit_class",
]

IntArray = npt.NDArray[np.int64]

#: the pod annotations placement reads (every other annotation is left out of the class)
READ_ANNOTATIONS = (
    RUNTIME_ANNOTATION, POLICY_ANNOTATION, TOPOLOGY_ANNOTATION, TOPOLOGY_PREFERRED_ANNOTATION, ANNOTATION_TASK,
)


class ClassKey:
    """A class's key: a tuple of what decides placement, hashed once (the tuples nest
    deep, and a key is looked up many times per step)."""

    __slots__ = ("_hash", "parts")

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClassKey) and self._hash == other._hash and (
            self.parts is other.parts or self.parts == other.parts)

    def __repr__(self) -> str:
        return f"ClassKey{self.parts!r}"


def label_keys_read(pod: Pod) -> frozenset[str]:
    """The label keys ``pod``'s required anti-affinity terms read of *other* pods: the keys
    of their selectors, and their ``matchLabelKeys`` / ``mismatchLabelKeys`` (which select
    on the same key of the other pod)."""
    keys: set[str] = set()
    for term in pod.anti_affinity_terms:
        if term.selector is not None:
            keys.update(term.selector.match_labels)
            keys.update(r.key for r in term.selector.expressions)
        keys.update(term.match_label_keys)
        keys.update(term.mismatch_label_keys)
    return frozenset(keys)


def pod_class(pod: Pod, read: tuple[str, ...] = ()) -> Hashable:
    """The class of a pending pod (see the module docstring). ``read``: the label keys other
    pods' anti-affinity reads (sorted); a pod with terms of its own has all its labels in
    its :meth:`~batchsched.core.model.Pod.constraint_key` already."""
    if pod.invalid or pod.gated or pod.claims or pod.resource_claims:
        return ClassKey(("pod", pod.uid))
    notes = pod.annotations
    labels = pod.labels
    return ClassKey((
        pod.namespace, pod.priority, pod.never_preempts, tuple(sorted(pod.requests.items())), pod.constraint_key(),
        pod.card_asks, pod.active_deadline, labels.get(QUEUE_LABEL, ""),
        tuple([notes.get(k) for k in READ_ANNOTATIONS]) if notes else _NO_NOTES,
        tuple([labels.get(k) for k in read]) if read and not constrained(pod) else (),
    ))


#: what :func:`pod_class` reads of a pod without annotations
_NO_NOTES = (None,) * len(READ_ANNOTATIONS)


def own_class(key: Hashable) -> bool:
    """Whether ``key`` is the class of one pod alone (any change to it may matter)."""
    return isinstance(key, ClassKey) and key.parts[0] == "pod"


def unit_class(unit: Unit, of_pod: Any = pod_class) -> Hashable:
    """The class of a unit: its pod's for a single pod; for a gang its shape (quorum,
    priority, topology) and its members' classes. ``of_pod``: the pod class to use (a cached
    one)."""
    if unit.single:
        single: Hashable = of_pod(unit.pods[0])
        return single
    if unit.blocked or unit.min_resources_short or unit.placed_on:
        return ClassKey(("unit", unit.key))
    return ClassKey(("gang", unit.min_count, unit.priority, unit.never_preempts, unit.topology_level,
                     unit.topology_required, tuple([of_pod(p) for p in unit.pods])))


def gang_like(key: Hashable) -> bool:
    """Whether ``key`` is a gang's class that other gangs may share."""
    return isinstance(key, ClassKey) and key.parts[0] == "gang"


def arrival_order(pod: Pod) -> tuple[float, int, str]:
    """First come, first served: creation time, then the order the watch delivered the pod
    (:attr:`~batchsched.core.model.Pod.arrival`); the UID only keeps the order total."""
    return (pod.created, pod.arrival, pod.uid)


class SingleIndex:
    """The pending single pods of each class, oldest first: kept as pods come and go, so
    a step reads the classes, not every pending pod.

    It also keeps :attr:`read`, the label keys any pod's anti-affinity selects on (see the
    module docstring): :meth:`reads` adds a pod's, and keys every class anew when one is
    new. Keys are not dropped when their last reader goes (a finer split stays correct, and
    a reader that comes and goes does not cost a pass each time); :meth:`clear` (a relist)
    forgets them, and the listed pods' are read again."""

    def __init__(self) -> None:
        self.classes: dict[Hashable, SortedKeyList] = {}
        self._keys: dict[Hashable, Hashable] = {}
        self._of: dict[PodUID, tuple[Hashable, Pod]] = {}
        #: the label keys other pods' anti-affinity reads, sorted
        self.read: tuple[str, ...] = ()

    def reads(self, pod: Pod) -> bool:
        """Note the label keys ``pod``'s anti-affinity reads of other pods; True when one is
        new, and the index was keyed anew (every class key changed)."""
        if not pod.anti_affinity_terms:
            return False
        keys = label_keys_read(pod)
        if keys.issubset(self.read):
            return False
        self.read = tuple(sorted(keys.union(self.read)))
        entries = [(uid, pod) for uid, (_, pod) in self._of.items()]
        self.classes.clear()
        self._keys.clear()
        self._of.clear()
        for uid, member in entries:
            self.put(uid, member)
        return True

    def __len__(self) -> int:
        return len(self._of)

    def class_of(self, uid: PodUID) -> Hashable | None:
        entry = self._of.get(uid)
        return None if entry is None else entry[0]

    def put(self, uid: PodUID, pod: Pod | None) -> None:
        """``pod`` is pending and placed alone (None: it is not, or no more)."""
        old = self._of.get(uid)
        if old is not None:
            if pod is old[1]:
                return
            members = self.classes[old[0]]
            members.remove(old[1])
            if not members:
                del self.classes[old[0]]
                del self._keys[old[0]]
            del self._of[uid]
        if pod is None:
            return
        key = pod_class(pod, self.read)
        members = self.classes.get(key)
        if members is None:
            members = self.classes[key] = SortedKeyList(key=arrival_order)
            self._keys[key] = key
        else:
            key = self._keys[key]  # one key object per class, shared by its members
        members.add(pod)
        self._of[uid] = (key, pod)

    def clear(self) -> None:
        self.classes.clear()
        self._keys.clear()
        self._of.clear()
        self.read = ()

    def items(self) -> Iterator[tuple[Hashable, SortedKeyList]]:
        return iter(self.classes.items())

    def nominated(self, skip: Collection[PodUID]) -> list[PodUID]:
        """The members carrying ``status.nominatedNodeName`` (read once after a start)."""
        return [uid for uid, (_, pod) in self._of.items() if pod.nominated_node and uid not in skip]


def fit_count(free: IntArray, columns: dict[str, int], requests: dict[str, int] | Any) -> int:
    """At most how many pods asking ``requests`` fit on nodes with ``free`` capacity (one
    row per node), each node taken alone: an upper bound (node constraints, other pods,
    quota and reservations only lower it). -1: no bound (the pod asks nothing counted)."""
    idx = [(columns[name], value) for name, value in requests.items() if value > 0 and name in columns]
    if not idx:
        return -1
    per_node: npt.NDArray[np.int64] | None = None
    for col, value in idx:
        n = np.maximum(free[:, col], 0) // value
        per_node = n if per_node is None else np.minimum(per_node, n)
    assert per_node is not None
    return int(per_node.sum())
