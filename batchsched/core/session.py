"""The scheduling session: everything batchsched decides, pure and synchronous.

A :class:`Session` owns the mirror of the cluster (:class:`~batchsched.core.mirror.ClusterState`),
the gang and queue books and the cycle, and conducts the books of what lives between cycles
(:mod:`batchsched.core.books`), each with one owner: pod intake, the backlog of units worth
trying, what each pod was told, the bind ledger, holds, the preemption follow-up, the
nominations and the statuses. It routes values between them; none of them calls another.
Its whole interface:

- **event intake**: ``on_pod``, ``on_node``, ``on_podgroup``, ``on_queue``,
  ``on_namespace``, ``on_budget``, ``on_priority_class`` (and ``*_listed`` for a full
  list), with the object already parsed, each routed to the books it concerns
  (:mod:`batchsched.core.routing`);
- **a step**: :meth:`Session.step` ``(now) ->`` :class:`Decisions` (binds, evictions,
  pod conditions, Events, PodGroup and Queue statuses, pods to read again);
- **result intake**: :meth:`Session.on_bind_result`, :meth:`Session.on_evict_result`,
  each returning the Decisions it leads to at once (Events, resyncs).

Time comes in as an argument (seconds on the clock of the objects' timestamps); nothing
here reads a clock, a socket or a global, so the running scheduler, the tests and a
replay on a virtual clock drive the same policy. :attr:`Session.wants_step` says whether
an event gave a reason to run a step now (the shell sleeps until it does, or until the
slow retry timer).

A step (:meth:`Session.step`), in order:

1. intake: how long the pods that succeeded since the last step ran is recorded; the
   Events decided on intake (unreadable nodes, pods placed one by one though their
   RayCluster could have been a gang) are written;
2. the bind ledger: pods assumed bound but never confirmed are read again; stale card
   assignments are cleaned;
3. holds: gang timers (gangs stuck below quorum evicted); suspended, drained and unhealthy
   work evicted;
4. the backlog: the sleepers the events since the last step woke; the units worth trying
   (each class or gang that failed is skipped until something changed or the retry
   interval passed; in the first cycle, only the first gangs of each queue and the first
   members of each class: :mod:`batchsched.core.queues.heads`); the pods that joined a
   sleeping class are told its word;
5. the nominations: restored after a start, those expired or of a stopped queue given up
   (their preemptors told), the rest charged; then the cycle;
6. its plan followed up: each binding assumed; the pods not placed told why, the classes
   of single pods that failed put to sleep; the preemptions' Events, nominated nodes and
   evictions; each gang's result (its PodGroup, its sleep); the gangs cut as alike share
   their class's outcome; the holders of reservations noted; the Queue statuses from the
   cycle's tree (at most every few seconds);
7. the PodGroup statuses of the groups that changed (after a walk that stopped early, at
   the next step: its Bindings leave first), and the Queue statuses if due and no cycle
   wrote them.

After each step the mirror's invariants are checked (:meth:`Session.check`); a broken one
raises, and the process stops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from batchsched.core import explain
from batchsched.core.books.backlog import Backlog
from batchsched.core.books.followup import PreemptionFollowUp, gang_evicted
from batchsched.core.books.holds import Holds
from batchsched.core.books.intake import PodIntake
from batchsched.core.books.ledger import BindLedger
from batchsched.core.books.nominations import NominationBook
from batchsched.core.books.statuses import GroupReports, QueueStatuses
from batchsched.core.books.told import ToldBook
from batchsched.core.cycle import Cycle
from batchsched.core.decisions import Decisions
from batchsched.core.gangs import GroupBook, GroupKey
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import PodUID
from batchsched.core.plan import Binding, Eviction, Plan, Unit, UnitStatus
from batchsched.core.preemption import Room
from batchsched.core.queues import QueueBook, QueueInput, QueueTree
from batchsched.core.requeue import WaitBook
from batchsched.core.routing import EventRouting
from batchsched.core.runtimes import RunTimes
from batchsched.core.settings import SessionSettings
from batchsched.core.volumes import VolumeBook

__all__ = ["Session", "SessionSettings"]

#: how often the mirror's usage is recomputed from every charge to check it
FULL_CHECK_SECONDS = 60.0


def _once(make: Callable[[], Snapshot]) -> Callable[[], Snapshot]:
    """``make()`` on the first call, the same value after."""
    held: list[Snapshot] = []

    def get() -> Snapshot:
        if not held:
            held.append(make())
        return held[0]

    return get


class Session(EventRouting):
    """One scheduler's decisions. Single writer: call it from one thread (the event loop).

    The events of the watched objects are routed by :class:`~batchsched.core.routing.EventRouting`;
    here: the results of its writes, and the step."""

    def __init__(self, settings: SessionSettings | None = None, *, use_jit: bool = True) -> None:
        s = self.settings = settings or SessionSettings()
        self.state = ClusterState(s.scheduler_names, mix_prior=s.mix_prior)
        self.cycle = Cycle(s.scoring, levels=s.levels, use_jit=use_jit, reservation=s.reservation, cards=s.cards,
                           walk_budget=s.walk_budget, first_walk_budget=s.first_walk_budget)
        self.groups = GroupBook(
            default_timeout=s.gang_default_timeout, initial_backoff=s.gang_initial_backoff,
            max_backoff=s.gang_max_backoff, levels=s.levels, whole_job_restart=s.gang_whole_job_restart,
        )
        self.queues = QueueBook(s.queues, node_health=s.node_health)
        #: how long pods like a given one ran (start-time estimates read it)
        self.runtimes = RunTimes()
        self.intake = PodIntake(s.node_health)
        self.backlog = Backlog(retry=s.retry_unschedulable)
        self.told = ToldBook()
        self.ledger = BindLedger(assumed_timeout=s.assumed_timeout, scheduled_events=s.scheduled_events)
        self.holds = Holds(s.node_health)
        self.followup = PreemptionFollowUp()
        self.reports = GroupReports(self.groups, s.levels, report_delay=s.gang_report_delay)
        self.queue_statuses = QueueStatuses(s.queue_status_interval)
        self.nominations = NominationBook(s.queues.nomination_timeout)
        self.cycles = 0
        self.wants_step = False
        self._last_full_check = -1e18

    @property
    def volumes(self) -> VolumeBook:
        return self.intake.volumes

    @volumes.setter
    def volumes(self, book: VolumeBook) -> None:
        self.intake.volumes = book

    @property
    def waits(self) -> WaitBook:
        """The sleepers (:mod:`batchsched.core.requeue`)."""
        return self.backlog.waits

    @property
    def charged(self) -> QueueTree | None:
        """The queue tree as last charged (by a cycle, or for the Queue statuses): what the
        queue views read; None before the first."""
        return self.queue_statuses.charged

    # -- result intake -------------------------------------------------------------------------

    def on_bind_result(self, b: Binding, outcome: str, *, now: float, error: str = "") -> Decisions:
        """``outcome``: bound; conflict (the pod changed under us: read it again); unknown
        (no answer: the Binding may have landed); gone (the pod is no more); failed
        (refused, ``error`` says why: the pod is told); fenced (not sent).

        After a conflict or an unknown outcome the pod stays charged to the node it was
        given until it has been read again (:meth:`on_pod_read`): a Binding whose answer
        was lost with its connection (an apiserver killed mid-request) may have landed, and
        a pod bound where we cannot see it must not have its room handed to another.
        """
        out, unbound = self.ledger.bind_result(b, outcome, now=now, state=self.state)
        if unbound:
            uid = PodUID(b.uid)
            self._not_bound(uid, now=now, back_off=outcome in ("failed", "unknown"))
            pod = self.state.pending.get(uid)
            if outcome == "failed" and pod is not None:
                # it backs off before it is placed again: it says why meanwhile
                self.told.tell(out, pod, "BindingRejected", explain.binding_refused(b.node, error))
        return out

    def on_pod_read(self, uid: PodUID, *, now: float) -> Decisions:
        """A pod whose binding was in doubt has been read again (and fed to :meth:`on_pod`):
        still unbound, its binding did not happen."""
        if self.ledger.read_again(uid, self.state):
            self._not_bound(uid, now=now, back_off=True)
        return Decisions()

    def _not_bound(self, uid: PodUID, *, now: float, back_off: bool) -> None:
        """A pod handed to the binder is not bound: pending again, its gang tried again
        (the rest of it as its remainder, at once); ``back_off``: refused (a namespace being
        deleted...) or unanswered, its class backs off."""
        self.state.forget(uid)
        self.intake.devices.forget(uid)
        self.groups.touch(uid)
        self._sync(uid)
        group = self.groups.group_of(uid)
        if group is not None:
            self.backlog.forget_gang(group.key)
            self.reports.dirty.add(group.key)
        if back_off:
            self.backlog.not_bound(uid, self.state.pending.get(uid), now)
        self.wants_step = True

    def on_evict_result(self, e: Eviction, outcome: str, *, error: str = "") -> Decisions:
        """``outcome``: evicted, gone (nothing left to evict), blocked (a disruption budget
        refused), failed (``error`` says why)."""
        if not e.preemptor:
            self.reports.dirty.add(GroupKey(e.unit))
            return gang_evicted(e, outcome, error, self.groups)
        if outcome in ("evicted", "gone"):
            return self.followup.victim_evicted(e, outcome, self.groups)
        dropped = self.nominations.drop(e.preemptor)
        out = self.followup.blocked(e, outcome, error, dropped, self.state)
        # try again: the unit may find other victims, or the same once the budget allows
        for uid in dropped.pods if dropped is not None else ():
            self.backlog.forget_class_of(PodUID(uid))
        self.backlog.forget_gang(e.preemptor)
        self.wants_step = True
        return out

    # -- a step ----------------------------------------------------------------------------------

    def step(self, now: float) -> Decisions:
        """Everything due at ``now``: one cycle and the writes that follow it, phase by phase
        (in the order of the module's docstring)."""
        self.wants_step = False
        state, groups, out = self.state, self.groups, Decisions()
        self.intake.ran(now, self.runtimes)
        self.holds.notes(out)
        self.told.notes(out)
        self.ledger.check_assumed(state, now, out)
        self.ledger.clean_stale(state, now, out)
        # one snapshot for the whole decision (the units' admission and the cycle), taken
        # only when there is something to decide
        snapshot = _once(state.snapshot)
        with groups.tallies_kept():  # the mirror holds still but for the pods the cycle assumes
            self.reports.dirty.update(self.holds.gang_timers(state, groups, now, out))
            self.holds.hold_running(state, groups, self.queues, now, out)
            self.backlog.wake(state)
            units = self.schedulable_units(now, snapshot)
            self.told.tell_joined(out, state.pending, self.backlog.class_of, self.backlog.asleep_class)
            if units:
                plan, queues = self._cycle(units, snapshot(), now, out)
                gangs = {u.key: u for u in units if not (u.single and u.key == u.pods[0].key)}
                self._assume(plan, now, out)
                self._unplaced(plan, gangs, now, out)
                self.followup.preempted(plan, state, groups, out)
                self.reports.preempted(plan)
                self._gang_results(plan, gangs, now, out)
                self._cut_gangs(plan, gangs, now, out)
                self.backlog.held(plan, gangs)
                self.queue_statuses.charge(queues.tree)
                self._sync_queues(now, out, queues)
                self.told.keep_blocked(lambda key: key in gangs and bool(gangs[key].blocked))
            if out.plan is None or not out.plan.unfinished:
                # (a walk that stopped early sends its Bindings first: the next step, at
                # once, writes the statuses of the groups that changed, these included)
                self.reports.statuses(state, now, lambda: Room(state, groups, self.queues, _once(state.snapshot), now),
                                      out)
        self._sync_queues(now, out)
        self.check(now)
        return out

    def _cycle(self, units: list[Unit], snap: Snapshot, now: float, out: Decisions) -> tuple[Plan, QueueInput]:
        """The nominations brought up to date (restored after a start, given up), then the
        cycle over ``units``; returns its plan and its queue input (its tree charged)."""
        state = self.state
        due = self.nominations.before_cycle(units, state, self.groups, self.queues, snap, now)
        for n in due.restored:
            self.followup.restored(n, [state.pods[PodUID(uid)] for uid in n.pods], self.groups)
        self.followup.given_up(due.expired, due.stopped, timeout=self.nominations.timeout, state=state, out=out)
        queues = self.queues.prepare(state=state, groups=self.groups, snap=snap, units=units, now=now,
                                     nominations=due.live)
        queues.turns = self.backlog.turned
        plan = self.cycle.run(snap, units, queues=queues, state=state, classes=self.backlog.classes(self.groups),
                              devices=self.intake.devices.begin(units), limits=self.backlog.limits)
        self.queues.settle(plan, queues.queue_of)
        self.nominations.settle(plan)
        self.cycles += 1
        out.plan = plan
        if plan.deferred or plan.unfinished:
            # a victim search did not fit in this cycle's budget, or the walk stopped at its
            # own with units not tried: next cycle, not later
            out.again = True
        return plan, queues

    def _assume(self, plan: Plan, now: float, out: Decisions) -> None:
        """Each binding: the pod assumed on its node (and its class worth trying at once)."""
        for b in plan.bindings:
            uid = PodUID(b.uid)
            self.backlog.forget_class_of(uid)  # it fits again: no back-off carried over
            self.state.assume(uid, b.node, b.cards)
            self.intake.devices.assume(b)
            self.groups.touch(uid)
            self._sync(uid)
            self.ledger.assumed(uid, now)
            out.binds.append(b)

    def _unplaced(self, plan: Plan, gangs: Mapping[str, Unit], now: float, out: Decisions) -> None:
        """The pods the cycle did not place told why; the classes of single pods that failed
        put to sleep, and their members not handed over told the same."""
        failed, awake = self.told.unplaced(
            plan, gangs, now, out, delay=self.settings.gang_report_delay, turned=self.backlog.turned,
            class_of=self.backlog.class_of, gang_message=self.reports.pod_message,
        )
        told, again = self.backlog.sleep_classes(failed, awake, plan, self.queues, now)
        self.told.tell_classes(told, self.backlog.cut, self.backlog.members_after_cut, now, out)
        self.told.prune_classes(self.backlog.singles.classes)
        if again:
            out.again = True  # a class was cut and none of it failed: place more of it now

    def _gang_results(self, plan: Plan, gangs: Mapping[str, Unit], now: float, out: Decisions) -> None:
        """Each gang's result: told to its PodGroup, and whether it sleeps."""
        turned = self.backlog.turned
        for key, unit in gangs.items():
            result = plan.results.get(key)
            if key in turned and result is not None and result.failed:
                continue  # a fair turn that failed: its back-off runs on to its own try
            self.reports.result(unit, result, holding=result is not None and result.holding, now=now, out=out)
            if result is None:
                continue
            if result.status is UnitStatus.SCHEDULED:
                self.groups.placed_whole(key)
            self.backlog.gang_result(unit, result, plan, groups=self.groups, queues=self.queues, now=now)

    def _cut_gangs(self, plan: Plan, gangs: Mapping[str, Unit], now: float, out: Decisions) -> None:
        """The gangs cut as alike to others: their PodGroups and pending pods share their
        class's outcome (or they are handed over at once when the class did not fail)."""
        shared, again = self.backlog.share_gang_results(plan, gangs, self.groups, self.queues, now)
        if again:
            out.again = True
        for key, result in ((k, r) for keys, r in shared for k in keys):
            group = self.groups.groups.get(GroupKey(key))
            if group is None:
                continue
            message = self.reports.shared(group.key, result, now)
            pending = [p for uid in self.groups.member_uids(group) if (p := self.state.pending.get(uid)) is not None]
            self.told.tell_shared(pending, result.reason, message, now, out)

    def _sync_queues(self, now: float, out: Decisions, charged: QueueInput | None = None) -> None:
        """The Queue statuses, when due: from ``charged`` (the input of the cycle that just
        ran, its tree charged with what it decided), else from running work and the
        nominations charged to a fresh tree by the cycle's own accounting."""
        if not self.queue_statuses.due(now, self.queues, out):
            return
        state = self.state
        if charged is None:
            snap = state.snapshot()
            charged = self.queues.prepare(state=state, groups=self.groups, snap=snap, units=[], now=now,
                                          nominations=self.nominations.live(state, self.queues.structure(), now))
            self.cycle.account(snap, charged)
        self.queue_statuses.write(charged, out, state=state, groups=self.groups, queues=self.queues)

    def check(self, now: float) -> None:
        """The mirror's invariants (raises :class:`~batchsched.core.mirror.StateError`):
        its books after every step, the usage recomputed from every charge at most every
        :data:`FULL_CHECK_SECONDS` (it costs a pass over every running pod)."""
        self.state.check_books()
        if now - self._last_full_check >= FULL_CHECK_SECONDS:
            self._last_full_check = now
            self.state.check()
            self.backlog.prune(self.groups)

    # -- what the views read ---------------------------------------------------------------------

    def schedulable_units(self, now: float, snapshot: Callable[[], Snapshot] | None = None) -> list[Unit]:
        """The units worth trying at ``now`` (:meth:`~batchsched.core.books.backlog.Backlog.units`);
        ``snapshot()``: the step's snapshot."""
        # a first walk that stops early (the scheduler's): it is handed the queues' heads
        first = self.cycle.walks == 0 and self.settings.first_walk_budget is not None \
            and self.settings.walk_budget is not None
        return self.backlog.units(
            now, state=self.state, groups=self.groups, queues=self.queues, nominated=self.nominations,
            snapshot=snapshot or _once(self.state.snapshot), restored=self.nominations.restored,
            heads=self.settings.first_walk_heads if first else None,
        )

    def last_word(self, key: str) -> tuple[str, str] | None:
        """The ``(reason, message)`` a unit (a group's key, or a pod's ``namespace/name``)
        was last told about why it waits; None when it was told nothing yet."""
        return self.reports.last_message(key) or self.told.last_word(key, self.state)

    def next_due(self, now: float) -> float | None:
        """When a step after ``now`` would try something an event already woke (a back-off
        ends); None when only new events (or the slow retry timer) would."""
        return self.backlog.waits.next_try(now)

    @property
    def holding_count(self) -> int:
        """Units holding a reservation or a nomination after the last cycle."""
        return self.backlog.holding_count

    def holds_reservation(self, key: str) -> bool:
        """Whether the unit held a reservation or a nomination after the last cycle."""
        return self.backlog.holds(key)
