"""Cycle time with queues: 50 queues, 10,000 pending groups of 1-8 pods, 5,000 nodes.

Run::

    python -m perf queues [--nodes 5000] [--groups 10000] [--queues 50] [--repeats 3]

Two clusters are measured, both with 5,000 nodes of 8 GPUs, 64 cpu and 512Gi:

- *empty*: nothing runs; the pending groups (1-8 pods of 1, 2, 4 or 8 GPUs, a third of
  them with one elastic extra; size 1 is a plain pod) fill the cluster and the rest waits;
- *busy*: half of every node's GPUs run low-priority work of the same queues (a queue
  borrowing now and then), and a tenth of the pending groups have a higher priority, so
  the cycle also searches for victims (up to ``preemption.maxSearchesPerCycle``).

50 queues: 5 cohorts of 10 leaves, each leaf with a nominal of 1/50 of the GPUs and a
lending limit of half of it. Reported per cycle: building the queue input
(:meth:`QueueBook.prepare`), the cycle's setup (running units charged to the queues,
nominations, fair order), the cycle itself (setup, kernels, preemption) and the total, median over the repeats after the first (the first cycle pays
for caches: node filter masks, request layouts).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from typing import Any

from batchsched.core.cycle import Cycle
from batchsched.core.gangs import GroupBook, PodGroup
from batchsched.core.mirror import ClusterState
from batchsched.core.model import GPU, Node, NodeName, Pod, PodUID
from batchsched.core.placement import kernels
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import Unit, single_unit
from batchsched.core.queues import QueueBook, QueueSettings

GIB = 2**30


def _queues(count: int, gpus: int) -> list[dict[str, Any]]:
    cohorts = max(1, count // 10)
    nominal = gpus // count
    out: list[dict[str, Any]] = []
    for c in range(cohorts):
        out.append({"metadata": {"name": f"org{c}"}, "spec": {}})
    for i in range(count):
        out.append({"metadata": {"name": f"q{i:02d}"}, "spec": {
            "parent": f"org{i % cohorts}",
            "resources": [{"name": GPU, "nominal": nominal, "lendingLimit": nominal // 2}],
        }})
    return out


def _pod(name: str, *, gpu: int, queue: str, priority: int, created: float, group: str = "",
         node: str = "") -> Pod:
    labels = {"batchsched.io/queue": queue}
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    return Pod(
        uid=PodUID(f"uid-{name}"), namespace="bench", name=name, node_name=node,
        phase="Running" if node else "Pending", priority=priority, created=created,
        started=created if node else 0.0,
        requests={"cpu": 1000, "memory": 4 * GIB, "pods": 1, GPU: gpu}, labels=labels,
    )


def build(nodes: int, groups: int, queues: int, *, busy: bool, seed: int = 7) -> tuple[ClusterState, GroupBook, QueueBook]:
    rng = random.Random(seed)
    state = ClusterState()
    book = GroupBook()
    qbook = QueueBook(QueueSettings(max_searches=64))
    for i in range(nodes):
        state.node_event("ADDED", Node(
            name=NodeName(f"node-{i:05d}"), allocatable={"cpu": 64_000, "memory": 512 * GIB, "pods": 110, GPU: 8},
        ))
    qbook.replace_queues(_queues(queues, nodes * 8))

    def add(pod: Pod) -> None:
        state.pod_event("ADDED", pod)
        book.pod_event("ADDED", pod)

    if busy:
        # half of each node's GPUs: 4 single-GPU pods, or one 4-GPU member of a 4-node gang
        for i in range(nodes):
            q = f"q{rng.randrange(queues):02d}"
            node = f"node-{i:05d}"
            if i % 8 < 4:
                for k in range(4):
                    add(_pod(f"run-{i}-{k}", gpu=1, queue=q, priority=0, created=float(i), node=node))
            else:
                g = f"rg-{i // 4}"
                if i % 4 == 0:
                    book.group_event("ADDED", PodGroup(api="scheduling.x-k8s.io", namespace="bench", name=g,
                                                       uid=f"uid-{g}", min_member=4, created=float(i)))
                add(_pod(f"run-{i}", gpu=4, queue=q, priority=0, created=float(i), group=g, node=node))
    for g in range(groups):
        size = rng.randint(1, 8)
        gpu = rng.choice((1, 2, 4, 8))
        q = f"q{rng.randrange(queues):02d}"
        priority = 10 if busy and rng.random() < 0.1 else 0
        created = 1000.0 + g
        if size == 1:
            add(_pod(f"p{g}", gpu=gpu, queue=q, priority=priority, created=created))
            continue
        name = f"g{g}"
        quorum = size - 1 if rng.random() < 1 / 3 else size
        book.group_event("ADDED", PodGroup(api="scheduling.x-k8s.io", namespace="bench", name=name,
                                           uid=f"uid-{name}", min_member=quorum, created=created))
        for m in range(size):
            add(_pod(f"{name}-{m}", gpu=gpu, queue=q, priority=priority, created=created, group=name))
    return state, book, qbook


def units_of(state: ClusterState, book: GroupBook) -> list[Unit]:
    singles = [single_unit(p) for uid, p in state.pending.items() if not book.in_group(uid)]
    return singles + book.units(state, 0.0)


def measure(nodes: int, groups: int, queues: int, *, busy: bool, repeats: int) -> dict[str, Any]:
    state, book, qbook = build(nodes, groups, queues, busy=busy)
    cycle = Cycle(ScoringConfig())
    rows: list[dict[str, float]] = []
    summary: dict[str, Any] = {}
    units = units_of(state, book)
    gc.collect()
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        snap = state.snapshot()
        qi = qbook.prepare(state=state, groups=book, snap=snap, units=units, now=10_000.0)
        t1 = time.perf_counter()
        plan = cycle.run(snap, units, queues=qi)
        t2 = time.perf_counter()
        running = qbook.last_running.value if qbook.last_running is not None else None
        rows.append({
            "prepare": t1 - t0, "setup": plan.timings.get("order", 0.0), "cycle": t2 - t1,
            "kernels": plan.timings["kernel"], "preempt": plan.timings["preempt"], "total": t2 - t0,
        })
        summary = {
            "units": len(units), "pending_pods": len(state.pending), "running_units": len(running or ()),
            "bound": len(plan.bindings), "failed_units": len(plan.failed_units),
            "preemptions": len(plan.preemptions), "searches": plan.searches,
        }
    later = rows[1:] or rows
    steady = {k: round(statistics.median(r[k] for r in later), 3) for k in later[0]}
    first = {k: round(v, 3) for k, v in rows[0].items()}
    return {"cluster": "busy" if busy else "empty", **summary, "first_s": first, "steady_s": steady}


def main(argv: list[str] | None = None) -> list[Any]:
    ap = argparse.ArgumentParser(prog="python -m perf queues", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--queues", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=("empty", "busy"))
    args = ap.parse_args(argv)
    kernels.warm_up()
    results = []
    for busy in (False, True):
        if args.only and args.only != ("busy" if busy else "empty"):
            continue
        result = measure(args.nodes, args.groups, args.queues, busy=busy, repeats=args.repeats)
        print(result, flush=True)
        results.append(result)
    return results


if __name__ == "__main__":
    main()
