"""Declarative queue scenarios: nodes, queues, running and pending work -> expected
admissions, placements, evictions and reasons (``tests/scenarios/queue-*.yaml``).

The runner below walks the pending units the way the cycle is meant to once queues are
integrated (see the module docstrings of :mod:`batchsched.core.queues` and
:mod:`batchsched.core.preemption`): queue assignment, fair order, quota (quorum, then as
many elastic extras as quota allows), placement with ``kernels.place_members``, and, for a
unit that does not fit, victim selection. A preemptor's victims are removed at once and
its quorum is charged where the search promised: in the cycle that is the nomination that
holds those nodes for it while the victims terminate. The capacity the victims free beyond
that is free for this cycle's decisions, but a unit placed on it cannot be bound while the
victims still hold the node: it is nominated there too (a kubelet would refuse the pod).

The same files also run through the real :meth:`batchsched.core.cycle.Cycle.run`, with the
pods, groups and queues as objects in the mirror (``tests/unit/test_queue_cycle.py``).

A scenario file::

    now: 10000                       # seconds; the clock the policy sees
    nodes: [{name: n1, gpu: 8}]      # cpu 64 and memory 256Gi unless given
    queues:                          # the Queue spec, flattened: resources by name
      - {name: org}
      - {name: a, parent: org, resources: {nvidia.com/gpu: {nominal: 8}}}
    namespaces: {ml: {batchsched.io/default-queue: a}}   # namespace labels (optional)
    defaultQueue: a                  # the configured default (optional)
    maxWait: 3600                    # the aging bound (optional)
    running:                         # each pod: node, gpu, elastic (extra beyond quorum)
      - {name: r, queue: a, priority: 0, start: 0, pods: [{node: n1, gpu: 8}], labels: {app: r}}
    pdbs:                            # PodDisruptionBudgets (namespace default unless given)
      - {name: keep-r, selector: {app: r}, disruptionsAllowed: 0}
    pending:                         # pods: a count (with gpu: per pod) or a list
      - {name: p, queue: a, priority: 5, created: 10, pods: 2, gpu: 4, minMember: 2}
    expect:
      admitted: {p: [n1, n1]}        # placed now: member -> node
      nominated: {p: [n1]}           # placed by preemption: quorum -> held node
      evicted: {r: whole}            # or the evicted pod names: [r-1, r-2]
      pending: {p: "substring of the reason"}
      problems: {p: "substring of the queue problem"}
      order: [p, q]                  # the order units were tried (optional)

``queue:`` sets the ``batchsched.io/queue`` label; ``podGroupQueue:`` and ``namespace:`` are
the other sources of a queue. Every pending unit must appear in exactly one of admitted,
nominated, pending or problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from batchsched.core.disruption import DisruptionBook, parse_pdb
from batchsched.core.model import Pod, PodUID
from batchsched.core.placement import kernels
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import RunningPod, RunningUnit
from batchsched.core.preemption import NoPreemption, Preemptor, select_victims
from batchsched.core.quantity import to_units
from batchsched.core.queues import (
    QUEUE_LABEL,
    FairOrder,
    QueueName,
    QueueProblem,
    QueueTree,
    assign_queue,
)

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("queue-*.yaml"))
COLUMNS = ("cpu", "memory", "pods", "nvidia.com/gpu")
GPU_COL = 3


@dataclass(frozen=True)
class Pending:
    key: str
    uid: str
    priority: int
    created: float
    pods: tuple[str, ...]
    reqs: np.ndarray  # type: ignore[type-arg]
    min_count: int
    allowed: np.ndarray  # type: ignore[type-arg]


@dataclass
class Outcome:
    admitted: dict[str, list[str]] = field(default_factory=dict)
    nominated: dict[str, list[str]] = field(default_factory=dict)
    evicted: dict[str, Any] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def request(spec: dict[str, Any]) -> np.ndarray:  # type: ignore[type-arg]
    return np.array([to_units("cpu", spec.get("cpu", 1)), to_units("memory", spec.get("memory", "1Gi")),
                     1, int(spec.get("gpu", 0))], dtype=np.int64)


def queue_object(spec: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {k: v for k, v in spec.items() if k not in ("name", "resources")}
    if "resources" in spec:
        body["resources"] = [{"name": name, **values} for name, values in spec["resources"].items()]
    return {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": spec["name"]}, "spec": body}


def pod_specs(unit: dict[str, Any]) -> list[dict[str, Any]]:
    pods = unit.get("pods", 1)
    if isinstance(pods, int):
        return [{k: v for k, v in unit.items() if k in ("gpu", "cpu", "memory")} for _ in range(pods)]
    return list(pods)


def pdb_object(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": spec["name"], "namespace": spec.get("namespace", "default")},
            "spec": {"selector": {"matchLabels": spec.get("selector", {})}},
            "status": {"disruptionsAllowed": spec.get("disruptionsAllowed", 0)}}


def protection(sc: dict[str, Any], unit: dict[str, Any], n_pods: int) -> str:
    budgets = DisruptionBook()
    budgets.replace(parse_pdb(pdb_object(b)) for b in sc.get("pdbs", []))
    pods = [Pod(uid=PodUID(f"{unit['name']}-{i}"), namespace=unit.get("namespace", "default"),
                name=f"{unit['name']}-{i}", labels=unit.get("labels", {})) for i in range(n_pods)]
    return budgets.protecting(pods)


def run_scenario(sc: dict[str, Any]) -> Outcome:
    now = float(sc.get("now", 0))
    node_names = [n["name"] for n in sc["nodes"]]
    alloc = np.stack([request({"cpu": n.get("cpu", 64), "memory": n.get("memory", "256Gi"), "gpu": n.get("gpu", 0)})
                      for n in sc["nodes"]])
    alloc[:, 2] = 110
    used = np.zeros_like(alloc)
    terminating = np.zeros_like(alloc)  # what victims still hold while they terminate
    tree = QueueTree.from_objects([queue_object(q) for q in sc.get("queues", [])], COLUMNS)
    namespaces = sc.get("namespaces", {})
    scoring = ScoringConfig().arrays(COLUMNS)
    out = Outcome()

    def queue_of(unit: dict[str, Any]) -> QueueName | QueueProblem | None:
        labels = {QUEUE_LABEL: unit["queue"]} if "queue" in unit else {}
        return assign_queue(labels=labels, podgroup_queue=unit.get("podGroupQueue"),
                            namespace_labels=namespaces.get(unit.get("namespace", "default")),
                            default_queue=sc.get("defaultQueue"), tree=tree)

    running: list[RunningUnit] = []
    for r in sc.get("running", []):
        q = queue_of(r)
        assert not isinstance(q, QueueProblem), q
        pods = tuple(
            RunningPod(uid=f"{r['name']}-{i}", node=node_names.index(p["node"]), req=request(p),
                       gpus=int(p.get("gpu", 0)), elastic=bool(p.get("elastic", False)))
            for i, p in enumerate(pod_specs(r))
        )
        unit = RunningUnit(key=r["name"], queue=q, priority=int(r.get("priority", 0)),
                           created=float(r.get("created", 0)), uid=f"uid-{r['name']}",
                           start=float(r.get("start", 0)), pods=pods,
                           protected=protection(sc, r, len(pods)))
        for pod in pods:
            used[pod.node] += pod.req
        if q is not None:
            tree.admit(q, sum((p.req for p in pods), start=np.zeros(len(COLUMNS), dtype=np.int64)))
        running.append(unit)
    assert np.all(used <= alloc), "running work over-commits a node"
    tree.check()

    by_queue: dict[QueueName | None, list[Pending]] = {}
    for u in sc.get("pending", []):
        q = queue_of(u)
        if isinstance(q, QueueProblem):
            out.problems[u["name"]] = q.message
            continue
        specs = pod_specs(u)
        allowed = np.array([n in u.get("nodes", node_names) for n in node_names], dtype=np.bool_)
        by_queue.setdefault(q, []).append(Pending(
            key=u["name"], uid=f"uid-{u['name']}", priority=int(u.get("priority", 0)),
            created=float(u.get("created", 0)), pods=tuple(f"{u['name']}-{i}" for i in range(len(specs))),
            reqs=np.stack([request(p) for p in specs]), min_count=int(u.get("minMember", len(specs))),
            allowed=allowed,
        ))

    order = FairOrder(tree, by_queue, now=now, max_wait=sc.get("maxWait"),
                      request=lambda u: u.reqs[: u.min_count].sum(axis=0))
    for q, unit in order:
        out.order.append(unit.key)
        n_pods = len(unit.pods)
        masks = unit.allowed[None, :].copy()
        static = np.zeros_like(masks, dtype=np.int64)
        sig = np.zeros(n_pods, dtype=np.int64)
        k = n_pods if q is None else tree.admissible_prefix(q, unit.reqs, unit.min_count)
        reason = ""
        if k:
            placed_at = np.full(k, -1, dtype=np.int64)
            placed = kernels.place_members(
                alloc, used, np.ascontiguousarray(unit.reqs[:k]), sig[:k], masks, static, scoring.weights,
                scoring.scalar, scoring.shape_u, scoring.shape_s, scoring.strategy, unit.min_count, placed_at,
            )
            if placed:
                members = [m for m in range(k) if placed_at[m] >= 0]
                if q is not None:
                    tree.admit(q, unit.reqs[members].sum(axis=0))
                nodes = {int(placed_at[m]) for m in members}
                if any((used[n] + terminating[n] > alloc[n]).any() for n in nodes):
                    out.nominated[unit.key] = [node_names[placed_at[m]] for m in members]
                else:
                    out.admitted[unit.key] = [node_names[placed_at[m]] for m in members]
                running.append(RunningUnit(
                    key=unit.key, queue=q, priority=unit.priority, created=unit.created, uid=unit.uid,
                    start=now, pods=tuple(RunningPod(uid=unit.pods[m], node=int(placed_at[m]), req=unit.reqs[m],
                                                     gpus=int(unit.reqs[m][GPU_COL]), elastic=m >= unit.min_count)
                                          for m in members),
                ))
                order.admitted(unit)
                continue
            reason = f"the gang of {unit.min_count} does not fit on the nodes"
        else:
            assert q is not None
            reason = tree.admissible(q, unit.reqs[: unit.min_count].sum(axis=0)) or "quota"
        result = select_victims(
            Preemptor(key=unit.key, queue=q, priority=unit.priority, created=unit.created, uid=unit.uid,
                      reqs=unit.reqs, sig=sig, masks=masks, static_score=static, min_count=unit.min_count),
            running, alloc=alloc, used=used, tree=tree,
            scoring=scoring, now=now,
        )
        if isinstance(result, NoPreemption):
            out.pending[unit.key] = f"{reason}; {result.reason}"
            order.skipped(unit)
            continue
        for v in result.victims:
            for pod in v.pods:
                used[pod.node] -= pod.req
                terminating[pod.node] += pod.req
            if v.unit.queue is not None:
                tree.release(v.unit.queue, sum((p.req for p in v.pods), start=np.zeros(len(COLUMNS), dtype=np.int64)))
            running.remove(v.unit)
            if v.whole:
                out.evicted[v.unit.key] = "whole"
            else:
                out.evicted[v.unit.key] = [p.uid for p in v.pods]
                running.append(replace(v.unit, pods=tuple(p for p in v.unit.pods if p not in v.pods)))
        core = unit.reqs[: unit.min_count]
        for m, n in enumerate(result.nodes):
            used[n] += core[m]
        if q is not None:
            tree.admit(q, core.sum(axis=0))
        running.append(RunningUnit(
            key=unit.key, queue=q, priority=unit.priority, created=unit.created, uid=unit.uid, start=now,
            pods=tuple(RunningPod(uid=unit.pods[m], node=n, req=core[m], gpus=int(core[m][GPU_COL]))
                       for m, n in enumerate(result.nodes)),
        ))
        out.nominated[unit.key] = [node_names[n] for n in result.nodes]
        order.admitted(unit)

    # whatever happened, the limits hold
    tree.check()
    assert np.all(used <= alloc)
    return out


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    kernels.warm_up()


def test_there_are_scenarios() -> None:
    assert len(SCENARIOS) >= 6


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    sc = yaml.safe_load(path.read_text())
    expect = sc["expect"]
    got = run_scenario(sc)
    assert got.admitted == expect.get("admitted", {})
    assert got.nominated == expect.get("nominated", {})
    assert got.evicted == expect.get("evicted", {})
    assert sorted(got.pending) == sorted(expect.get("pending", {})), got.pending
    for key, text in expect.get("pending", {}).items():
        assert text in got.pending[key], (key, got.pending[key])
    assert sorted(got.problems) == sorted(expect.get("problems", {})), got.problems
    for key, text in expect.get("problems", {}).items():
        assert text in got.problems[key], (key, got.problems[key])
    if "order" in expect:
        assert got.order == expect["order"]
    names = [u["name"] for u in sc.get("pending", [])]
    decided = [*got.admitted, *got.nominated, *got.pending, *got.problems]
    assert sorted(decided) == sorted(names)
