"""The demo: a local GPU cluster, batchsched, and a real workload mix, start to finish.

``batchsched demo`` brings up the sandbox with fake GPU nodes shaped like the openb trace's
(16 G2 and 4 G3 with 8 GPUs, 4 V100M16 with 4, 8 T4 with 2: 192 GPUs), starts batchsched in this process,
submits 134 tasks taken from that trace (see ``demo_data/README.md``) with their CPU,
memory and GPU requests and a priority from their QoS class, and prints where they landed
and how full each node's GPUs are: single-GPU tasks pack onto as few nodes as possible, so
whole nodes stay free for the 8-GPU tasks. Tasks finish after a while (kwok ends them), and
the tasks that had to wait are placed as GPUs free up. Then everything stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import math
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchsched.app import Scheduler
from batchsched.config import parse_config
from batchsched.core.quantity import to_units
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError
from batchsched.sandbox.cluster import Sandbox, SandboxError
from batchsched.sandbox.nodes import NodeShape

DATA = Path(__file__).parent / "demo_data" / "openb_pods.csv"
NAMESPACE = "demo"
PRIORITY = {"LS": "high-priority", "Guaranteed": "default-priority", "Burstable": "default-priority", "BE": "low-priority"}

SHAPES = (
    NodeShape(count=16, prefix="g2", cpu="96", memory="384Gi", gpus=8, gpu_model="G2"),
    NodeShape(count=4, prefix="g3", cpu="128", memory="768Gi", gpus=8, gpu_model="G3"),
    NodeShape(count=4, prefix="v100m16", cpu="32", memory="128Gi", gpus=4, gpu_model="V100M16"),
    NodeShape(count=8, prefix="t4", cpu="104", memory="512Gi", gpus=2, gpu_model="T4"),
)


@dataclass(slots=True, frozen=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    qos: str
    seconds: int

    def pod(self) -> dict[str, Any]:
        requests = {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi"}
        limits = {}
        if self.gpus:
            requests["nvidia.com/gpu"] = str(self.gpus)
            limits["nvidia.com/gpu"] = str(self.gpus)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "labels": {"app.kubernetes.io/part-of": "batchsched-demo", "demo/gpus": str(self.gpus)},
                "annotations": {"batchsched.io/sim-duration": f"{self.seconds}s"},
            },
            "spec": {
                "schedulerName": "batchsched",
                "priorityClassName": PRIORITY.get(self.qos, "default-priority"),
                "containers": [{
                    "name": "task", "image": "openb/task:latest",
                    "resources": {"requests": requests, **({"limits": limits} if limits else {})},
                }],
            },
        }


def load_tasks(path: Path = DATA) -> list[Task]:
    tasks = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            lifetime = max(1, int(row["deletion_time"]) - int(row["creation_time"]))
            # trace lifetimes span seconds to months; the demo plays them as 8..40 s
            seconds = 8 + round(32 * min(1.0, math.log10(1 + lifetime) / 7))
            tasks.append(Task(
                name=row["name"], cpu_milli=int(row["cpu_milli"]), memory_mib=int(row["memory_mib"]),
                gpus=int(row["num_gpu"]), qos=row["qos"], seconds=seconds,
            ))
    return tasks


def _bar(used: int, total: int, width: int = 8) -> str:
    if total == 0:
        return "-" * width
    filled = round(width * used / total)
    return "#" * filled + "." * (width - filled)


async def _node_gpus(kube: KubeClient) -> tuple[dict[str, int], dict[str, str]]:
    nodes, _ = await kube.list("/api/v1/nodes")
    cap = {n["metadata"]["name"]: to_units("nvidia.com/gpu", n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in nodes}
    model = {n["metadata"]["name"]: n["metadata"]["labels"].get("nvidia.com/gpu.product", "") for n in nodes}
    return cap, model


async def _pods(kube: KubeClient) -> list[dict[str, Any]]:
    items, _ = await kube.list(f"/api/v1/namespaces/{NAMESPACE}/pods")
    return items


def _gpus(pod: dict[str, Any]) -> int:
    return sum(
        to_units("nvidia.com/gpu", (c.get("resources") or {}).get("requests", {}).get("nvidia.com/gpu", 0))
        for c in pod["spec"]["containers"]
    )


def _print_occupancy(pods: list[dict[str, Any]], cap: dict[str, int], model: dict[str, str]) -> None:
    used: dict[str, int] = defaultdict(int)
    count: dict[str, Counter[int]] = defaultdict(Counter)
    for p in pods:
        node = p["spec"].get("nodeName")
        if node and p["status"].get("phase") not in ("Succeeded", "Failed"):
            used[node] += _gpus(p)
            count[node][_gpus(p)] += 1
    print(f"  {'node':<12} {'model':<8} {'GPUs':<10}      tasks on it (by GPUs each)")
    for node in sorted(cap, key=lambda n: (model[n], int(n.rsplit('-', 1)[1]))):
        tasks = ", ".join(f"{n}x{g}gpu" for g, n in sorted(count[node].items(), reverse=True))
        print(f"  {node:<12} {model[node]:<8} [{_bar(used[node], cap[node])}] {used[node]}/{cap[node]}  {tasks}")
    full = sum(1 for n in cap if cap[n] and used[n] == cap[n])
    empty = sum(1 for n in cap if cap[n] and used[n] == 0)
    partial = sum(1 for n in cap if cap[n] and 0 < used[n] < cap[n])
    print(f"  full nodes: {full}, partly used: {partial}, empty (free for whole-node tasks): {empty}")


async def _run(kubeconfig: str, tasks: list[Task]) -> int:
    kube = await KubeClient.connect(kubeconfig)
    config = parse_config({"leaderElection": {"enabled": False}, "metricsAddress": "127.0.0.1:0",
                           "cycle": {"retryUnschedulableSeconds": 10}})
    sched = Scheduler(kube, config)
    runner = asyncio.get_running_loop().create_task(sched.run())
    try:
        with contextlib.suppress(ConflictError):
            await kube.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        cap, model = await _node_gpus(kube)
        by_gpus = Counter(t.gpus for t in tasks)
        print(f"cluster: {len(cap)} nodes, {sum(cap.values())} GPUs "
              f"({', '.join(f'{s.count} {s.gpu_model} x{s.gpus}' for s in SHAPES)})")
        print(f"workload: {len(tasks)} tasks from the openb trace: "
              + ", ".join(f"{n} x {g} GPU" if g else f"{n} CPU-only" for g, n in sorted(by_gpus.items(), reverse=True))
              + f"; {sum(t.gpus for t in tasks)} GPUs asked in all")
        while not sched.ready:
            await asyncio.sleep(0.1)
        start = time.monotonic()
        sem = asyncio.Semaphore(16)

        async def submit(t: Task) -> None:
            async with sem:
                await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", t.pod())

        await asyncio.gather(*(submit(t) for t in tasks))
        print(f"submitted in {time.monotonic() - start:.1f} s; batchsched is placing them...")

        # first wave: wait until binding settles
        last, stable_since = -1, time.monotonic()
        while time.monotonic() - stable_since < 2.0 and time.monotonic() - start < 60:
            await asyncio.sleep(0.25)
            n_bound = sum(1 for p in await _pods(kube) if p["spec"].get("nodeName"))
            if n_bound != last:
                last, stable_since = n_bound, time.monotonic()
        pods = await _pods(kube)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        print(f"\nfirst wave after {time.monotonic() - start:.1f} s: {len(bound)} of {len(tasks)} tasks bound; "
              "GPU occupancy per node:")
        _print_occupancy(pods, cap, model)
        waiting = [p for p in pods if not p["spec"].get("nodeName")]
        if waiting:
            sample = max(waiting, key=_gpus)
            events, _ = await kube.list(f"/api/v1/namespaces/{NAMESPACE}/events",
                                        fieldSelector=f"involvedObject.name={sample['metadata']['name']}")
            why = next((e["message"] for e in events if e.get("reason") == "FailedScheduling"), "(no event yet)")
            print(f"\n{len(waiting)} tasks wait for GPUs to free up, e.g. {sample['metadata']['name']} "
                  f"({_gpus(sample)} GPUs): {why}")

        # the rest: tasks finish, waiting ones get their turn
        deadline = start + 240
        while time.monotonic() < deadline:
            pods = await _pods(kube)
            if all(p["spec"].get("nodeName") for p in pods):
                break
            await asyncio.sleep(1)
        pods = await _pods(kube)
        never = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        done = sum(1 for p in pods if p["status"].get("phase") == "Succeeded")
        print(f"\nafter {time.monotonic() - start:.0f} s: {len(pods) - len(never)} of {len(pods)} tasks placed "
              f"({done} already finished); binds: {int(sched.metrics.binds.labels('bound')._value.get())}, "
              f"cycles: {sched.cycles}")
        if never:
            print(f"not placed in time: {', '.join(never[:10])}")
            return 1
        print("every task was placed; no node was ever over-committed (batchsched checks each bind against its mirror).")
        return await _gangs(kube)
    finally:
        sched.stop()
        await asyncio.wait_for(runner, 30)
        await kube.close()


XK8S = "/apis/scheduling.x-k8s.io/v1alpha1"
GANG_NAMESPACE = "training"


def _gang_pods(job: str, workers: int, seconds: int) -> list[dict[str, Any]]:
    """A PyTorchJob as the Kubeflow training operator lays it out with gang scheduling."""
    pods = []
    for i, role in enumerate(["master"] + ["worker"] * workers):
        index = 0 if role == "master" else i - 1
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{job}-{role}-{index}",
                "labels": {
                    "scheduling.x-k8s.io/pod-group": job,
                    "training.kubeflow.org/job-name": job,
                    "training.kubeflow.org/replica-type": role,
                    "training.kubeflow.org/replica-index": str(index),
                },
                "annotations": {"batchsched.io/sim-duration": f"{seconds}s"},
            },
            "spec": {
                "schedulerName": "batchsched",
                "containers": [{"name": "pytorch", "image": "pytorch/pytorch:latest", "resources": {
                    "requests": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"},
                    "limits": {"nvidia.com/gpu": "8"}}}],
            },
        })
    return pods


async def _gangs(kube: KubeClient) -> int:
    """Two training jobs that cannot both fit: one runs whole, the other waits whole."""
    jobs = {"llm-pretrain-a": 14, "llm-pretrain-b": 14}  # 15 pods x 8 GPUs = 120 of the 160 8-GPU slots
    print("\nphase 2: two PyTorchJob-shaped gangs, 15 pods x 8 GPUs each (120 GPUs), on 20 nodes with 8 GPUs "
          "(160 GPUs): they cannot both run")
    # wait for the first wave to finish so the 8-GPU nodes are free again
    while any(p["status"].get("phase") not in ("Succeeded", "Failed") for p in await _pods(kube)):
        await asyncio.sleep(1)
    with contextlib.suppress(ConflictError):
        await kube.create("/api/v1/namespaces", {"metadata": {"name": GANG_NAMESPACE}})
    for job, workers in jobs.items():
        await kube.create(f"{XK8S}/namespaces/{GANG_NAMESPACE}/podgroups", {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": job}, "spec": {"minMember": workers + 1, "scheduleTimeoutSeconds": 60}})
        for body in _gang_pods(job, workers, 12):
            await kube.create(f"/api/v1/namespaces/{GANG_NAMESPACE}/pods", body)
    start = time.monotonic()
    timeline: dict[str, list[tuple[float, str]]] = {job: [] for job in jobs}
    shown_wait = False
    while time.monotonic() - start < 120:
        items, _ = await kube.list(f"/api/v1/namespaces/{GANG_NAMESPACE}/pods")
        state = {}
        for job, workers in jobs.items():
            mine = [p for p in items if p["metadata"]["labels"].get("training.kubeflow.org/job-name") == job]
            held = sum(1 for p in mine if p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed"))
            done = sum(1 for p in mine if p["status"].get("phase") == "Succeeded")
            state[job] = (held, done, workers + 1)
            # members finish one by one, but none may be bound while another still waits
            if 0 < held + done < workers + 1:
                print(f"  PARTIAL GANG: {job} has {held + done} of {workers + 1} pods placed")
                return 1
        now = time.monotonic() - start
        changed = False
        for job, (held, done, n) in state.items():
            if held == n:
                phase = "running whole"
            elif done == n:
                phase = "finished"
            elif held + done == n:
                phase = "finishing"
            else:
                phase = "waiting whole"
            if not timeline[job] or timeline[job][-1][1] != phase:
                timeline[job].append((now, phase))
                changed = True
        if changed:
            line = "; ".join(f"{j}: {h} running, {d} done of {n}" for j, (h, d, n) in state.items())
            print(f"  t={now:5.1f}s  {line}")
        if not shown_wait and any(h == 0 and d == 0 for h, d, _ in state.values()) and any(h for h, _, _ in state.values()):
            waiting = next(j for j, (h, d, _) in state.items() if h == 0 and d == 0)
            group = await kube.get(f"{XK8S}/namespaces/{GANG_NAMESPACE}/podgroups/{waiting}")
            conds = (group.get("status") or {}).get("conditions") or []
            if conds and not str(conds[-1].get("message", "")).startswith("waiting for pods"):
                print(f"  {waiting} PodGroup status: phase {group['status'].get('phase')}: {conds[-1].get('message')}")
                shown_wait = True
        if all(d == n for _, d, n in state.values()):
            break
        await asyncio.sleep(0.5)
    for job, steps in timeline.items():
        print(f"  {job}: " + " -> ".join(f"{phase} at {t:.1f} s" for t, phase in steps))
    if not all(steps and steps[-1][1] == "finished" for steps in timeline.values()):
        print("  the gangs did not both finish in time")
        return 1
    print("both jobs ran whole, one after the other; neither ever held part of the GPUs.")
    return await _queues(kube)


QUEUES = "/apis/batchsched.io/v1alpha1/queues"
TEAM_NAMESPACE = "teams"
BIG_MODELS = ["G2", "G3"]


def _team_pod(name: str, queue: str, *, group: str = "", priority: str = "default-priority") -> dict[str, Any]:
    labels = {"batchsched.io/queue": queue}
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": {"batchsched.io/sim-duration": "600s"}},
        "spec": {
            "schedulerName": "batchsched",
            "priorityClassName": priority,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": BIG_MODELS}]}]}}},
            "containers": [{"name": "train", "image": "trainer:latest", "resources": {
                "requests": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}],
        },
    }


async def _team_gang(kube: KubeClient, name: str, queue: str, size: int, priority: str) -> None:
    await kube.create(f"{XK8S}/namespaces/{TEAM_NAMESPACE}/podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": name, "labels": {"batchsched.io/queue": queue}}, "spec": {"minMember": size}})
    for i in range(size):
        await kube.create(f"/api/v1/namespaces/{TEAM_NAMESPACE}/pods", _team_pod(f"{name}-{i}", queue, group=name, priority=priority))


async def _running_by(kube: KubeClient) -> dict[str, int]:
    items, _ = await kube.list(f"/api/v1/namespaces/{TEAM_NAMESPACE}/pods")
    out: Counter[str] = Counter()
    for p in items:
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp") \
                and p["status"].get("phase") not in ("Succeeded", "Failed"):
            out[p["metadata"]["labels"].get("scheduling.x-k8s.io/pod-group") or p["metadata"]["name"]] += 1
    return dict(out)


async def _settle(kube: KubeClient, seconds: float = 3.0) -> dict[str, int]:
    last: dict[str, int] = {}
    stable = time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() - stable < seconds and time.monotonic() < deadline:
        now = await _running_by(kube)
        if now != last:
            last, stable = now, time.monotonic()
        await asyncio.sleep(0.3)
    return last


async def _queue_line(kube: KubeClient, name: str) -> str:
    q = await kube.get(f"{QUEUES}/{name}")
    st = q.get("status") or {}

    def gpu(field: str) -> str:
        value = (st.get(field) or {}).get("nvidia.com/gpu", 0)
        return str(value)

    return (f"{name}: nominal {gpu('nominal')} GPUs, using {gpu('used')}, borrowed {gpu('borrowed')}, "
            f"lent {gpu('lent')}")


async def _print_queues(kube: KubeClient) -> None:
    await asyncio.sleep(2.5)  # queue status is written every couple of seconds
    for name in ("team-nlp", "team-vision"):
        print("    " + await _queue_line(kube, name))


async def _queues(kube: KubeClient) -> int:
    """Two teams share the 8-GPU nodes through queues: borrowing, reclaim, priority preemption."""
    print("\nphase 3: queues. team-nlp and team-vision each get 80 of the 160 GPUs on the 8-GPU nodes, "
          "and may borrow what the other leaves idle")
    while True:  # the gangs of phase 2 must be done
        items, _ = await kube.list(f"/api/v1/namespaces/{GANG_NAMESPACE}/pods")
        if all(p["status"].get("phase") in ("Succeeded", "Failed") for p in items):
            break
        await asyncio.sleep(1)
    with contextlib.suppress(ConflictError):
        await kube.create("/api/v1/namespaces", {"metadata": {"name": TEAM_NAMESPACE}})
    await kube.create(QUEUES, {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue",
                               "metadata": {"name": "research"}, "spec": {}})
    for team in ("team-nlp", "team-vision"):
        await kube.create(QUEUES, {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": team},
                                   "spec": {"parent": "research", "weight": 1,
                                            "resources": [{"name": "nvidia.com/gpu", "nominal": 80}]}})
    await asyncio.sleep(1.5)

    print("  1. team-nlp starts two low-priority hyper-parameter sweeps, gangs of 10 x 8 GPUs: all 160 GPUs, "
          "80 of them borrowed from idle team-vision")
    await _team_gang(kube, "nlp-sweep-a", "team-nlp", 10, "low-priority")
    await _team_gang(kube, "nlp-sweep-b", "team-nlp", 10, "low-priority")
    running = await _settle(kube)
    print(f"    running: {running}")
    await _print_queues(kube)
    ok = running.get("nlp-sweep-a") == 10 and running.get("nlp-sweep-b") == 10

    print("  2. team-vision submits a training gang of 10 x 8 GPUs, within its own 80: batchsched reclaims "
          "the GPUs team-nlp borrowed, evicting one sweep whole")
    await _team_gang(kube, "vision-train", "team-vision", 10, "default-priority")
    running = await _settle(kube)
    print(f"    running: {running}")
    await _print_queues(kube)
    ok = ok and running.get("vision-train") == 10 and sum(v for k, v in running.items() if k.startswith("nlp")) == 10
    evicted = [k for k in ("nlp-sweep-a", "nlp-sweep-b") if not running.get(k)]
    if evicted:
        events, _ = await kube.list(f"/api/v1/namespaces/{TEAM_NAMESPACE}/events",
                                    fieldSelector=f"involvedObject.name={evicted[0]}-0")
        why = next((e["message"] for e in events if e.get("reason") == "Preempted"), "")
        if why:
            print(f"    {evicted[0]}-0: {why}")

    print("  3. team-nlp needs an urgent evaluation job (high priority, 2 x 8 GPUs); the cluster is full and "
          "team-nlp is at its nominal, so batchsched preempts its own low-priority sweep, as a whole gang")
    await _team_gang(kube, "nlp-urgent-eval", "team-nlp", 2, "high-priority")
    running = await _settle(kube)
    print(f"    running: {running}")
    await _print_queues(kube)
    ok = ok and running.get("nlp-urgent-eval") == 2 and running.get("vision-train") == 10 \
        and not any(running.get(k) for k in ("nlp-sweep-a", "nlp-sweep-b"))
    if not ok:
        print("  the queue phase did not end as expected")
        return 1
    print("borrowed GPUs went back to their owner, and the urgent job displaced a whole low-priority gang, "
          "never part of one.")
    return 0


def main(*, nodes: int = 0, keep: bool = False) -> int:
    """Run the demo; ``nodes`` is ignored beyond the trace's own shapes (kept for the CLI)."""
    del nodes
    box = Sandbox("demo")
    if box.state() is not None:
        box.down()
    print("starting the local control plane (etcd, kube-apiserver, kube-controller-manager, kwok)...", flush=True)
    t0 = time.monotonic()
    try:
        state = box.up(SHAPES)
    except SandboxError as exc:
        print(f"batchsched: error: {exc}", file=sys.stderr)
        return 1
    print(f"ready in {time.monotonic() - t0:.1f} s; kubeconfig: {state.kubeconfig}")
    try:
        return asyncio.run(_run(state.kubeconfig, load_tasks()))
    finally:
        if keep:
            print(f"sandbox left running: KUBECONFIG={state.kubeconfig}; stop it with `batchsched sandbox down --name demo`")
        else:
            box.down()
