"""Cycle and kernel benchmarks, no apiserver: synthetic clusters through the real code.

* **cycle**: a :class:`~batchsched.core.mirror.ClusterState` of N nodes (8 GPUs each, a
  third of their GPUs already taken by bound pods) and P pending pods (1, 2, 4 or 8 GPUs,
  three priorities), through what the scheduler does each cycle: build the units
  (``single_unit``), take the snapshot, run :meth:`Cycle.run`. Time is split into
  *snapshot*, *units*, *order* (the cycle's preparation: node filter, scoring arrays, usage
  copy, the sort by priority), *kernels* (the placement kernel calls) and *plan* (the rest
  of the cycle: request matrices, masks, bindings and the unschedulable explanations). The
  first cycle on a snapshot (node filter built) and the later ones (filter cached) are
  reported apart. With ``twin``, the same through the plain-Python twins (small sizes).
* **gang**: one gang of 64 or 512 single-GPU pods (``Unit`` with ``min_count`` = size)
  on 1,000 and 10,000 half-used nodes: the placement kernel alone, and the whole cycle.
* **warm-up**: a fresh process importing the kernels and calling ``warm_up()``, with a
  cold numba cache (an empty temporary ``NUMBA_CACHE_DIR``) and then warm (same dir).
* **mirror**: a fresh process that feeds a ClusterState with N nodes and P pods parsed
  from apiserver-like JSON (LIST pages of 500, orjson with the collector paused, as the
  watch does): its RSS after imports, after the mirror is built, and its peak.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from batchsched.core.cycle import Cycle
from batchsched.core.devices import ELASTIC_CORE, ELASTIC_MEMORY
from batchsched.core.mirror import ClusterState
from batchsched.core.model import GPU, Node, NodeName, Pod, PodUID, parse_pod
from batchsched.core.placement import kernels, reference
from batchsched.core.placement.cards import CardPolicy
from batchsched.core.placement.problem import PlacementProblem
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import Unit, single_unit
from perf import procstat

NODE_ALLOC = {"cpu": 96_000, "memory": 1024 * 2**30, "pods": 110, GPU: 8}
GPU_MIX = ((1, 0.55), (2, 0.2), (4, 0.15), (8, 0.1))
PRIORITIES = (-1, 1, 10)


def _node(i: int) -> Node:
    return Node(name=NodeName(f"node-{i:05d}"), uid=f"n{i}", labels={"kubernetes.io/hostname": f"node-{i:05d}"},
                allocatable=NODE_ALLOC)


def _pod(i: int, gpus: int, *, prefix: str = "p", priority: int = 0, node: str = "", created: float = 0.0) -> Pod:
    return Pod(
        uid=PodUID(f"{prefix}-{i}"), namespace="bench", name=f"{prefix}-{i:06d}", scheduler_name="batchsched",
        node_name=node, phase="Running" if node else "Pending", priority=priority, created=created,
        requests={"cpu": 1000 * gpus, "memory": 8 * 2**30 * gpus, GPU: gpus, "pods": 1},
    )


def synthetic_state(nodes: int, *, used_fraction: float = 1 / 3, seed: int = 1) -> ClusterState:
    """N nodes with about ``used_fraction`` of their GPUs taken by bound 1-GPU pods."""
    rng = random.Random(seed)
    state = ClusterState(["batchsched"])
    for i in range(nodes):
        state.node_event("ADDED", _node(i))
    k = 0
    for i in range(nodes):
        taken = sum(1 for _ in range(8) if rng.random() < used_fraction)
        for _ in range(taken):
            state.pod_event("ADDED", _pod(k, 1, prefix="b", node=f"node-{i:05d}"))
            k += 1
    return state


def pending_pods(count: int, *, seed: int = 2, mix: bool = True) -> list[Pod]:
    rng = random.Random(seed)
    sizes = [g for g, _ in GPU_MIX]
    weights = [w for _, w in GPU_MIX]
    return [
        _pod(i, rng.choices(sizes, weights)[0] if mix else 1, priority=rng.choice(PRIORITIES), created=float(i))
        for i in range(count)
    ]


CARD_NODE_ALLOC = {"cpu": 96_000, "memory": 1024 * 2**30, "pods": 110,
                   ELASTIC_CORE: 800, ELASTIC_MEMORY: 8 * 16384}
#: (gpu-core, share of pods): a fractional mix in the spirit of openb (most tasks share)
CARD_MIX = ((25, 0.3), (50, 0.3), (100, 0.2), (200, 0.1), (400, 0.1))


def card_state(nodes: int, pods: int, *, used_fraction: float = 1 / 3, seed: int = 1) -> ClusterState:
    """``nodes`` nodes of 8 elasticgpu.io cards, about ``used_fraction`` of the cards held by
    bound quarter/half-card pods (with their assignment annotations), and ``pods`` pending
    pods of :data:`CARD_MIX`. Pods are parsed from JSON, as the watch gives them."""
    rng = random.Random(seed)
    state = ClusterState(["batchsched"])
    for i in range(nodes):
        state.node_event("ADDED", Node(name=NodeName(f"node-{i:05d}"), uid=f"n{i}",
                                       labels={"kubernetes.io/hostname": f"node-{i:05d}"},
                                       allocatable=CARD_NODE_ALLOC))

    def pod(name: str, core: int, node: str = "", card: int = -1) -> Pod:
        meta: dict[str, Any] = {"name": name, "namespace": "bench", "uid": name}
        if card >= 0:
            meta["annotations"] = {"elasticgpu.io/container-main": str(card)}
        return parse_pod({
            "metadata": meta,
            "spec": {"schedulerName": "batchsched", "nodeName": node, "containers": [{
                "name": "main", "resources": {"requests": {"cpu": "1", "memory": "4Gi", ELASTIC_CORE: str(core)}},
            }]},
            "status": {"phase": "Running" if node else "Pending"},
        })

    k = 0
    for i in range(nodes):
        for card in range(8):
            if rng.random() < used_fraction:
                state.pod_event("ADDED", pod(f"b-{k}", rng.choice((25, 50)), f"node-{i:05d}", card))
                k += 1
    sizes = [c for c, _ in CARD_MIX]
    weights = [w for _, w in CARD_MIX]
    for j in range(pods):
        state.pod_event("ADDED", pod(f"p-{j:06d}", rng.choices(sizes, weights)[0]))
    return state


def bench_cards(nodes: int, pods: int, *, policy: str = "fragmentation", repeats: int = 3) -> dict[str, Any]:
    """One cycle over :func:`card_state` under a card policy: the per-card model's cost."""
    state = card_state(nodes, pods)
    cycle = Cycle(ScoringConfig(), cards=CardPolicy(policy=policy))
    times: list[float] = []
    plan = None
    for _ in range(repeats + 1):
        units = [single_unit(p) for p in state.pending.values()]
        snap = state.snapshot()
        plan, t = _timed(cycle.run, snap, units)
        times.append(t)
    assert plan is not None
    return {"nodes": nodes, "pods": pods, "policy": policy, "placed": len(plan.bindings),
            "first_s": round(times[0], 4), "steady_s": round(statistics.median(times[1:]), 4)}


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def bench_cycle(nodes: int, pods: int, *, jit: bool = True, repeats: int = 3, mix: bool = True) -> dict[str, Any]:
    state = synthetic_state(nodes)
    for p in pending_pods(pods, mix=mix):
        state.pod_event("ADDED", p)
    cycle = Cycle(ScoringConfig(), use_jit=jit)
    rows: list[dict[str, float]] = []
    placed = unschedulable = 0
    gc.collect()
    for _ in range(repeats + 1):
        units, t_units = _timed(lambda: [single_unit(p) for p in state.pending.values()])
        snap, t_snap = _timed(state.snapshot)
        plan, t_run = _timed(cycle.run, snap, units)
        order = plan.timings["order"]
        kernel = plan.timings["kernel"]
        rows.append({
            "snapshot": t_snap, "units": t_units, "order": order, "kernels": kernel,
            "plan": t_run - order - kernel, "cycle": t_run, "total": t_snap + t_units + t_run,
        })
        placed, unschedulable = len(plan.bindings), len(plan.unschedulable)
    first, later = rows[0], rows[1:]
    steady = {k: statistics.median(r[k] for r in later) for k in later[0]} if later else first
    return {
        "nodes": nodes, "pods": pods, "jit": jit, "gpu_mix": mix,
        "placed": placed, "unschedulable": unschedulable,
        "first_s": {k: round(v, 4) for k, v in first.items()},
        "steady_s": {k: round(v, 4) for k, v in steady.items()},
    }


