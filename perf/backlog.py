"""A large backlog through the whole scheduling session, no apiserver.

Run::

    python -m perf.backlog [--nodes 4000] [--pods 140000] [--repeats 5]

The cluster: ``--nodes`` nodes of 8 GPUs, 96 cpu and 1 TiB; eight queues in two cohorts
(each a nominal eighth of the GPUs, lending half of it); about 85% of the GPUs already run
work of those queues (single-GPU pods and 4-GPU members of 4-node gangs, a third of it
declaring a runtime). The backlog: ``--pods`` pending pods of the same queues, 70% of them
single pods (1, 2, 4 or 8 GPUs, three priorities), 30% members of gangs of 8, 16 or 32
pods (PodGroups, quorum the whole gang), a few CPU-only pods and a few that fit no node
(they ask more GPUs than a node has). Far more than fits: most of it waits.

Measured, through :meth:`Session.step` as the running scheduler drives it:

- **first**: the first step after the lists (the cost after a restart): its Bindings leave
  when it ends; its walk stops at its first placement (the scheduler's
  ``cycle.firstWalkBudgetSeconds``, 0.05 s: at this size, its first placement);
- **first pass**: the steps, run at once one after the other, until a walk tried every unit
  handed over (every unit tried once: the whole cost after a restart);
- **idle**: a step with nothing new (the steady state of a cluster where nothing changes),
  once the back-off of what earlier steps woke has passed;
- **churn**: a step, one second after the last, after 5 running pods ended (capacity
  freed on their nodes) and 10 new pods arrived: after 20 such steps (the steady state of
  a busy cluster), 4 x ``--repeats`` of them;
- **full**: a step after the slow retry timer ran out (every waiting unit tried again; the
  cycle KAI Scheduler and Volcano run every time).

Each is the median (min-max) over ``--repeats`` steps, with the units the cycle was handed
and the pods it placed; plus the RSS of the process and the mirror's size.

``--same-work``: the cycle's time budgets off (its walk tries every unit handed over, and
victim searches are bounded by count alone), so that what each step decides depends on
the cluster and not on the speed of the code: two versions of the code that decide alike
do the same work, and ``decisions`` (a digest of what every step bound, evicted and was
handed) says whether they did; ``churn_total_s`` sums the churn steps measured: the A/B
of the churn step. With the budgets on, a faster cycle also walks further and searches
more, and the steps of two versions soon differ.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
from typing import Any

from batchsched import procmem
from batchsched.core.gangs import PodGroup
from batchsched.core.model import GPU, Node, NodeName, Pod, PodUID
from batchsched.core.placement import kernels
from batchsched.core.queues import QueueSettings
from batchsched.core.reservation import RUNTIME_ANNOTATION
from batchsched.core.session import Session, SessionSettings
from batchsched.core.settings import FIRST_WALK_BUDGET
from perf import procstat

GIB = 2**30
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
QUEUE = "batchsched.io/queue"
QUEUES = 8
PRIORITIES = (0, 10, 100)
#: churn steps before the churn is measured (the back-off of what it wakes settles)
CHURN_WARMUP = 20
NODE_ALLOC = {"cpu": 96_000, "memory": 1024 * GIB, "pods": 110, GPU: 8}


def _queues(gpus: int) -> list[dict[str, Any]]:
    nominal = gpus // QUEUES
    out: list[dict[str, Any]] = [{"metadata": {"name": f"org{c}"}, "spec": {}} for c in range(2)]
    for i in range(QUEUES):
        out.append({"metadata": {"name": f"team{i}"}, "spec": {
            "parent": f"org{i % 2}",
            "resources": [{"name": GPU, "nominal": nominal, "lendingLimit": nominal // 2}],
        }})
    return out


def _pod(name: str, gpu: int, queue: str, *, priority: int = 0, created: float = 0.0, group: str = "",
         node: str = "", runtime: str = "", cpu: int = 0) -> Pod:
    labels = {QUEUE: queue}
    if group:
        labels[GROUP_LABEL] = group
    requests = {"cpu": cpu or 2000 * max(gpu, 1), "memory": 16 * GIB * max(gpu, 1), "pods": 1}
    if gpu:
        requests[GPU] = gpu
    return Pod(
        uid=PodUID(f"uid-{name}"), namespace="bench", name=name, scheduler_name="batchsched",
        node_name=node, phase="Running" if node else "Pending", priority=priority, created=created,
        started=created if node else 0.0, requests=requests, labels=labels,
        annotations={RUNTIME_ANNOTATION: runtime} if runtime else {},
    )


class Backlog:
    """The cluster and backlog above, fed to a :class:`Session` as its watches would."""

    def __init__(self, nodes: int, pods: int, *, seed: int = 11, same_work: bool = False) -> None:
        self.rng = rng = random.Random(seed)
        self.session = Session(SessionSettings(queues=QueueSettings(max_search_seconds=math.inf), walk_budget=None)
                               if same_work else SessionSettings(queues=QueueSettings(),
                                                                 first_walk_budget=FIRST_WALK_BUDGET))
        #: what every step decided, as a digest
        self.decisions = hashlib.sha256()
        self.nodes = [Node(name=NodeName(f"node-{i:05d}"), uid=f"n{i}",
                           labels={"kubernetes.io/hostname": f"node-{i:05d}"}, allocatable=NODE_ALLOC)
                      for i in range(nodes)]
        self.running: list[Pod] = []
        self.pending: list[Pod] = []
        self.groups: list[PodGroup] = []
        for i, node in enumerate(self.nodes):
            q = f"team{rng.randrange(QUEUES)}"
            if i % 8 < 5:
                for k in range(rng.choice((6, 7, 8))):
                    self.running.append(_pod(f"run-{i}-{k}", 1, q, node=node.name, created=float(i),
                                             priority=PRIORITIES[-1], runtime="2h" if k % 3 == 0 else ""))
            else:
                g = f"rg-{i // 4}"
                if not self.groups or self.groups[-1].name != g:
                    self.groups.append(PodGroup(api="scheduling.x-k8s.io", namespace="bench", name=g,
                                                uid=f"uid-{g}", min_member=4, created=float(i)))
                for k in range(2):
                    self.running.append(_pod(f"run-{i}-{k}", 4, q, node=node.name, created=float(i), group=g,
                                             priority=PRIORITIES[-1]))
        made = 0
        while made < pods:
            q = f"team{rng.randrange(QUEUES)}"
            priority = rng.choice(PRIORITIES)
            created = 1000.0 + made
            roll = rng.random()
            if roll < 0.3:
                size = min(rng.choice((8, 16, 32)), pods - made)
                gpu = rng.choice((1, 2, 4, 8))
                g = f"g{made}"
                self.groups.append(PodGroup(api="scheduling.x-k8s.io", namespace="bench", name=g,
                                            uid=f"uid-{g}", min_member=size, created=created))
                for m in range(size):
                    self.pending.append(_pod(f"{g}-{m}", gpu, q, priority=priority, created=created, group=g))
                made += size
                continue
            if roll < 0.31:
                self.pending.append(_pod(f"cpu{made}", 0, q, priority=priority, created=created, cpu=500))
            elif roll < 0.315:
                self.pending.append(_pod(f"huge{made}", 16, q, priority=priority, created=created))
            else:
                self.pending.append(_pod(f"p{made}", rng.choice((1, 1, 2, 4, 8)), q, priority=priority,
                                         created=created))
            made += 1
        self.now = 10_000.0
        self.arrived = 0

    def list_all(self) -> None:
        s = self.session
        with procmem.collector_paused():  # as the running scheduler takes in its lists
            self._list_all(s)

    def _list_all(self, s: Session) -> None:
        s.on_nodes_listed(self.nodes)
        s.on_queues_listed(_queues(len(self.nodes) * 8))
        s.on_groups_listed("scheduling.x-k8s.io", self.groups)
        s.on_pods_listed(self.running + self.pending)

    def step(self, dt: float = 1.0) -> dict[str, Any]:
        self.now += dt
        s = self.session
        t = time.perf_counter()
        with procmem.collector_paused():  # as the running scheduler steps
            out = s.step(self.now)
        took = time.perf_counter() - t
        if took > 0.5:
            procmem.trim()  # as the running scheduler does after a large step
        plan = out.plan
        # what the watch would show next: the bindings confirmed, the evicted pods gone
        for b in out.binds:
            pod = s.state.pods[PodUID(b.uid)]
            s.on_pod("MODIFIED", _bound(pod, b.node))
        for e in out.evictions:
            gone = s.state.pods.get(PodUID(e.uid))
            if gone is not None:
                s.on_pod("DELETED", gone)
        self.decisions.update(repr((sorted(b.uid for b in out.binds), sorted(e.uid for e in out.evictions),
                                    sorted(plan.tried) if plan is not None else ())).encode())
        return {
            "s": took,
            "cycle_s": plan.timings.get("total", 0.0) if plan is not None else 0.0,
            "units": len(plan.tried) if plan is not None else 0,
            "bound": len(out.binds),
            "conditions": len(out.unschedulable),
            "evicted": len(out.evictions),
            "asleep": len(s.waits),
            "unfinished": bool(plan is not None and plan.unfinished),
        }

    def churn(self, ended: int = 5, arrive: int = 10) -> None:
        """A few running pods end (their nodes have room again), a few pods arrive."""
        s = self.session
        bound = [p for p in s.state.pods.values() if p.node_name and p.phase == "Running"]
        for pod in self.rng.sample(bound, min(ended, len(bound))):
            s.on_pod("DELETED", pod)
        for _ in range(arrive):
            self.arrived += 1
            s.on_pod("ADDED", _pod(f"new{self.arrived}", self.rng.choice((1, 2)),
                                   f"team{self.rng.randrange(QUEUES)}", created=self.now))


def _bound(pod: Pod, node: str) -> Pod:
    from dataclasses import replace
    return replace(pod, node_name=node, phase="Running", started=pod.created)


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        med = statistics.median(values)
        out[key] = (round(med, 4), round(min(values), 4), round(max(values), 4)) if key in ("s", "cycle_s") \
            else round(med, 1)
    return out


def measure(nodes: int, pods: int, *, repeats: int = 5, same_work: bool = False) -> dict[str, Any]:
    kernels.warm_up()
    rss0 = (procstat.rss(os.getpid()) or 0)
    t = time.perf_counter()
    world = Backlog(nodes, pods, same_work=same_work)
    built = time.perf_counter() - t
    gc.collect()
    t = time.perf_counter()
    world.list_all()
    listed = time.perf_counter() - t
    rss = (procstat.rss(os.getpid()) or 0)
    first = world.step()
    # the walk stops at its budget once it has Bindings: they leave with the first step, and
    # the next steps (run at once) try the rest; the first pass ends when a walk finishes
    passes = [first]
    while passes[-1]["unfinished"] and len(passes) < 200:
        passes.append(world.step(dt=0.01))
    first_pass = {"steps": len(passes), "s": round(sum(r["s"] for r in passes), 3),
                  "bound": sum(r["bound"] for r in passes), "conditions": sum(r["conditions"] for r in passes)}
    settle = 0
    while settle < 50:  # until nothing is bound or evicted: the backlog that waits
        settle += 1
        r = world.step()
        if not r["bound"] and not r["evicted"]:
            break
    world.step(dt=11.0)  # past the longest back-off: what earlier events woke is tried
    idle = [world.step() for _ in range(repeats)]
    churn = []
    for i in range(CHURN_WARMUP + repeats * 4):
        world.churn()
        row = world.step()
        if i >= CHURN_WARMUP:  # the steady state of a busy cluster, not the first seconds
            churn.append(row)
    full = [world.step(dt=world.session.settings.retry_unschedulable + 1.0) for _ in range(repeats)]
    return {
        "nodes": nodes, "pending": len(world.pending), "running": len(world.running),
        "groups": len(world.groups), "build_s": round(built, 2), "intake_s": round(listed, 2),
        "rss_mib": round((procstat.rss(os.getpid()) or 0) / 2**20), "rss_before_mib": round(rss0 / 2**20),
        "rss_after_intake_mib": round(rss / 2**20),
        "first": first, "first_pass": first_pass, "settle_steps": settle, "idle": _stats(idle), "churn": _stats(churn), "full": _stats(full),
        "churn_total_s": round(sum(r["s"] for r in churn), 3), "same_work": same_work,
        "decisions": world.decisions.hexdigest()[:16],
    }


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The report's table: one row per cluster size."""
    if not rows:
        return []

    def ms(cell: Any) -> str:
        if isinstance(cell, list | tuple):
            return f"{1e3 * cell[0]:,.0f} ({1e3 * cell[1]:,.0f}-{1e3 * cell[2]:,.0f})"
        return f"{1e3 * cell:,.0f}"

    lines = [
        "A large backlog through the whole session (`python -m perf.backlog`; eight queues in two cohorts, "
        "85% of the GPUs busy, 70% single pods and 30% gang members of 8-32, far more than fits). "
        "Step time in ms, median (min-max); *units*: what the cycle was handed (median).",
        "",
        "| nodes | pending | running | first step | idle step | churn step (units) | every sleeper retried (units) "
        "| RSS after intake / end, MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['pending']:,} | {r['running']:,} | {ms(r['first']['s'])} | {ms(r['idle']['s'])} | "
            f"{ms(r['churn']['s'])} ({r['churn']['units']:g}) | {ms(r['full']['s'])} ({r['full']['units']:g}) | "
            f"{r['rss_after_intake_mib']} / {r['rss_mib']} |"
        )
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.backlog", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--pods", type=int, default=140_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--same-work", action="store_true",
                    help="time budgets off: every version of the code does the same work (see above)")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.nodes, args.pods, repeats=args.repeats, same_work=args.same_work), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
