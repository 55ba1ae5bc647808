"""Start-time estimates: the waiting work run forward on a virtual clock from a copy of the
session.

The copy holds the same nodes, queues, PodGroups and pods as the live session. Each pod
that runs is given an end: its declared runtime (``activeDeadlineSeconds`` or the
annotation ``batchsched.io/expected-runtime``, counted from its start), else the median
run time of pods like it that were seen to succeed
(:class:`~batchsched.core.runtimes.RunTimes`); a pod with neither runs on. Then the work is
run forward at each batch of ends, so the jobs ahead of a job start before it, in the order
the policy gives them, and run their own declared or observed time. Two models do it:

- **over classes of work** (the default, :class:`~batchsched.insight.ahead.ClassForward`):
  the policy's fair order, quotas, reservations and preemption over the copy's queue tree
  and free capacity per node, each member on the nodes its filters allow, alike jobs
  failing together; without topology, the victim search's cost, nominations, back-off or
  telling. At 1,000 nodes and 9,000 waiting pods it runs every waiting job to its start in
  seconds;
- **exact** (``exact=True``, :class:`Forward`): the copy stepped as the scheduler steps, at
  each end and whenever the back-off of a unit an end woke runs out, every Binding and
  eviction it decides carried out at once. Each step costs a live cycle, so it reaches far
  only on small clusters; it is what the model over classes is measured against
  (``python -m perf.estimatebench --compare``).

A job's estimated start is the virtual time its required members are bound. The estimate
says what it rests on (how many of the ends it waited for were declared and how many
observed) and how sure it is: ``high`` when it fits now or every end it waited for was
declared, ``medium`` when some were observed, ``none`` when it does not start before the
horizon (it waits for pods that never end, or is held).

Nothing here reads a clock: the caller bounds the work with ``max_steps`` (the cycles of
the exact copy) and ``keep_going`` (its budget of time).
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from batchsched.core import explain
from batchsched.core.model import Pod, PodUID
from batchsched.core.reservation import declared_runtime
from batchsched.core.runtimes import like_key
from batchsched.core.session import Session
from batchsched.insight.ahead import ClassForward
from batchsched.insight.views import HELD_STATES, Job

__all__ = ["Estimate", "Forward", "estimate_starts"]

#: a step asked for at once (a victim search owed) comes this much later on the copy's clock
AGAIN_SECONDS = 0.1
#: ends this close together (a fraction of their distance from now) are taken in one step
BATCH_FRACTION = 0.02
#: how far ahead the copy runs at most
HORIZON_SECONDS = 7 * 86400.0

Estimate = dict[str, Any]


def _copy(session: Session, use_jit: bool) -> Session:
    # each step of the copy tries every unit: its estimates must not depend on how fast
    # the machine walks (the live cycle's walk budget)
    sim = Session(dataclasses.replace(session.settings, walk_budget=None), use_jit=use_jit)
    live = session
    sim.queues.replace_namespaces(
        [{"metadata": {"name": n, "labels": dict(labels)}} for n, labels in live.queues.namespaces.items()]
    )
    sim.on_queues_listed(list(live.queues.queue_objects.values()))
    sim.queues.budgets = copy.deepcopy(live.queues.budgets)
    sim.on_priority_classes_listed(dict(live.groups.priority_classes), live.groups.never_classes)
    by_api: dict[str, list[Any]] = {}
    for g in live.groups.groups.values():
        by_api.setdefault(g.api, []).append(g)
    for api, groups in by_api.items():
        sim.on_groups_listed(api, groups)
    sim.volumes = copy.deepcopy(live.volumes)
    sim.on_nodes_listed(list(live.state.nodes.values()))
    sim.on_pods_listed([p for p in live.state.pods.values() if not p.terminal])
    # the workload mix the live fragmentation policy measures against: what the pods listed
    # rebuild, plus the counts of pods gone that only the live mix still holds
    sim.state.restore_mix(live.state.mix_gone())
    return sim


class Forward:
    """The copy, its clock and the ends to come."""

    def __init__(self, live: Session, now: float, use_jit: bool) -> None:
        self.runtimes = copy.deepcopy(live.runtimes)  # the live book changes meanwhile
        self.sim = _copy(live, use_jit)
        self.now = now
        #: (time, sequence, uid) of each running pod's end
        self.ends: list[tuple[float, int, PodUID]] = []
        self.source: dict[PodUID, str] = {}
        #: (time, source) of each end carried out
        self.ended: list[tuple[float, str]] = []
        self._seq = 0
        for pod in self.sim.state.pods.values():
            if pod.holds_resources:
                self._schedule_end(pod, pod.started or now, now)

    def _group_key(self, uid: PodUID) -> str | None:
        g = self.sim.groups.group_of(uid)
        return g.key if g is not None else None

    def _schedule_end(self, pod: Pod, started: float, now: float) -> None:
        if pod.deleting:
            end, source = now, "declared"
        else:
            run = declared_runtime(pod)
            source = "declared"
            if run is None:
                run = self.runtimes.typical(like_key(pod, self._group_key(pod.uid)))
                source = "observed"
            if run is None:
                self.source[pod.uid] = "unknown"
                return
            end = max(now, started + run)
        self.source[pod.uid] = source
        self._seq += 1
        heapq.heappush(self.ends, (end, self._seq, pod.uid))

    def next_batch(self, now: float) -> float:
        """The time of the next step for the ends to come: the next end, and with it the ends
        up to :data:`BATCH_FRACTION` of its distance from ``now`` later (at least a second),
        taken together at the last of them: far estimates cost fewer cycles, off by that
        fraction at most."""
        first = self.ends[0][0]
        limit = first + max(1.0, BATCH_FRACTION * (first - now))
        last = first
        for end, _, _ in self.ends:
            if end <= limit:
                last = max(last, end)
        return last

    def finish_due(self, t: float) -> bool:
        any_ended = False
        while self.ends and self.ends[0][0] <= t:
            _, _, uid = heapq.heappop(self.ends)
            pod = self.sim.state.pods.get(uid)
            if pod is None or not pod.holds_resources:
                continue
            self.sim.on_pod("MODIFIED", dataclasses.replace(pod, phase="Succeeded"))
            self.ended.append((t, self.source.get(uid, "declared")))
            any_ended = True
        return any_ended

    def step(self, t: float) -> tuple[list[tuple[str, PodUID]], bool]:
        """One step at ``t``, its Bindings and evictions carried out; returns the bound
        ``(unit key, pod uid)`` and whether the session asked for another step at once."""
        sim = self.sim
        d = sim.step(t)
        bound: list[tuple[str, PodUID]] = []
        for b in d.binds:
            uid = PodUID(b.uid)
            pod = sim.state.pods.get(uid)
            if pod is None:
                continue
            notes = {**pod.annotations, **dict(b.annotations)} if b.annotations else pod.annotations
            running = dataclasses.replace(pod, node_name=b.node, phase="Running", started=t,
                                          annotations=notes, cards=b.cards)
            sim.on_bind_result(b, "bound", now=t)
            sim.on_pod("MODIFIED", running)
            self._schedule_end(running, t, t)
            bound.append((b.unit, uid))
        for e in d.evictions:
            sim.on_evict_result(e, "evicted")
            pod = sim.state.pods.get(PodUID(e.uid))
            if pod is not None:
                sim.on_pod("DELETED", pod)
        return bound, d.again

    def unknown_running(self) -> int:
        return sum(1 for uid, s in self.source.items() if s == "unknown"
                   and (p := self.sim.state.pods.get(uid)) is not None and p.holds_resources)


def estimate_starts(session: Session, jobs: Iterable[Job], now: float, *, max_steps: int = 400,
                    horizon: float = HORIZON_SECONDS, use_jit: bool = True,
                    prepared: Forward | None = None,
                    keep_going: Callable[[], bool] | None = None, exact: bool = False) -> dict[str, Estimate]:
    """Estimated start of each waiting job (by job key); see the module docstring.
    ``prepared``: the copy, made earlier from ``session`` at ``now`` (else made here);
    ``keep_going()``: asked before each cycle (or round) of the model, false to stop (the
    caller's budget of time); ``exact``: step the copy of the session (every decision, each
    cycle as dear as a live one) instead of the model over classes of work
    (:mod:`batchsched.insight.ahead`); ``max_steps`` bounds the cycles of the copy only."""
    out: dict[str, Estimate] = {}
    need: dict[str, int] = {}
    waiting: list[Job] = []
    for j in jobs:
        if not j.waiting:
            continue
        if j.state in HELD_STATES:
            out[j.key] = _none(explain.estimate_unknown(explain.ESTIMATE_HELD))
        else:
            need[j.key] = max(1, j.required - j.bound)
            waiting.append(j)
    if not need:
        return out
    fwd = prepared if prepared is not None else Forward(session, now, use_jit)
    if exact:
        run = _stepped(fwd, need, now, max_steps=max_steps, horizon=horizon, keep_going=keep_going)
    else:
        run = _by_classes(fwd, waiting, need, now, horizon=horizon, keep_going=keep_going)
    for key in need:
        out[key] = run.estimate(key, now)
    return out


@dataclasses.dataclass(slots=True)
class _Run:
    """What a forward run found: each job's start with the ends it waited for by source,
    how far it got, and why it stopped."""

    started: dict[str, tuple[float, int, int]]
    reached: float
    cycles: int
    cut: bool
    unknown: int

    def estimate(self, key: str, now: float) -> Estimate:
        found = self.started.get(key)
        if found is None:
            if self.cut:
                why = explain.estimate_budget(self.reached - now, self.cycles)
            else:
                why = explain.ESTIMATE_NEVER_ENDS if self.unknown else explain.ESTIMATE_BEYOND
            return _none(explain.estimate_unknown(why))
        at, declared, observed = found
        return _known(at, now, declared, observed)


def _by_classes(fwd: Forward, waiting: list[Job], need: Mapping[str, int], now: float, *, horizon: float,
                keep_going: Callable[[], bool] | None) -> _Run:
    """The model over classes of work (:class:`~batchsched.insight.ahead.ClassForward`) on
    the copy."""
    model = ClassForward(fwd.sim, fwd.runtimes, (
        (j.key, j.queue, j.priority, j.created, j.arrival, [p for p in j.pods if not p.node_name], need[j.key])
        for j in waiting), now)
    starts, reached, rounds, cut = model.run(horizon=horizon, keep_going=keep_going)
    return _Run({k: (s.at, s.declared, s.observed) for k, s in starts.items()}, reached if rounds else now,
                rounds, cut, model.unknown)


def _stepped(fwd: Forward, need: Mapping[str, int], now: float, *, max_steps: int, horizon: float,
             keep_going: Callable[[], bool] | None) -> _Run:
    """The copy of the session stepped at each batch of ends, every decision carried out."""
    started: dict[str, float] = {}
    counts: dict[str, int] = {}
    due: float | None = now
    steps = 0
    t = now
    cut = False
    while len(started) < len(need):
        if steps >= max_steps or (keep_going is not None and not keep_going()):
            cut = True
            break
        t = min(fwd.next_batch(now) if fwd.ends else math.inf, math.inf if due is None else due)
        if t == math.inf or t > now + horizon:
            break
        fwd.finish_due(t)
        bound, again = fwd.step(t)
        steps += 1
        for unit, _ in bound:
            if unit in need and unit not in started:
                counts[unit] = counts.get(unit, 0) + 1
                if counts[unit] >= need[unit]:
                    started[unit] = t
        # next: the next end, or when a woken unit's back-off ends, as the scheduler steps
        due = t + AGAIN_SECONDS if again else fwd.sim.next_due(t)
    found: dict[str, tuple[float, int, int]] = {}
    for key, at in started.items():
        sources = [s for e, s in fwd.ended if e <= at]
        found[key] = (at, sources.count("declared"), sources.count("observed"))
    return _Run(found, t if steps else now, steps, cut, fwd.unknown_running())


def _none(basis: str) -> Estimate:
    return {"start": None, "inSeconds": None, "basis": basis, "confidence": "none"}


def _known(at: float, now: float, declared: int, observed: int) -> Estimate:
    if at <= now:
        basis, confidence = explain.ESTIMATE_FITS_NOW, "high"
    else:
        basis = explain.estimate_basis(declared, observed, 0)
        confidence = "medium" if observed else "high"
    return {"start": at, "inSeconds": max(0.0, at - now), "basis": basis, "confidence": confidence}


def first_estimates(book: dict[str, tuple[float, float]], estimates: Mapping[str, Estimate],
                    now: float) -> None:
    """Keep the first estimate made for each job: ``key -> (made at, estimated start)``."""
    for key, e in estimates.items():
        if e.get("start") is not None and key not in book:
            book[key] = (now, float(e["start"]))
