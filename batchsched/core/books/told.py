"""What each pending pod was told: its ``PodScheduled`` condition, and its class's word.

A pod is told why it waits when that changes, not at every cycle: the book keeps the
``(reason, message)`` each pod was last told, the word each class of single pods was last
told (pods joining a class that sleeps are told the same at the next step), and when each
blocked gang was first found blocked (members and PodGroups usually arrive together, so a
gang blocked for less than the report delay is not told yet).

Pods that share another unit's outcome (the rest of a class, gangs cut as alike) are told
a new message for the same reason at most every :data:`SHARED_REFRESH_SECONDS`; a new
reason is told at once.

A pod of a RayCluster that made no PodGroup
(:func:`~batchsched.core.gangs.kuberay.ray_cluster_without_group`) is placed one by one:
it is told so by a Warning Event when it is first seen waiting, and so is its RayCluster
(once while any of its pods is known), and its condition, while it waits, ends with the
same note.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from batchsched.core import explain
from batchsched.core.decisions import Decisions, EventNote, PodCondition, pod_ref
from batchsched.core.gangs.kuberay import ray_cluster_without_group
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Pod, PodUID
from batchsched.core.plan import Plan, Unit
from batchsched.core.reservation import RESERVED

__all__ = ["SHARED_REFRESH_SECONDS", "ToldBook"]

#: pods that share another unit's outcome (the rest of a class) are told a new message
#: for the same reason at most this often (a new reason at once)
SHARED_REFRESH_SECONDS = 60.0


class ToldBook:
    """What each pod, class of single pods and blocked gang was told (one writer: this module)."""

    def __init__(self) -> None:
        #: pending pod -> the (reason, message) of the PodScheduled condition it was last
        #: told, and when it was last told a shared one
        self._told: dict[PodUID, tuple[str, str, float]] = {}
        #: class key -> the (reason, message, when) its members not handed over were told
        self._class_told: dict[Any, tuple[str, str, float]] = {}
        #: pods that joined a sleeping class after it was told why: told at the next step
        self._joined: set[PodUID] = set()
        #: group unit key -> when it was first found blocked (its pods are told after a delay)
        self._blocked_since: dict[str, float] = {}
        #: pods told they are placed one by one -> their RayCluster's UID; each such
        #: cluster's pods told (the cluster was told when the first of them was)
        self._by_pod: dict[PodUID, str] = {}
        self._clusters: dict[str, set[PodUID]] = {}
        #: Events decided on intake, written at the next step
        self._notes: list[EventNote] = []

    def forget_pods(self) -> None:
        """A full list of the pods: what they say is read from them again."""
        self._told.clear()

    def moved(self, uid: PodUID, *, pending: bool, before: Any, after: Any) -> None:
        """A pod's place in the class index changed from ``before`` to ``after`` (None: in
        no class); ``pending``: whether it still waits."""
        if not pending:
            self._told.pop(uid, None)
        if after is not None and after != before and after in self._class_told:
            self._joined.add(uid)

    def tell(self, out: Decisions, pod: Pod, reason: str, message: str, *, shared_at: float | None = None) -> None:
        """A pending pod's ``PodScheduled`` condition, when it says something new.
        ``shared_at``: the pod shares another unit's outcome; a new message for the same
        reason is told at most every :data:`SHARED_REFRESH_SECONDS`. A pod of a RayCluster
        without a PodGroup has the note that it is placed one by one after the message."""
        cluster = ray_cluster_without_group(pod)
        if cluster is not None:
            message = explain.with_note(message, explain.ray_pod_by_pod(f"{cluster.namespace}/{cluster.name}"))
        before = self._told.get(pod.uid)
        if before is None and pod.shows is not None:
            before = (*pod.shows, 0.0)  # what it says since before we started (or relisted)
        if before is not None and before[:2] == (reason, message):
            self._told[pod.uid] = before
            return
        if shared_at is not None and before is not None and before[0] == reason and (
                shared_at - before[2] < SHARED_REFRESH_SECONDS):
            return
        self._told[pod.uid] = (reason, message, shared_at if shared_at is not None else before[2] if before else 0.0)
        out.unschedulable.append(PodCondition(pod_ref(pod), reason, message))

    def unplaced(
        self, plan: Plan, gangs: Mapping[str, Unit], now: float, out: Decisions, *, delay: float,
        turned: Collection[str], class_of: Callable[[PodUID], Any],
        gang_message: Callable[[str, str, str, float], str],
    ) -> tuple[dict[Any, tuple[str, str, Pod]], set[Any]]:
        """The pods the cycle did not place, told why: a blocked gang's only once it was
        blocked for ``delay``, a gang's through ``gang_message(key, reason, message, now)``
        (:meth:`~batchsched.core.books.statuses.GroupReports.pod_message`), a fair turn's
        (``turned``) nothing new. Returns the classes of single pods that failed (their word
        and a member) and those a victim search is owed to (they do not sleep)."""
        failed: dict[Any, tuple[str, str, Pod]] = {}
        reserved: dict[Any, tuple[str, str, Pod]] = {}
        awake: set[Any] = set()
        for u in plan.unschedulable:
            unit = gangs.get(u.unit)
            message = u.message
            if unit is None:
                ckey = class_of(u.pod.uid)
                if u.unit in plan.deferred:
                    awake.add(ckey)  # its victim search is owed: next cycle
                elif u.reason == RESERVED:
                    reserved[ckey] = (u.reason, message, u.pod)
                elif ckey is not None:
                    failed[ckey] = (u.reason, message, u.pod)
            elif unit.blocked and self.too_early(unit.key, now, delay):
                continue  # members and PodGroups usually arrive together: do not report yet
            elif u.reason == RESERVED or _failed_with(plan, unit.key, message):
                message = gang_message(unit.key, u.reason, message, now)
            if u.unit not in turned:
                self.tell(out, u.pod, u.reason, message)
        for ckey, (_, _, head) in reserved.items():
            # its head holds a reservation: it sleeps too, and the rest are told they wait behind it
            failed.setdefault(ckey, ("Unschedulable", explain.behind(f"pod {head.key}"), head))
        return failed, awake

    # -- pods placed one by one though their maker runs gangs -------------------------------------

    def seen(self, kind: str, pod: Pod, *, ours: bool) -> None:
        """A pod event (``ours``: the pod names one of our schedulers): a waiting pod of a
        RayCluster without a PodGroup is told so by an Event, once, and so is the cluster."""
        if kind == "DELETED":
            self._unseen(pod.uid)
            return
        if pod.uid in self._by_pod or not ours or pod.node_name or pod.terminal or pod.deleting:
            return
        cluster = ray_cluster_without_group(pod)
        if cluster is None:
            return
        message = explain.ray_pod_by_pod(f"{cluster.namespace}/{cluster.name}")
        members = self._clusters.setdefault(cluster.uid, set())
        if not members:
            self._notes.append(EventNote(cluster, "Warning", explain.NO_POD_GROUP, message))
        members.add(pod.uid)
        self._by_pod[pod.uid] = cluster.uid
        self._notes.append(EventNote(pod_ref(pod), "Warning", explain.NO_POD_GROUP, message))

    def seen_listed(self, pods: Iterable[Pod], ours: Callable[[Pod], bool]) -> None:
        """A full list of the pods: those gone are forgotten, the others seen."""
        pods = list(pods)
        present = {p.uid for p in pods}
        for uid in [u for u in self._by_pod if u not in present]:
            self._unseen(uid)
        for pod in pods:
            self.seen("ADDED", pod, ours=ours(pod))

    def _unseen(self, uid: PodUID) -> None:
        cluster = self._by_pod.pop(uid, None)
        if cluster is None:
            return
        members = self._clusters.get(cluster, set())
        members.discard(uid)
        if not members:
            self._clusters.pop(cluster, None)

    def notes(self, out: Decisions) -> None:
        """The Events decided on intake since the last step."""
        out.events.extend(self._notes)
        self._notes.clear()

    def tell_joined(
        self, out: Decisions, pending: Mapping[PodUID, Pod], class_of: Callable[[PodUID], Any],
        asleep: Callable[[Any], bool],
    ) -> None:
        """Pods that joined a class after it was told why it waits: told the same
        (``asleep(class key)``: whether the class still sleeps)."""
        for uid in self._joined:
            ckey = class_of(uid)
            told = self._class_told.get(ckey)
            if told is not None and asleep(ckey):
                self.tell(out, pending[uid], told[0], told[1])
        self._joined.clear()

    def tell_classes(
        self, failed: Mapping[Any, tuple[str, str]], cut: Collection[Any],
        members_after: Callable[[Any], Iterable[Pod]], now: float, out: Decisions,
    ) -> None:
        """Classes of single pods that failed: their members the cycle was not handed
        (``members_after(class key)``, of the classes ``cut``) are told the same, once per
        change of message; the class's word is kept for the pods that join it."""
        for ckey, (reason, message) in failed.items():
            before = self._class_told.get(ckey)
            told_at = before[2] if before is not None else -1e18
            if ckey in cut and (before is None or before[0] != reason or (
                    before[1] != message and now - told_at >= SHARED_REFRESH_SECONDS)):
                told_at = now
                for member in members_after(ckey):
                    self.tell(out, member, reason, message)
            # the latest word (pods joining the class are told it), and when all were told
            self._class_told[ckey] = (reason, message, told_at)

    def prune_classes(self, live: Collection[Any]) -> None:
        """Forget the word of classes gone (when the book grew past twice the ``live`` ones)."""
        if len(self._class_told) > 2 * len(live) + 64:
            self._class_told = {k: v for k, v in self._class_told.items() if k in live}

    def tell_shared(self, pods: Iterable[Pod], reason: str, message: str, now: float, out: Decisions) -> None:
        """Pods that share another unit's outcome, told it (see :meth:`tell`)."""
        for pod in pods:
            self.tell(out, pod, reason, message, shared_at=now)

    def last_word(self, key: str, state: ClusterState) -> tuple[str, str] | None:
        """The ``(reason, message)`` the single pod ``key`` (``namespace/name``) was last
        told, or its condition says since before we started; None: nothing yet."""
        uid = state.by_name.get(tuple(key.split("/", 1)))  # type: ignore[arg-type]
        told = self._told.get(uid) if uid is not None else None
        if told is not None:
            return told[0], told[1]
        pod = state.pending.get(uid) if uid is not None else None
        return pod.shows if pod is not None else None

    # -- blocked gangs ------------------------------------------------------------------------

    def too_early(self, key: str, now: float, delay: float) -> bool:
        """Whether a blocked gang was first found blocked less than ``delay`` ago (its pods
        are not told yet: members and PodGroups usually arrive together)."""
        return now - self._blocked_since.setdefault(key, now) < delay

    def keep_blocked(self, blocked: Callable[[str], bool]) -> None:
        """Forget the gangs ``blocked(key)`` says are no longer blocked (or gone)."""
        for key in [k for k in self._blocked_since if not blocked(k)]:
            del self._blocked_since[key]


def _failed_with(plan: Plan, key: str, message: str) -> bool:
    """Whether ``key`` failed in ``plan`` with ``message`` (the gang's own message, not an
    elastic extra's)."""
    result = plan.results.get(key)
    return result is not None and result.failed and result.message == message
