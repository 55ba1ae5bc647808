"""The fragmentation experiment of FGD (ATC'23): tasks arrive in a seeded random order and
never leave; the GPU allocation ratio is recorded against the GPU that has arrived.

Method, as the FGD simulator applies it to openb: the tasks are sorted by name and shuffled
by the seed; if they ask for less than ``load`` x the cluster's cards, copies drawn from them
(with replacement) are appended until the next draw would pass ``load``; if they ask for
more, random tasks are removed. Each task is tried once, in that order; one that does not
fit fails and is dropped. After every task: the card compute allocated (shares counted
exactly) and the card compute arrived (placed or not), both as % of the cluster's cards.
The session places tasks in batches (a batch is one step, its tasks ordered by arrival);
with nothing leaving and no reservation, that places each task as placing them one by one
would.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from batchsched.core.settings import SessionSettings
from batchsched.simulate.engine import Simulation
from batchsched.simulate.openb import Task, TraceNode

BATCH = 64


@dataclass(slots=True)
class Curve:
    """One run: per task tried, the arrived and allocated card compute (% of capacity)."""

    policy: str
    seed: int
    arrived: list[float] = field(default_factory=list)
    allocated: list[float] = field(default_factory=list)
    failed: int = 0

    def at(self, pct: int) -> float | None:
        """The mean allocation of the samples whose arrived load rounds to ``pct`` (or,
        if none, ``pct`` +- 1), as the FGD analysis bins them."""
        for window in (0, 1):
            got = [a for x, a in zip(self.arrived, self.allocated, strict=True)
                   if abs(round(x) - pct) <= window]
            if got:
                return sum(got) / len(got)
        return None


def workload(tasks: Sequence[Task], capacity_milli: int, load: float, seed: int) -> list[Task]:
    """The shuffled, inflated (or thinned) task list of one seed."""
    rng = random.Random(seed)
    base = sorted(tasks, key=lambda t: t.name)
    rng.shuffle(base)
    target = load * capacity_milli
    total = sum(t.gpu_request for t in base)
    if total < target:
        out = list(base)
        while True:
            t = base[rng.randrange(len(base))]
            if total + t.gpu_request > target:
                break
            out.append(t)
            total += t.gpu_request
        return out
    out = list(base)
    while total > target and out:
        t = out.pop(rng.randrange(len(out)))
        total -= t.gpu_request
    return out


def method_settings(base: SessionSettings, seed: int = 0) -> SessionSettings:
    """``base`` (a configuration as the scheduler would apply it) with only what the method
    needs changed: no reservation (a task that does not fit is dropped, not waited for), no
    Scheduled Events, unschedulable pods never retried, and the random policy seeded by the
    run's seed. Every other setting, scoring included, is the configuration's."""
    return dataclasses.replace(
        base,
        cards=dataclasses.replace(base.cards, seed=seed),
        reservation=dataclasses.replace(base.reservation, enabled=False),
        scheduled_events=False,
        retry_unschedulable=1e12,
    )


def with_policy(base: SessionSettings, policy: str | None = None, scope: str | None = None) -> SessionSettings:
    """``base`` with its card policy and scope replaced (``None`` keeps the base's)."""
    cards = dataclasses.replace(base.cards, policy=policy or base.cards.policy, scope=scope or base.cards.scope)
    return dataclasses.replace(base, cards=cards)


def settings_for(policy: str, scope: str = "sharing", seed: int = 0) -> SessionSettings:
    """The default configuration with the card policy under test, as the method runs it."""
    return method_settings(with_policy(SessionSettings(), policy, scope), seed)


def run(nodes: Sequence[TraceNode], tasks: Sequence[Task], *, policy: str | None = None, seed: int,
        load: float = 1.3, scope: str | None = None, settings: SessionSettings | None = None,
        batch: int = BATCH, use_jit: bool = True, progress: Callable[[int, int], None] | None = None) -> Curve:
    """One seed of the experiment under ``settings`` (default: the default configuration),
    its card policy and scope replaced by ``policy`` and ``scope`` when given."""
    capacity = sum(n.gpus for n in nodes) * 1000
    order = workload(tasks, capacity, load, seed)
    applied = method_settings(with_policy(settings or SessionSettings(), policy, scope), seed)
    sim = Simulation(applied, use_jit=use_jit)
    sim.add_nodes(n.manifest() for n in nodes)
    curve = Curve(applied.cards.policy, seed)
    arrived = allocated = 0
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        uids = []
        for i, t in enumerate(chunk):
            uid = f"{t.name}-{start + i}"
            sim.add_pod(t.manifest(uid, created=float(start + i)))
            uids.append(uid)
        sim.step(float(start))
        for uid, t in zip(uids, chunk, strict=True):
            arrived += t.gpu_request
            if uid in sim.placed:
                allocated += t.gpu_request
            else:
                curve.failed += 1
                sim.delete_pod(uid)
            curve.arrived.append(100 * arrived / capacity)
            curve.allocated.append(100 * allocated / capacity)
        if progress is not None:
            progress(min(start + batch, len(order)), len(order))
    return curve