def bench_gang(nodes: int, size: int, *, repeats: int = 5) -> dict[str, Any]:
    state = synthetic_state(nodes, used_fraction=0.5, seed=3)
    gang = [_pod(i, 1, prefix=f"gang{size}") for i in range(size)]
    for p in gang:
        state.pod_event("ADDED", p)
    unit = Unit(key=f"bench/gang-{size}", pods=tuple(gang), min_count=size, priority=0, created=0.0, uid="gang")
    snap = state.snapshot()
    cycle = Cycle(ScoringConfig())
    arrays = ScoringConfig().arrays(snap.columns)
    col = {c: i for i, c in enumerate(snap.columns)}
    reqs = np.zeros((size, len(snap.columns)), dtype=np.int64)
    for m, p in enumerate(gang):
        for name, v in p.requests.items():
            reqs[m, col[name]] = v
    sig = np.zeros(size, dtype=np.int64)
    masks = np.ones((1, nodes), dtype=np.bool_)
    static = np.zeros((1, nodes), dtype=np.int64)
    out = np.empty(size, dtype=np.int64)
    k_times, c_times = [], []
    placed = 0
    for _ in range(repeats + 1):
        used = snap.used.copy()
        t = time.perf_counter()
        placed = kernels.place(PlacementProblem(snap.alloc, used, reqs, sig, masks, static, arrays, size), out)
        k_times.append(time.perf_counter() - t)
        plan, t_cycle = _timed(cycle.run, snap, [unit])
        c_times.append(t_cycle)
        assert len(plan.bindings) == size, "the gang did not fit"
    return {
        "nodes": nodes, "gang": size, "placed": int(placed),
        "kernel_ms": round(1e3 * statistics.median(k_times[1:]), 3),
        "cycle_ms": round(1e3 * statistics.median(c_times[1:]), 3),
        "first_cycle_ms": round(1e3 * c_times[0], 3),
    }


