"""Properties of queues and preemption over random workloads, through the real cycle.

Random nodes, a cohort of queues with random quotas and policies (and some unqueued work),
random jobs (gangs with elastic extras, single pods, priorities); several cycles, the
bindings confirmed at once and the victims of each preemption deleted now or a cycle later,
then submitted again (as their controller would). After every cycle:

- no queue holds more than its nominal plus what it may borrow (the tree's own check, on
  the cycle's view and on what is really running);
- shares never exceed capacity: no node is over-committed by what is bound, and the queues
  together use no more than the cluster has;
- no ping-pong: a job never preempts a job that preempted it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.core.model import GPU, PodUID
from batchsched.core.placement import kernels
from tests.builders import make_pod
from tests.unit.queue_world import QueueWorld
from tests.unit.test_queue_scenarios import queue_object

kernels.warm_up()

#: what the examples exercised (read by a test at the end of the module)
stats = {"preemptions": 0, "bound": 0, "examples": 0}

WITHIN = ["Never", "LowerPriority", "LowerOrNewerEqualPriority"]
RECLAIM = ["Never", "LowerPriority", "Any"]


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    nodes = draw(st.lists(st.sampled_from([4, 8]), min_size=2, max_size=3))
    leaves = draw(st.integers(2, 3))
    queues: list[dict[str, Any]] = [{"name": "org"}]
    for i in range(leaves):
        nominal = draw(st.sampled_from([0, 4, 8, 8, 12]))
        gpu: dict[str, Any] = {"nominal": nominal}
        if draw(st.booleans()):
            gpu["borrowingLimit"] = draw(st.sampled_from([0, 4, 8]))
        if nominal and draw(st.booleans()):
            gpu["lendingLimit"] = draw(st.integers(0, nominal))
        queues.append({"name": f"q{i}", "parent": "org", "resources": {GPU: gpu},
                       "preemption": {"withinQueue": draw(st.sampled_from(WITHIN)),
                                      "reclaimWithinCohort": draw(st.sampled_from(RECLAIM))}})
    jobs = []
    for j in range(draw(st.integers(4, 12))):
        pods = draw(st.integers(1, 3))
        jobs.append({
            "name": f"j{j}",
            "queue": draw(st.sampled_from([*(f"q{i}" for i in range(leaves)), None])),
            "priority": draw(st.sampled_from([-1, 0, 5, 10])),
            "gpu": draw(st.sampled_from([2, 4, 4, 8])),
            "pods": pods,
            "extras": draw(st.integers(0, pods - 1)),
            "arrives": draw(st.integers(0, 5)),
        })
    delays = draw(st.lists(st.booleans(), min_size=12, max_size=12))
    return {"nodes": nodes, "queues": queues, "jobs": jobs, "delays": delays}


def submit(w: QueueWorld, job: dict[str, Any], pods: int | None = None) -> None:
    n = job["pods"] if pods is None else pods
    w.unit(job["name"], [{"gpu": job["gpu"]}] * n, queue=job["queue"], priority=job["priority"],
           created=float(job["created"]), min_member=job["pods"] - job["extras"] if job["pods"] > 1 else None)


def check(w: QueueWorld, now: float) -> None:
    assert w.last_input is not None
    w.last_input.tree.check()  # the cycle's view: running, nominations and its admissions
    snap = w.state.snapshot()
    assert np.all(snap.used <= snap.alloc), "a node is over-committed"
    # what really runs, charged afresh
    qi = w.book.prepare(state=w.state, groups=w.groups, snap=snap, units=[], now=now)
    w.cycle.run(snap, [], queues=qi)
    qi.tree.check()
    gpu = snap.columns.index(GPU)
    used = sum(int(qi.tree.usage_vector(name)[gpu]) for name in qi.tree.names if qi.tree.is_leaf(name))
    assert used <= int(snap.alloc[:, gpu].sum()), "the queues use more than the cluster has"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=workloads())
def test_limits_hold_and_no_job_preempts_its_preemptor_back(world: dict[str, Any]) -> None:
    stats["examples"] += 1
    w = QueueWorld()
    for i, gpus in enumerate(world["nodes"]):
        w.node(f"n{i}", gpu=gpus)
    w.queues(queue_object(q) for q in world["queues"])
    jobs = {j["name"]: j for j in world["jobs"]}
    preempted_by: dict[str, set[str]] = {}  # victim job -> the jobs that preempted it
    doomed: list[str] = []  # victim pods to delete in the next round
    created = 0
    for rnd in range(10):
        now = 10_000.0 + 10 * rnd
        for job in world["jobs"]:
            if job["arrives"] == rnd:
                created += 1
                job["created"] = created
                submit(w, job)
        for uid in doomed:
            w.delete(uid)
        doomed = []
        plan = w.step(now)
        check(w, now)
        for rec in plan.preemptions:
            attacker = w.names[rec.preemptor.key]
            for v in rec.victims:
                victim = w.names[v.unit.key]
                assert victim not in preempted_by.get(attacker, set()), (
                    f"{attacker} preempted {victim}, which had preempted it"
                )
                preempted_by.setdefault(victim, set()).add(attacker)
                uids = [p.uid for p in v.pods]
                names = [w.state.pods[PodUID(u)].name for u in uids]
                if world["delays"][rnd]:
                    doomed.extend(uids)
                else:
                    for uid in uids:
                        w.delete(uid)
                # its controller submits the evicted pods again
                job = jobs[victim]
                if v.whole:
                    created += 1
                    job["created"] = created
                    resubmit = len(v.pods) if job["pods"] > 1 else None
                    w.unit(f"{victim}", [{"gpu": job["gpu"]}] * (resubmit or 1), queue=job["queue"],
                           priority=job["priority"], created=float(created), again=created,
                           min_member=job["pods"] - job["extras"] if job["pods"] > 1 else None)
                else:
                    assert v.unit.key.startswith("x-k8s:")
                    for name in names:
                        created += 1
                        w.pod(_recreated(f"{name}-r{created}", job), "ADDED")
        stats["preemptions"] += len(plan.preemptions)
        stats["bound"] += len(plan.bindings)


def _recreated(name: str, job: dict[str, Any]) -> dict[str, Any]:
    b = make_pod(name).uid(f"default-{name}").priority(job["priority"]).created(float(job["created"]))
    b.req(cpu="1", memory="1Gi", gpu=job["gpu"]).group(job["name"])
    if job["queue"]:
        b.label({"batchsched.io/queue": job["queue"]})
    return b.obj()


def test_the_examples_exercised_preemption() -> None:
    if stats["examples"]:  # the property ran in this session
        print(stats)
        assert stats["preemptions"] >= 10 and stats["bound"] > 0, stats
