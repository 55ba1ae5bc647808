"""No partial gang survives: the gang timers, the back-off after a timeout, and whole-job restart.

A group that holds resources with fewer than ``minMember`` members placed is given
``scheduleTimeoutSeconds`` to become whole (:meth:`GangTimers.check`); then its bound
members are evicted and the group backs off (exponentially) before it is tried again.
Members that bind during the back-off are evicted at once.

A group runs *whole* once the watch shows its placed quorum bound (:meth:`GangTimers.confirmed`),
not when a cycle places it: a Binding may still be refused, and a job that never ran is
placed again, not restarted. A group seen whole that loses a member (:meth:`GangTimers.lost`)
is checked before the next cycle; if it restarts whole, the rest of it is evicted at once.

:class:`GangTimers` owns the timers and the groups seen whole; which pods belong to which
group, and how they are counted, it is given by the book
(:class:`~batchsched.core.gangs.book.GroupBook`). Pure: no I/O, no clock (``now`` is passed
in, monotonic seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from batchsched.core import explain
from batchsched.core.gangs.podgroup import GroupKey, PodGroup
from batchsched.core.gangs.status import Tally, member_order, runs_whole
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Pod, PodUID
from batchsched.core.plan import Eviction

__all__ = ["GangCheck", "GangTimers", "GroupNotice"]


# -- what the checks ask the I/O edge to do --------------------------------------------------


@dataclass(slots=True, frozen=True)
class GroupNotice:
    """An Event to write on a group."""

    group: PodGroup
    type: str
    reason: str
    message: str


@dataclass(slots=True)
class GangCheck:
    notices: list[GroupNotice] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)


@dataclass(slots=True)
class _Timer:
    #: when the group was first seen holding resources below its quorum
    partial_since: float | None = None
    backoff_until: float = 0.0
    timeouts: int = 0
    backoff_message: str = ""
    evicting: set[PodUID] = field(default_factory=set)
    #: the group was whole at some point since it last backed off
    was_whole: bool = False


class GangTimers:
    """The gang timers of the groups placed below their quorum, and the groups seen whole."""

    def __init__(
        self,
        *,
        default_timeout: float = 300.0,
        initial_backoff: float = 10.0,
        max_backoff: float = 300.0,
        whole_job_restart: bool = False,
    ) -> None:
        self.default_timeout = default_timeout
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        #: the default of a group's whole-job restart (its annotation overrides it)
        self.whole_job_restart = whole_job_restart
        #: groups seen running whole, their quorum confirmed bound by the watch, since they
        #: were placed (a loss below quorum is then a lost member)
        self._was_whole: set[GroupKey] = set()
        #: groups whose quorum a cycle placed and the watch has not yet shown whole: the
        #: members it has shown bound so far (see :meth:`confirmed`)
        self._placing: dict[GroupKey, set[PodUID]] = {}
        #: a member of a group seen whole failed or went since the last :meth:`check`: the
        #: next step checks at once (a replacement must not be placed into the remainder)
        self.lost = False
        self._timers: dict[GroupKey, _Timer] = {}

    # -- what the book reports -------------------------------------------------------------

    def member_left(self, key: GroupKey) -> None:
        """A member of group ``key`` failed or went."""
        if key in self._was_whole:
            self.lost = True  # a running gang lost a member: check it before any cycle

    def forget(self, key: GroupKey) -> None:
        """The group is deleted."""
        self._timers.pop(key, None)

    def placed_whole(self, key: GroupKey) -> None:
        """A cycle placed the quorum of a known group (see :meth:`confirmed`)."""
        if key not in self._was_whole:
            self._placing.setdefault(key, set())

    def confirmed(self, group: PodGroup, pod: Pod, tally: Callable[[], Tally]) -> None:
        """The watch shows ``pod``, a member of ``group``, bound: once the group's placed
        quorum is all bound (``tally()`` counts its members), the group runs whole, and from
        then on losing a member is a loss (a job that restarts whole does so at once, not
        after the next :meth:`check`)."""
        seen = self._placing.get(group.key)
        if seen is None or not pod.holds_resources:
            return
        seen.add(pod.uid)
        if len(seen) >= group.min_member and runs_whole(group, tally()):
            del self._placing[group.key]
            self._was_whole.add(group.key)

    # -- what the cycle and the statuses ask ------------------------------------------------

    def timed(self) -> list[GroupKey]:
        """The groups with a gang timer (partly placed, or backing off after a timeout)."""
        return list(self._timers)

    def backing_off(self, key: GroupKey, now: float) -> bool:
        timer = self._timers.get(key)
        return timer is not None and now < timer.backoff_until

    def blocked_message(self, key: GroupKey, now: float) -> str:
        """Why a group that is backing off waits (empty when it is not)."""
        timer = self._timers.get(key)
        return timer.backoff_message if timer is not None and now < timer.backoff_until else ""

    def evicting(self, key: GroupKey) -> set[PodUID]:
        timer = self._timers.get(key)
        return set() if timer is None else timer.evicting

    def eviction_done(self, key: GroupKey, uid: PodUID) -> None:
        timer = self._timers.get(key)
        if timer is not None:
            timer.evicting.discard(uid)

    # -- no partial gang survives ----------------------------------------------------------

    def check(
        self,
        groups: Mapping[GroupKey, PodGroup],
        dirty: set[tuple[str, str]] | None,
        tally: Callable[[PodGroup], Tally],
        state: ClusterState,
        now: float,
    ) -> GangCheck:
        """Start, run out and enforce the timers of groups placed below their quorum.

        ``dirty``: the (namespace, name) of the groups whose members or spec changed since
        the last check (None: all of them); a group without a timer and unchanged is not
        looked at. ``tally(group)`` counts its members."""
        out = GangCheck()
        self.lost = False
        for key, group in groups.items():
            timer = self._timers.get(key)
            if timer is not None and timer.evicting:
                timer.evicting &= state.pods.keys()  # those gone are done
            if group.invalid or (timer is None and dirty is not None and (group.namespace, group.name) not in dirty):
                continue  # unchanged since it was last found whole or holding nothing
            t = tally(group)
            if not t.ours:
                continue
            whole = t.placed >= group.min_member and all(
                t.placed_by_task.get(task, 0) >= need for task, need in group.min_task_member.items()
            )
            # members all terminating already: nothing a timeout could evict, so no timer (it
            # would announce an eviction it cannot make, again after every back-off)
            if whole and runs_whole(group, t):
                self._placing.pop(key, None)
                self._was_whole.add(key)
            if whole or not t.holding or all(p.deleting for p in t.holding):
                if timer is not None:
                    timer.partial_since = None
                    if whole and not timer.was_whole:
                        timer.was_whole = True
                        timer.timeouts = 0
                continue
            if timer is None:
                timer = self._timers[key] = _Timer()
            self._partial(group, t, timer, out, now)
        for key in [k for k in self._timers if k not in groups]:
            del self._timers[key]
        self._was_whole &= groups.keys()
        for key in [k for k in self._placing if k not in groups]:
            del self._placing[key]
        return out

    def _partial(self, group: PodGroup, t: Tally, timer: _Timer, out: GangCheck, now: float) -> None:
        """A group holding resources below its quorum: restart it whole if it ran whole and
        asks to, evict what binds while it backs off, else start or run out its timer."""
        key = group.key
        if key in self._was_whole and group.restarts_whole(self.whole_job_restart):
            # a running job lost a member: the rest goes now, and it restarts whole
            self._was_whole.discard(key)
            out.notices.append(GroupNotice(group, "Warning", "WholeJobRestart", explain.whole_job_restart(
                t.placed, group.min_member, len(t.bound),
            )))
            self._evict(group, t, timer, out, explain.whole_job_restart_eviction(), cause="restart")
            return
        if now < timer.backoff_until:
            # members bound after the timeout (their binding was in flight): evict them too
            self._evict(group, t, timer, out, "it is backing off after a schedule timeout")
            return
        if timer.partial_since is None:
            timer.partial_since = now
            out.notices.append(GroupNotice(
                group, "Warning", "GangIncomplete",
                f"{t.placed} of {group.min_member} required members are placed; "
                f"retrying the other {group.min_member - t.placed} as one gang",
            ))
            return
        limit = group.schedule_timeout or self.default_timeout
        if now - timer.partial_since < limit:
            return
        backoff = min(self.initial_backoff * 2 ** timer.timeouts, self.max_backoff)
        timer.timeouts += 1
        timer.was_whole = False
        timer.partial_since = None
        timer.backoff_until = now + backoff
        timer.backoff_message = (
            f"gang {group.display} timed out after {limit:g} s with {t.placed} of "
            f"{group.min_member} required members placed; its bound members were evicted "
            f"and it is retried after {backoff:g} s"
        )
        out.notices.append(GroupNotice(
            group, "Warning", "GangTimeout",
            f"only {t.placed} of {group.min_member} required members were placed within "
            f"{limit:g} s; evicting the {len(t.bound)} bound member(s) to release their "
            f"resources and retrying the whole gang after {backoff:g} s",
        ))
        self._evict(group, t, timer, out, "its gang timed out below quorum")

    def _evict(self, group: PodGroup, t: Tally, timer: _Timer, out: GangCheck, why: str,
               *, cause: str = "gang-timeout") -> None:
        for pod in sorted(t.bound, key=member_order):
            if pod.uid in timer.evicting or pod.deleting:
                continue
            timer.evicting.add(pod.uid)
            out.evictions.append(Eviction(
                uid=pod.uid, namespace=pod.namespace, name=pod.name, node=pod.node_name,
                unit=group.key, reason=f"member of PodGroup {group.display}: {why}", cause=cause,
            ))