def bench_warmup() -> dict[str, Any]:
    code = (
        "import json, time; t = time.perf_counter(); from batchsched.core.placement import kernels; "
        "i = time.perf_counter() - t; w = kernels.warm_up(); "
        "print(json.dumps({'import_s': round(i, 3), 'warm_up_s': round(w, 3)}))"
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold", "warm"):
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["process_s"] = round(time.perf_counter() - t, 3)
            out[label] = result
    return out


# -- the mirror's memory --------------------------------------------------------------------


def _pod_json(i: int, node: str, gpus: int) -> dict[str, Any]:
    """A pod as the apiserver lists it (kwok-run), about 2.5 KB of JSON."""
    name = f"job-{i // 8:05d}-worker-{i % 8}"
    ts = "2026-01-01T00:00:00Z"
    requests = {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {
            "name": name, "namespace": f"team-{i % 20}", "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(100000 + i), "creationTimestamp": ts,
            "labels": {"app": "trainer", "job-name": f"job-{i // 8:05d}", "batchsched.io/queue": f"q{i % 20}"},
            "annotations": {"batchsched.io/submitted-by": "perf"},
            "managedFields": [{
                "manager": "kubectl-create", "operation": "Update", "apiVersion": "v1", "time": ts,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:job-name": {}}},
                             "f:spec": {"f:containers": {'k:{"name":"main"}': {
                                 ".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                                 "f:resources": {".": {}, "f:limits": {".": {}, "f:nvidia.com/gpu": {}},
                                                 "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}, "f:nvidia.com/gpu": {}}},
                                 "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
                                 "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
                                 "f:schedulerName": {}, "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}},
            }],
        },
        "spec": {
            "containers": [{
                "name": "main", "image": "registry.example/trainer:2026.01", "imagePullPolicy": "IfNotPresent",
                "resources": {"requests": requests, "limits": {"nvidia.com/gpu": str(gpus)}},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            }],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
            "schedulerName": "batchsched", "priority": 1, "priorityClassName": "default-priority",
            "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
            **({"nodeName": node} if node else {}),
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        },
        "status": {
            "phase": "Running" if node else "Pending", "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": "True" if node else "False", "lastProbeTime": None, "lastTransitionTime": ts}
                for t in (("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
                          if node else ("PodScheduled",))
            ],
            **({"hostIP": "10.96.0.1", "podIP": f"10.64.{i // 250 % 250}.{i % 250}", "startTime": ts} if node else {}),
        },
    }


def _node_json(i: int) -> dict[str, Any]:
    name = f"gpu-node-{i}"
    res = {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "metadata": {"name": name, "uid": f"node-{i}", "resourceVersion": str(i),
                     "labels": {"kubernetes.io/hostname": name, "type": "kwok", "nvidia.com/gpu.product": "A100",
                                "batchsched.io/rack": f"rack-{i // 8}", "batchsched.io/block": f"block-{i // 32}"}},
        "spec": {},
        "status": {"capacity": res, "allocatable": res,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _pages(items: Iterator[dict[str, Any]], page: int = 500) -> Iterator[bytes]:
    batch: list[dict[str, Any]] = []
    for obj in items:
        batch.append(obj)
        if len(batch) == page:
            yield orjson.dumps({"items": batch})
            batch = []
    if batch:
        yield orjson.dumps({"items": batch})


def mirror_child(nodes: int, pods: int, bound_fraction: float) -> dict[str, Any]:

    from batchsched.core.model import parse_node, parse_pod

    pid = os.getpid()
    base = procstat.rss(pid)
    state = ClusterState(["batchsched"])
    n_bound = min(int(pods * bound_fraction), nodes * 8)
    t = time.perf_counter()
    parse_s = 0.0
    for raw in _pages(_node_json(i) for i in range(nodes)):
        t0 = time.perf_counter()
        gc.disable()
        objs = orjson.loads(raw)["items"]
        gc.enable()
        for o in objs:
            state.node_event("ADDED", parse_node(o))
        parse_s += time.perf_counter() - t0
    for raw in _pages(_pod_json(i, f"gpu-node-{i // 8}" if i < n_bound else "", 1) for i in range(pods)):
        t0 = time.perf_counter()
        gc.disable()
        objs = orjson.loads(raw)["items"]
        gc.enable()
        for o in objs:
            state.pod_event("ADDED", parse_pod(o))
        parse_s += time.perf_counter() - t0
    del objs, raw
    gc.collect()
    snap = state.snapshot()
    built = time.perf_counter() - t
    state.check()
    return {
        "nodes": len(state.nodes), "pods": len(state.pods), "pending": len(state.pending),
        "bound": n_bound, "snapshot_nodes": len(snap.nodes),
        "rss_after_imports_mib": round((base or 0) / 2**20, 1),
        "rss_with_mirror_mib": round((procstat.rss(pid) or 0) / 2**20, 1),
        "peak_rss_mib": round((procstat.peak_rss(pid) or 0) / 2**20, 1),
        "ingest_s": round(parse_s, 2),
        "wall_s_incl_json_generation": round(built, 2),
    }


def bench_backlog(nodes: int, pods: int, repeats: int = 3) -> dict[str, Any]:
    """:mod:`perf.backlog` in a fresh process (its resident size is the session's own)."""
    proc = subprocess.run(
        [sys.executable, "-m", "perf.backlog", "--nodes", str(nodes), "--pods", str(pods), "--repeats", str(repeats)],
        capture_output=True, text=True, check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def bench_mirror(nodes: int = 5000, pods: int = 50000, bound_fraction: float = 0.6) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "perf.cyclebench", "mirror", str(nodes), str(pods), str(bound_fraction)],
        capture_output=True, text=True, check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["mirror_mib"] = round(result["rss_with_mirror_mib"] - result["rss_after_imports_mib"], 1)
    return result


# -- the whole set ----------------------------------------------------------------------------

FULL: dict[str, Any] = {
    "cycle_nodes": [1000, 2000, 5000, 10000],
    "cycle_pods": [10000, 40000, 140000],
    "twin": [(100, 1000), (1000, 1000)],
    "gang_nodes": [1000, 10000],
    "gang_sizes": [64, 512],
    "mirror": (5000, 50000),
    "cards": [(1000, 2000), (5000, 2000), (10000, 2000)],
    "backlog": [(4000, 140000), (10000, 140000)],
}
QUICK: dict[str, Any] = {
    "cycle_nodes": [100, 400],
    "cycle_pods": [500, 2000],
    "twin": [(50, 200)],
    "gang_nodes": [200],
    "gang_sizes": [64],
    "mirror": (200, 2000),
    "cards": [(200, 500)],
    "backlog": [(200, 3000)],
}


def run_all(*, quick: bool = False, log: Any = None) -> dict[str, Any]:
    sizes = QUICK if quick else FULL
    say = log or (lambda m: None)
    out: dict[str, Any] = {"quick": quick, "cycle": [], "twin": [], "gang": []}
    say("kernel warm-up (cold and warm numba cache) ...")
    out["warm_up"] = bench_warmup()
    kernels.warm_up()
    for n in sizes["cycle_nodes"]:
        for p in sizes["cycle_pods"]:
            say(f"cycle: {n} nodes, {p} pending pods ...")
            out["cycle"].append(bench_cycle(n, p, repeats=2 if p >= 100000 else 3))
    for n, p in sizes["twin"]:
        say(f"cycle, JIT and plain-Python twin: {n} nodes, {p} pods ...")
        out["twin"].append({
            "jit": bench_cycle(n, p, jit=True, repeats=2),
            "twin": bench_cycle(n, p, jit=False, repeats=1),
        })
    for n in sizes["gang_nodes"]:
        for g in sizes["gang_sizes"]:
            say(f"gang of {g} on {n} nodes ...")
            out["gang"].append(bench_gang(n, g))
    out["cards"] = []
    for n, p in sizes["cards"]:
        say(f"cards: {n} nodes of 8 cards, {p} pending fractional/whole pods, per policy, and whole GPUs ...")
        row = {"whole_gpu": bench_cycle(n, p, repeats=2)}
        for policy in ("fragmentation", "binpack"):
            row[policy] = bench_cards(n, p, policy=policy, repeats=2)
        out["cards"].append(row)
    out["backlog"] = []
    for n, p in sizes["backlog"]:
        say(f"backlog through the whole session: {n} nodes, {p} pending pods (fresh process) ...")
        out["backlog"].append(bench_backlog(n, p))
    mn, mp = sizes["mirror"]
    say(f"mirror of {mn} nodes / {mp} pods (fresh process) ...")
    out["mirror"] = bench_mirror(mn, mp)
    out["reference_module"] = reference.__name__
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.cyclebench")
    sub = parser.add_subparsers(dest="cmd", required=True)
    mirror = sub.add_parser("mirror", help="(internal) build a mirror and print its memory as JSON")
    mirror.add_argument("nodes", type=int)
    mirror.add_argument("pods", type=int)
    mirror.add_argument("bound_fraction", type=float)
    args = parser.parse_args(argv)
    if args.cmd == "mirror":
        print(json.dumps(mirror_child(args.nodes, args.pods, args.bound_fraction)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
