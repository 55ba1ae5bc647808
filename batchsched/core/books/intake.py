"""Pod intake: each pod as the scheduler reads it, before anything else sees it.

A pod event is *admitted* before it reaches the mirror: it is given its place in line
among the pods created in the same second (:class:`~batchsched.core.model.Arrivals`), the
tolerations of the nodes' GPU health taints it implies, and, pending with volume or
resource claims, the node terms its claims allow (:mod:`batchsched.core.volumes`) and
the devices they ask for (:mod:`batchsched.core.dra`). The
pods with claims are kept as parsed: when a claim, volume or storage class changes, they
are returned to be admitted and routed again. The pods seen to succeed are kept until the
next step, which records how long they ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from batchsched.core.dra.book import DeviceBook
from batchsched.core.model import Arrivals, Pod, PodUID
from batchsched.core.nodehealth import NodeHealthSettings, tolerating_health
from batchsched.core.runtimes import RunTimes, like_key
from batchsched.core.volumes import VolumeBook

__all__ = ["PodIntake"]


class PodIntake:
    """Arrivals, claims and volumes, and the pods that succeeded (one writer: this module)."""

    def __init__(self, health: NodeHealthSettings) -> None:
        self.health = health
        self.volumes = VolumeBook()
        self.devices = DeviceBook()
        #: pending pods with claims, as parsed (their claims are applied again on a change)
        self._claiming: dict[PodUID, Pod] = {}
        #: bound pods with ResourceClaims, as parsed (what their claims hold is read again
        #: when a claim changes)
        self._holding: dict[PodUID, Pod] = {}
        #: ResourceClaim (namespace, name) -> the pods above that use it, and each pod's claims
        self._users: dict[tuple[str, str], set[PodUID]] = {}
        self._uses: dict[PodUID, tuple[tuple[str, str], ...]] = {}
        #: each pod's place in line among those created in the same second
        self._arrivals = Arrivals()
        #: pods seen to succeed since the last step: (like key, start), timed at the step
        self._succeeded: list[tuple[str, float]] = []

    def admit(self, kind: str, pod: Pod, known: Pod | None) -> Pod:
        """The pod as the scheduler reads it (``known``: the version seen before, if any)."""
        return self._with_volumes(kind, tolerating_health(self._arrivals.first_seen(pod, known), self.health))

    def relisted(self, pods: Sequence[Pod], known: Mapping[PodUID, Pod]) -> list[Pod]:
        """A full list of the pods, each admitted (``known``: the versions seen before)."""
        self._claiming.clear()
        self._holding.clear()
        self._users.clear()
        self._uses.clear()
        self.devices.forget_holders()
        return [self.admit("ADDED", p, known.get(p.uid)) for p in pods]

    def _with_volumes(self, kind: str, pod: Pod) -> Pod:
        """A pending pod with volume or resource claims, as its claims let it be placed
        (:mod:`batchsched.core.volumes`); the pod as parsed is kept to look at again."""
        if kind == "DELETED" or pod.node_name or not (pod.claims or pod.resource_claims or pod.extended):
            self._claiming.pop(pod.uid, None)
            return self._with_devices_held(kind, pod)
        self._claiming[pod.uid] = pod
        self._index(pod)
        return self.devices.apply(self.volumes.apply(pod))

    def _index(self, pod: Pod | None, uid: PodUID | None = None) -> None:
        """Which ResourceClaims ``pod`` uses, in the index :meth:`using_devices` reads
        (None: pod ``uid`` is no longer kept)."""
        uid = pod.uid if pod is not None else uid
        assert uid is not None
        now = tuple((pod.namespace, c.claim) for c in pod.resource_claims) if pod is not None else ()
        before = self._uses.get(uid, ())
        if now == before:
            return
        for key in before:
            users = self._users.get(key)
            if users is not None:
                users.discard(uid)
                if not users:
                    del self._users[key]
        for key in now:
            self._users.setdefault(key, set()).add(uid)
        if now:
            self._uses[uid] = now
        else:
            self._uses.pop(uid, None)

    def _with_devices_held(self, kind: str, pod: Pod) -> Pod:
        """A bound pod with ResourceClaims, with the devices its claims hold counted in its
        requests (:meth:`~batchsched.core.dra.book.DeviceBook.hold`)."""
        if kind == "DELETED" or not pod.node_name or pod.terminal or not (pod.resource_claims or pod.extended):
            if self._holding.pop(pod.uid, None) is not None:
                self.devices.release_holder(pod.uid)
            if pod.uid not in self._claiming:
                self._index(None, pod.uid)
            return pod
        self._holding[pod.uid] = pod
        self._index(pod)
        return self.devices.hold(pod)

    def claiming(self, keys: Set[tuple[str, str]]) -> list[Pod]:
        """The pending pods, as parsed, using one of the claims ``keys`` (namespace, name)."""
        return [pod for pod in self._claiming.values() if any((pod.namespace, name) in keys for name in pod.claims)]

    def using_devices(self, keys: Set[tuple[str, str]] | None) -> list[Pod]:
        """The pods, as parsed, using one of the ResourceClaims ``keys`` (namespace, name):
        pending, and bound ones (what they hold is counted from their claims); every pod
        with ResourceClaims when ``keys`` is None."""
        if keys is None:
            return [p for p in (*self._claiming.values(), *self._holding.values()) if p.resource_claims or p.extended]
        uids = {uid for key in keys for uid in self._users.get(key, ())}
        return self.kept(uids)

    def kept(self, uids: Set[PodUID]) -> list[Pod]:
        """The pods ``uids``, as parsed, that are kept here (pending with claims, or bound
        holding devices)."""
        found = (self._claiming.get(uid) or self._holding.get(uid) for uid in sorted(uids))
        return [p for p in found if p is not None]

    def parsed(self, pod: Pod) -> Pod:
        """The pod as parsed (before its claims were applied)."""
        return self._claiming.get(pod.uid) or self._holding.get(pod.uid) or pod

    def ended(self, pod: Pod, group: str | None) -> None:
        """A pod (of the gang ``group``) is no longer charged: if it succeeded, how long it
        ran is recorded at the next step."""
        if pod.phase == "Succeeded" and pod.started:
            self._succeeded.append((like_key(pod, group), pod.started))

    def ran(self, now: float, runtimes: RunTimes) -> None:
        """How long the pods that succeeded since the last step ran, recorded at ``now``."""
        for key, started in self._succeeded:
            runtimes.record(key, now - started)
        self._succeeded.clear()
