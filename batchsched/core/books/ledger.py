"""The bind ledger: pods handed to the binder, until the watch shows them bound.

A pod the cycle placed is *assumed* (charged to its node in the mirror) at once. The
ledger keeps when each was assumed: a binding the apiserver accepted that the watch never
confirmed within the assumed timeout is read again. A Binding whose answer was lost (a
conflict, no answer) may have landed: the pod is *in doubt*, held charged where it was
given until it has been read again. Card assignments no binding followed (*stale*) are
asked to be removed, and asked again after the assumed timeout if the watch never shows
the pod clean.

The ledger only says what happened (a pod is not bound after all); the caller routes that
to the class index, the gangs and the back-off.
"""

from __future__ import annotations

from batchsched.core.decisions import Decisions, PodScheduledNote, pod_ref
from batchsched.core.devices import stale_keys
from batchsched.core.mirror import ClusterState
from batchsched.core.model import PodUID
from batchsched.core.plan import Binding

__all__ = ["BindLedger"]


class BindLedger:
    """Assumed pods, pods in doubt and stale cleanups (one writer: this module)."""

    def __init__(self, *, assumed_timeout: float, scheduled_events: bool) -> None:
        self.assumed_timeout = assumed_timeout
        self.scheduled_events = scheduled_events
        self._assumed_at: dict[PodUID, float] = {}
        #: assumed pods whose Binding's outcome is in doubt, held until read again
        self._in_doubt: set[PodUID] = set()
        #: stale card assignments whose removal was asked for, and when
        self._cleanup_at: dict[PodUID, float] = {}

    def assumed(self, uid: PodUID, now: float) -> None:
        """The pod was handed to the binder at ``now``: its Binding waits its turn in the
        binder's queue (minutes, when a first step hands over tens of thousands), so the
        watch has nothing to confirm yet; the wait for it starts when the apiserver has
        accepted the Binding (:meth:`bind_result`), as in kube-scheduler's cache."""
        self._assumed_at.pop(uid, None)

    def settled(self, uid: PodUID) -> None:
        """The pod is bound, gone, or pending again: nothing of it to follow."""
        self._assumed_at.pop(uid, None)
        self._in_doubt.discard(uid)

    def cleaning(self, uid: PodUID) -> bool:
        """Whether the removal of the pod's stale card assignment was asked for."""
        return uid in self._cleanup_at

    def bind_result(self, b: Binding, outcome: str, *, now: float, state: ClusterState) -> tuple[Decisions, bool]:
        """A Binding's outcome (see :meth:`~batchsched.core.session.Session.on_bind_result`):
        the decisions it leads to, and whether the pod is not bound (pending again)."""
        out = Decisions()
        uid = PodUID(b.uid)
        if outcome == "bound":
            if uid in state.assumed:  # not shown bound by the watch yet: wait for it from now
                self._assumed_at[uid] = now
            if self.scheduled_events:
                out.scheduled.append(PodScheduledNote(pod_ref(b), b.node, b.where))
            return out, False
        if outcome in ("conflict", "unknown") and uid in state.assumed:
            self._in_doubt.add(uid)
            self._assumed_at[uid] = now
            out.resyncs.append(pod_ref(b))
            return out, False
        self.settled(uid)
        if outcome == "conflict":
            out.resyncs.append(pod_ref(b))
        return out, True

    def read_again(self, uid: PodUID, state: ClusterState) -> bool:
        """A pod in doubt was read again: whether its binding did not happen (it is still
        unbound)."""
        if uid not in self._in_doubt:
            return False
        self._in_doubt.discard(uid)
        pod = state.pods.get(uid)
        if uid in state.assumed and pod is not None and not pod.node_name:
            self.settled(uid)
            return True
        return False

    def check_assumed(self, state: ClusterState, now: float, out: Decisions) -> None:
        """A binding the apiserver accepted that the watch has not confirmed within the
        assumed timeout: read it again (and again each timeout while it stays so)."""
        limit = self.assumed_timeout
        for uid, since in list(self._assumed_at.items()):
            if now - since > limit and uid in state.assumed:
                pod = state.pods.get(uid)
                self._assumed_at[uid] = now
                if pod is not None:
                    out.resyncs.append(pod_ref(pod))

    def clean_stale(self, state: ClusterState, now: float, out: Decisions) -> None:
        """Ask for the removal of card assignments no binding followed; again after the
        assumed timeout if the watch never shows the pod clean."""
        for uid, pod in state.stale.items():
            asked = self._cleanup_at.get(uid)
            if asked is not None and now - asked < self.assumed_timeout:
                continue
            self._cleanup_at[uid] = now
            notes, labels = stale_keys(pod.annotations, pod.labels)
            if notes or labels:
                out.cleanups.append((pod_ref(pod), notes, labels))
            if pod.stale_claim is not None:
                out.claim_deletes.append(pod.stale_claim)
        for uid in [u for u in self._cleanup_at if u not in state.stale]:
            del self._cleanup_at[uid]
