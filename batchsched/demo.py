"""The demo: a local GPU cluster, batchsched, and a real workload mix, start to finish.

``batchsched demo`` brings up the sandbox with fake GPU nodes shaped like the openb trace's
(16 G2 and 4 G3 with 8 GPUs, 4 V100M16 with 4, 8 T4 with 2: 192 GPUs), each offering its
GPUs both as ``nvidia.com/gpu`` and as elastic-gpu cards (``elasticgpu.io/gpu-core``, 100
per card, and ``elasticgpu.io/gpu-memory``). It starts batchsched in this process and
submits 214 tasks taken from that trace (see ``demo_data/README.md``) with their CPU,
memory and GPU requests and a priority from their QoS class: whole-GPU tasks ask for
``elasticgpu.io/gpu-core`` 100 per card, GPU-sharing tasks for the percent of one card they
used, so every GPU task gets its cards written on it (``elasticgpu.io/container-task``).
The first wave asks for more than the cluster has (107% of its GPU compute); the demo
prints each node's cards as those annotations say, the cluster's GPU allocation ratio and
the whole cards left free. High-priority tasks that arrive to a full cluster preempt
low-priority ones, which are submitted again as a Job controller would. Tasks finish after a
while (kwok ends them), and the tasks that had to wait are placed as GPUs free up. Then two
gangs and two teams' queues (phases 2 and 3), and a node whose GPUs are published by Dynamic
Resource Allocation, MIG-partitionable, serving a gang of MIG pods (phase 4).

``--card-policy`` picks the card placement policy (``gpuSharing.policy``, with scope
``all``: it places whole cards too). ``--compare-card-policies`` runs only the first wave,
once per policy, on the same nodes emptied in between, with tasks that never end, all
submitted before batchsched starts, and prints the allocation ratio each reaches. Pods
created in the same second are ordered by their random UIDs, so the figures vary by a few
points from run to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchsched.app import Scheduler
from batchsched.config import Config, GpuSharingSection, parse_config
from batchsched.core.devices import (
    ELASTIC_ASSUMED,
    ELASTIC_CONTAINER_PREFIX,
    ELASTIC_CORE,
    ELASTIC_MEMORY,
    POLICIES,
)
from batchsched.core.quantity import to_units
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError
from batchsched.sandbox import gpudra
from batchsched.sandbox.cluster import Sandbox, SandboxError
from batchsched.sandbox.nodes import NodeShape, create_nodes, wait_nodes_ready

DATA = Path(__file__).parent / "demo_data" / "openb_pods.csv"
NAMESPACE = "demo"
PRIORITY = {"LS": "high-priority", "Guaranteed": "default-priority", "Burstable": "default-priority", "BE": "low-priority"}
#: memory of every card, MiB (the trace does not say; tasks here ask for compute only)
CARD_MIB = 16384
MILLI = 1000


def _shape(count: int, prefix: str, cpu: str, memory: str, gpus: int, model: str) -> NodeShape:
    """Nodes whose GPUs are offered whole (``nvidia.com/gpu``) and as elastic-gpu cards."""
    return NodeShape(count=count, prefix=prefix, cpu=cpu, memory=memory, gpus=gpus, gpu_model=model,
                     extended={ELASTIC_CORE: str(100 * gpus), ELASTIC_MEMORY: str(CARD_MIB * gpus)})


SHAPES = (
    _shape(16, "g2", "96", "384Gi", 8, "G2"),
    _shape(4, "g3", "128", "768Gi", 8, "G3"),
    _shape(4, "v100m16", "32", "128Gi", 4, "V100M16"),
    _shape(8, "t4", "104", "512Gi", 2, "T4"),
)


@dataclass(slots=True, frozen=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    #: compute of each GPU in thousandths of a card: 1000 for whole GPUs, less for a share
    gpu_milli: int
    qos: str
    seconds: int

    @property
    def shared(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < MILLI

    @property
    def core(self) -> int:
        """``elasticgpu.io/gpu-core`` asked: 100 per whole card, or the percent of one card."""
        if self.shared:
            return min(99, max(1, round(self.gpu_milli / 10)))
        return 100 * self.gpus

    def pod(self, *, finite: bool = True) -> dict[str, Any]:
        """The pod; ``finite``: kwok ends it after :attr:`seconds` (else it runs until deleted)."""
        requests = {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi"}
        limits = {}
        if self.gpus:
            requests[ELASTIC_CORE] = str(self.core)
            limits[ELASTIC_CORE] = str(self.core)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "labels": {"app.kubernetes.io/part-of": "batchsched-demo", "demo/gpus": str(self.gpus)},
                "annotations": {"batchsched.io/sim-duration": f"{self.seconds}s"} if finite else {},
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
                gpus=int(row["num_gpu"]), gpu_milli=int(row["gpu_milli"]), qos=row["qos"], seconds=seconds,
            ))
    return tasks


def _describe(tasks: Sequence[Task]) -> str:
    """``6 x 8 cards, ..., 80 shares of one card (5%..81%), 20 CPU-only``."""
    whole = Counter(t.gpus for t in tasks if t.gpus and not t.shared)
    shares = [t.core for t in tasks if t.shared]
    cpu = sum(1 for t in tasks if not t.gpus)
    parts = [f"{n} x {g} card{'s' if g > 1 else ''}" for g, n in sorted(whole.items(), reverse=True)]
    if shares:
        parts.append(f"{len(shares)} share{'s' if len(shares) > 1 else ''} of one card "
                     f"({min(shares)}%..{max(shares)}%)")
    if cpu:
        parts.append(f"{cpu} CPU-only")
    return ", ".join(parts)


# -- cards, as the pods' annotations say ----------------------------------------------------


@dataclass(slots=True)
class NodeCards:
    """A node's cards: compute held on each (thousandths), by the pods running there."""

    name: str
    model: str
    held: list[int]
    cpu: int = 0
    cpu_used: int = 0
    tasks: int = 0


@dataclass(slots=True)
class CardReport:
    nodes: dict[str, NodeCards]
    #: GPU pods running without a readable card annotation (or with a wrong one)
    unnamed: list[str] = field(default_factory=list)

    @property
    def cards(self) -> int:
        return sum(len(n.held) for n in self.nodes.values())

    @property
    def held(self) -> int:
        return sum(min(MILLI, h) for n in self.nodes.values() for h in n.held)

    @property
    def ratio(self) -> float:
        return self.held / (self.cards * MILLI) if self.cards else 0.0

    @property
    def free_cards(self) -> int:
        return sum(1 for n in self.nodes.values() for h in n.held if h == 0)

    @property
    def partial(self) -> list[int]:
        """Compute held on each card that is held in part."""
        return [h for n in self.nodes.values() for h in n.held if 0 < h < MILLI]

    @property
    def overcommitted(self) -> list[str]:
        return [f"{n.name} card {i}" for n in self.nodes.values() for i, h in enumerate(n.held) if h > MILLI]


def _core(pod: dict[str, Any]) -> dict[str, int]:
    """``elasticgpu.io/gpu-core`` requested by each container that asks for it."""
    out = {}
    for c in pod["spec"]["containers"]:
        res = c.get("resources") or {}
        value = {**(res.get("limits") or {}), **(res.get("requests") or {})}.get(ELASTIC_CORE)
        if value is not None and to_units(ELASTIC_CORE, value) > 0:
            out[c["name"]] = to_units(ELASTIC_CORE, value)
    return out


def _running(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName")) and pod["status"].get("phase") not in ("Succeeded", "Failed")


async def _nodes(kube: KubeClient) -> list[dict[str, Any]]:
    nodes, _ = await kube.list("/api/v1/nodes")
    return nodes


def card_report(nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]]) -> CardReport:
    """Each node's cards and what the running pods hold of them, read from the pods'
    ``elasticgpu.io/container-<name>`` annotations (card indexes) and their requests."""
    report = CardReport({})
    for n in nodes:
        alloc = n["status"].get("allocatable") or {}
        n_cards = to_units(ELASTIC_CORE, alloc.get(ELASTIC_CORE, 0)) // 100
        name = n["metadata"]["name"]
        report.nodes[name] = NodeCards(name, n["metadata"]["labels"].get("nvidia.com/gpu.product", ""), [0] * n_cards,
                                       cpu=to_units("cpu", alloc.get("cpu", 0)))
    for p in pods:
        node = report.nodes.get(p["spec"].get("nodeName") or "")
        if node is None or not _running(p):
            continue
        node.tasks += 1
        node.cpu_used += sum(to_units("cpu", ((c.get("resources") or {}).get("requests") or {}).get("cpu", 0))
                             for c in p["spec"]["containers"])
        notes = p["metadata"].get("annotations") or {}
        asks = _core(p)
        if asks and (p["metadata"].get("labels") or {}).get(ELASTIC_ASSUMED) != "true":
            report.unnamed.append(p["metadata"]["name"])
        for container, core in asks.items():
            text = notes.get(ELASTIC_CONTAINER_PREFIX + container, "")
            cards = [int(i) for i in text.split(",") if i.strip().isdigit()]
            want = max(1, core // 100)
            if len(cards) != want or len(set(cards)) != want or any(i >= len(node.held) for i in cards):
                report.unnamed.append(p["metadata"]["name"])
                continue
            for i in cards:
                node.held[i] += MILLI if core >= 100 else core * 10
    return report


def _card_cell(held: int) -> str:
    return ".." if held == 0 else "##" if held >= MILLI else "#."


def _node_order(name: str) -> tuple[str, int]:
    prefix, _, index = name.rpartition("-")
    return prefix, int(index) if index.isdigit() else 0


def _print_cards(report: CardReport) -> None:
    print("  node         model    cards (## whole card held, #. part, .. free)   compute held per card, "
          "CPUs requested")
    for n in sorted(report.nodes.values(), key=lambda n: (n.model, _node_order(n.name))):
        if not n.held:
            continue
        bar = "[" + "|".join(_card_cell(h) for h in n.held) + "]"
        pct = " ".join(f"{round(100 * h / MILLI):>3}%" for h in n.held)
        print(f"  {n.name:<12} {n.model:<8} {bar:<26} cards: {pct}  cpu {n.cpu_used // MILLI}/{n.cpu // MILLI}, "
              f"{n.tasks} task{'s' if n.tasks != 1 else ''}")
    _print_ratio(report)


def _print_ratio(report: CardReport) -> None:
    partial = report.partial
    print(f"  GPU allocation ratio: {report.held / MILLI:g} of {report.cards} cards' compute held = "
          f"{100 * report.ratio:.1f}% (a share counts its fraction); whole cards free: {report.free_cards}; "
          f"{len(partial)} cards shared, with {(len(partial) * MILLI - sum(partial)) / MILLI:g} cards' compute "
          "left on them")
    if report.unnamed:
        print(f"  GPU TASKS WITHOUT A VALID CARD ANNOTATION: {', '.join(sorted(set(report.unnamed))[:10])}")
    if report.overcommitted:
        print(f"  OVER-COMMITTED CARDS: {', '.join(report.overcommitted[:10])}")


def _healthy(report: CardReport) -> bool:
    return not report.unnamed and not report.overcommitted


async def _pods(kube: KubeClient, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
    return items


def _gpu_kind(pod: dict[str, Any]) -> str:
    core = sum(_core(pod).values())
    if core == 0:
        return "CPU-only"
    if core < 100:
        return f"a {core}% share"
    return f"{core // 100} card{'s' if core >= 200 else ''}"


def _pending_line(pods: Sequence[dict[str, Any]]) -> str:
    waiting = [p for p in pods if not p["spec"].get("nodeName")]
    kinds = Counter(sum(_core(p).values()) for p in waiting)
    whole = [(c // 100, n) for c, n in kinds.items() if c >= 100]
    shares = sorted(c for c, n in kinds.items() for _ in range(n) if 0 < c < 100)
    parts = [f"{n} x {g} card{'s' if g > 1 else ''}" for g, n in sorted(whole, reverse=True)]
    if shares:
        parts.append(f"{len(shares)} share{'s' if len(shares) > 1 else ''} ({shares[0]}%..{shares[-1]}%)")
    if kinds.get(0):
        parts.append(f"{kinds[0]} CPU-only")
    return ", ".join(parts)


def _preempted(tasks: Sequence[Task], pods: Sequence[dict[str, Any]]) -> str:
    """``, 12 preempted`` when tasks were evicted for higher-priority ones (bare pods: they are gone)."""
    gone = len(tasks) - len(pods)
    return f", {gone} preempted by higher-priority tasks" if gone else ""


def _config(policy: str) -> Config:
    # scope "all": the card policy places whole-card tasks too, as FGD does
    return parse_config({"leaderElection": {"enabled": False}, "metricsAddress": "127.0.0.1:0",
                         "cycle": {"retryUnschedulableSeconds": 10},
                         "gpuSharing": {"policy": policy, "scope": "all"}})


async def _start(kube: KubeClient, policy: str) -> tuple[Scheduler, asyncio.Task[None]]:
    sched = Scheduler(kube, _config(policy))
    runner = asyncio.get_running_loop().create_task(sched.run())
    while not sched.ready:
        if runner.done():
            await runner
            raise RuntimeError("batchsched stopped before it was ready")
        await asyncio.sleep(0.1)
    return sched, runner


async def _stop(sched: Scheduler, runner: asyncio.Task[None]) -> None:
    sched.stop()
    await asyncio.wait_for(runner, 30)


async def _submit(kube: KubeClient, namespace: str, tasks: Sequence[Task], *, finite: bool) -> None:
    with contextlib.suppress(ConflictError):
        await kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    sem = asyncio.Semaphore(16)

    async def one(t: Task) -> None:
        async with sem:
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", t.pod(finite=finite))

    await asyncio.gather(*(one(t) for t in tasks))


async def _first_wave(kube: KubeClient, namespace: str, start: float, *, quiet: float = 2.0) -> list[dict[str, Any]]:
    """The pods once binding has settled (no new bind for ``quiet`` seconds)."""
    last, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < quiet and time.monotonic() - start < 60:
        await asyncio.sleep(0.25)
        n_bound = sum(1 for p in await _pods(kube, namespace) if p["spec"].get("nodeName"))
        if n_bound != last:
            last, stable_since = n_bound, time.monotonic()
    return await _pods(kube, namespace)


def _workload_lines(tasks: Sequence[Task], cards: int) -> None:
    asked = sum(t.core for t in tasks) / 100
    print(f"cluster: {sum(s.count for s in SHAPES)} nodes, {cards} GPU cards "
          f"({', '.join(f'{s.count} {s.gpu_model} x{s.gpus}' for s in SHAPES)}), each offered as "
          f"nvidia.com/gpu and as {ELASTIC_CORE} (100 per card) + {ELASTIC_MEMORY} ({CARD_MIB} MiB per card)")
    print(f"workload: {len(tasks)} tasks from the openb trace: {_describe(tasks)}; "
          f"{asked:g} cards' compute asked in all ({100 * asked / cards:.0f}% of the cluster)")


async def _run(kubeconfig: str, tasks: list[Task], policy: str) -> int:
    kube = await KubeClient.connect(kubeconfig)
    sched: Scheduler | None = None
    runner: asyncio.Task[None] | None = None
    try:
        nodes = await _nodes(kube)
        _workload_lines(tasks, card_report(nodes, []).cards)
        sched, runner = await _start(kube, policy)
        print(f"card placement policy: {policy} (gpuSharing.policy; --card-policy to change)")
        start = time.monotonic()
        await _submit(kube, NAMESPACE, tasks, finite=True)
        print(f"submitted in {time.monotonic() - start:.1f} s; batchsched is placing them...")

        pods = await _first_wave(kube, NAMESPACE, start)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        print(f"\nfirst wave after {time.monotonic() - start:.1f} s: {len(bound)} of {len(tasks)} tasks bound"
              f"{_preempted(tasks, pods)}; GPU cards per node, as the pods' elasticgpu.io/container-task "
              "annotations say:")
        report = card_report(nodes, pods)
        _print_cards(report)
        waiting = [p for p in pods if not p["spec"].get("nodeName")]
        if waiting:
            sample = max(waiting, key=lambda p: sum(_core(p).values()))
            events, _ = await kube.list(f"/api/v1/namespaces/{NAMESPACE}/events",
                                        fieldSelector=f"involvedObject.name={sample['metadata']['name']}")
            why = next((e["message"] for e in events if e.get("reason") == "FailedScheduling"), "(no event yet)")
            print(f"\n{len(waiting)} tasks wait for GPUs to free up ({_pending_line(pods)}), "
                  f"e.g. {sample['metadata']['name']} ({_gpu_kind(sample)}): {why}")
        if not _healthy(report):
            return 1

        # the rest: tasks finish, waiting ones get their turn; a preempted task (a bare pod,
        # deleted) is submitted again, as the Job controller that owns it would
        by_name = {t.name: t for t in tasks}
        resubmitted = 0
        deadline = start + 240
        while time.monotonic() < deadline:
            pods = await _pods(kube)
            report = card_report(nodes, pods)
            if not _healthy(report):
                _print_ratio(report)
                return 1
            missing = by_name.keys() - {p["metadata"]["name"] for p in pods}
            for name in sorted(missing):
                with contextlib.suppress(ConflictError):
                    await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", by_name[name].pod())
                    resubmitted += 1
            if not missing and all(p["spec"].get("nodeName") for p in pods):
                break
            await asyncio.sleep(1)
        pods = await _pods(kube)
        never = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        never += sorted(by_name.keys() - {p["metadata"]["name"] for p in pods})
        done = sum(1 for p in pods if p["status"].get("phase") == "Succeeded")
        binds = int(sched.metrics.binds.labels("bound")._value.get())
        print(f"\nafter {time.monotonic() - start:.0f} s: {len(tasks) - len(never)} of {len(tasks)} tasks placed "
              f"({done} already finished); {resubmitted} preempted tasks submitted again; binds: {binds}, "
              f"cycles: {sched.cycles}")
        if never:
            print(f"not placed in time: {', '.join(never[:10])}")
            return 1
        print("every task was placed; no node and no card was ever over-committed (batchsched checks each bind "
              "against its mirror; the demo checked the cards, as the annotations say, every second).")
        return await _gangs(kube)
    finally:
        if sched is not None and runner is not None:
            await _stop(sched, runner)
        await kube.close()


@dataclass(slots=True, frozen=True)
class PolicyResult:
    policy: str
    bound: int
    pending: str
    n_pending: int
    #: tasks evicted for higher-priority ones (bare pods: gone)
    preempted: int
    report: CardReport
    seconds: float


async def _one_policy(kube: KubeClient, nodes: Sequence[dict[str, Any]], tasks: Sequence[Task],
                      policy: str) -> PolicyResult:
    """The first wave under ``policy``, on emptied nodes, with tasks that never end; then
    everything it placed is deleted again."""
    namespace = f"cards-{policy}"
    await _submit(kube, namespace, tasks, finite=False)
    sched, runner = await _start(kube, policy)
    try:
        start = time.monotonic()
        pods = await _first_wave(kube, namespace, start, quiet=3.0)
        seconds = time.monotonic() - start
    finally:
        await _stop(sched, runner)
    report = card_report(nodes, pods)
    n_pending = sum(1 for p in pods if not p["spec"].get("nodeName"))
    result = PolicyResult(policy, len(pods) - n_pending, _pending_line(pods), n_pending, len(tasks) - len(pods),
                          report, seconds)
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
    while await _pods(kube, namespace):
        await asyncio.sleep(0.5)
    return result


async def _compare(kubeconfig: str, tasks: list[Task], policies: Sequence[str]) -> int:
    kube = await KubeClient.connect(kubeconfig)
    try:
        nodes = await _nodes(kube)
        _workload_lines(tasks, card_report(nodes, []).cards)
        print("the first wave once per card placement policy, each on the same emptied nodes, with tasks that "
              "never end, all submitted before batchsched starts; the allocation ratio counts a share by its "
              "fraction")
        results = []
        for policy in policies:
            r = await _one_policy(kube, nodes, tasks, policy)
            results.append(r)
            print(f"\n{policy}: {r.bound} of {len(tasks)} tasks bound in {r.seconds:.1f} s, {r.preempted} preempted")
            _print_cards(r.report)
        print(f"\n  {'policy':<14} {'GPU allocation':>15} {'whole cards free':>17} {'cards shared':>13} "
              f"{'preempted':>10} {'tasks pending':>14}  pending")
        for r in results:
            print(f"  {r.policy:<14} {100 * r.report.ratio:>14.1f}% {r.report.free_cards:>17} "
                  f"{len(r.report.partial):>13} {r.preempted:>10} {r.n_pending:>14}  {r.pending}")
        return 0 if all(_healthy(r.report) for r in results) else 1
    finally:
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
    return await _dra(kube)


DRA_API = "/apis/resource.k8s.io/v1"
DRA_NAMESPACE = "inference"
DRA_NODE = "a100-dra"
#: the MIG profile the inference gang asks for, two of which fit one A100 40GB
MIG_PROFILE = "3g.20gb"


def _mig_pod(name: str, group: str) -> dict[str, Any]:
    """An inference server: one MIG partition by a claim made from the ``mig-3g`` template."""
    body = gpudra.pod_with_claims(name, templates={"mig": "mig-3g"})
    body["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "4", "memory": "16Gi"}
    return body


def _memory_slices(device: dict[str, Any]) -> str:
    """The memory slices a MIG partition takes (``4-7``), as the counters it consumes say."""
    taken = sorted(int(name.rsplit("-", 1)[1]) for c in device.get("consumesCounters") or ()
                   for name in c.get("counters") or {} if name.startswith("memory-slice-"))
    return f"{taken[0]}-{taken[-1]}" if taken else "-"


def mig_lines(pods: Sequence[dict[str, Any]], claims: Sequence[dict[str, Any]],
              slices: Sequence[dict[str, Any]]) -> list[str]:
    """One line per pod: its node, its claim, and each device the claim was allocated, told
    as the MIG profile, the GPU it partitions and the memory slices it takes (read from the
    ResourceSlices the claim's pool published)."""
    devices = {(s["spec"]["pool"]["name"], d["name"]): d for s in slices for d in s["spec"].get("devices") or ()}
    gpu_of = {(pool, str((d.get("attributes") or {}).get("uuid", {}).get("string"))): name
              for (pool, name), d in devices.items()}
    by_name = {c["metadata"]["name"]: c for c in claims}
    lines = []
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        made = {s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
        claim = by_name.get(str(next(iter(made.values()), "")))
        results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        parts = []
        for r in results:
            d = devices.get((r["pool"], r["device"]), {})
            attrs = d.get("attributes") or {}
            gpu = gpu_of.get((r["pool"], str(attrs.get("parentUUID", {}).get("string"))), "?")
            parts.append(f"{r['device']} = {attrs.get('profile', {}).get('string', '?')} of {gpu}, "
                         f"memory slices {_memory_slices(d)}")
        where = pod["spec"].get("nodeName") or "(not bound)"
        claim_name = claim["metadata"]["name"] if claim else "(no claim yet)"
        lines.append(f"{pod['metadata']['name']} -> {where}, claim {claim_name}: {'; '.join(parts) or 'not allocated'}")
    return lines


async def _dra_state(kube: KubeClient) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pods, _ = await kube.list(f"/api/v1/namespaces/{DRA_NAMESPACE}/pods")
    claims, _ = await kube.list(f"{DRA_API}/namespaces/{DRA_NAMESPACE}/resourceclaims")
    return pods, claims


async def _why_waiting(kube: KubeClient, name: str, *, seconds: float = 8.0) -> str:
    """The pod's PodScheduled message once it is about devices (at first it may still say
    its claim is not made yet: kube-controller-manager makes it a moment after the pod)."""
    why = ""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pod = await kube.get(f"/api/v1/namespaces/{DRA_NAMESPACE}/pods/{name}")
        conds = (pod.get("status") or {}).get("conditions") or []
        why = next((str(c.get("message") or "") for c in conds if c.get("type") == "PodScheduled"), "")
        if why and "to be made from ResourceClaimTemplate" not in why:
            break
        await asyncio.sleep(0.5)
    return why or "(not told yet)"


async def _dra(kube: KubeClient) -> int:
    """A node publishing its GPUs by DRA, MIG-partitionable; a gang of MIG pods placed whole."""
    print(f"\nphase 4: GPUs by Dynamic Resource Allocation. Node {DRA_NODE}-0 runs NVIDIA's DRA driver with "
          "DynamicMIG: it publishes its 2 A100 40GB as ResourceSlices, each GPU whole and every MIG partition it "
          "could be cut into, sharing one counter set per GPU (no nvidia.com/gpu)")
    [name] = await create_nodes(kube, [NodeShape(count=1, prefix=DRA_NODE, cpu="64", memory="512Gi", gpus=0)])
    await wait_nodes_ready(kube, [name], timeout=60)
    node = await kube.get(f"/api/v1/nodes/{name}")
    slices = gpudra.gpu_node_slices(name, gpus=2, mig="partitionable", node_uid=node["metadata"]["uid"])
    for c in gpudra.device_classes(extended_resource=False):
        with contextlib.suppress(ConflictError):
            await kube.create(f"{DRA_API}/deviceclasses", c)
    made = [await kube.create(f"{DRA_API}/resourceslices", s) for s in slices]
    with contextlib.suppress(ConflictError):
        await kube.create("/api/v1/namespaces", {"metadata": {"name": DRA_NAMESPACE}})
    selector = f"device.attributes['{gpudra.DRIVER}'].profile == '{MIG_PROFILE}'"
    await kube.create(f"{DRA_API}/namespaces/{DRA_NAMESPACE}/resourceclaimtemplates",
                      gpudra.claim_template("mig-3g", "mig.nvidia.com", 1, [selector]))
    print(f"  an inference gang of 4 servers, each with a claim from template mig-3g (class mig.nvidia.com, "
          f"one {MIG_PROFILE} partition): exactly what the 2 GPUs can hold; then a second gang of 2, which "
          "must wait whole")
    start = time.monotonic()
    for group, size in (("serve-a", 4), ("serve-b", 2)):
        await kube.create(f"{XK8S}/namespaces/{DRA_NAMESPACE}/podgroups", {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": group}, "spec": {"minMember": size}})
        for i in range(size):
            await kube.create(f"/api/v1/namespaces/{DRA_NAMESPACE}/pods", _mig_pod(f"{group}-{i}", group))
        if group == "serve-a":
            await asyncio.sleep(1.0)  # serve-a first: the gangs would otherwise race for the partitions
    pods: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    placed_after = float("nan")
    while time.monotonic() - start < 30:
        pods, claims = await _dra_state(kube)
        bound = {p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")}
        if len(bound) >= 4:
            placed_after = time.monotonic() - start
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.0)  # a moment for a partial gang, were there one, to show
    pods, claims = await _dra_state(kube)
    for line in mig_lines(pods, claims, made):
        print("    " + line)
    bound = {p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in pods if p["spec"].get("nodeName")}
    held = [p for p in pods if p["spec"].get("nodeName")]
    if bound != {"serve-a"} or len(held) != 4:
        print(f"  the DRA phase did not end as expected: bound {sorted(p['metadata']['name'] for p in held)}")
        return 1
    print(f"  serve-b waits whole: {await _why_waiting(kube, 'serve-b-0')}")
    print(f"serve-a was bound whole {placed_after:.1f} s after its pods were created; batchsched allocated every "
          "claim on the node its pod was bound to, before the Binding; kube-controller-manager made the claims from the template "
          "and deallocates and deletes them when the pods go.")
    return 0


def main(*, nodes: int = 0, keep: bool = False, card_policy: str | None = None, compare: bool = False) -> int:
    """Run the demo; ``nodes`` is ignored beyond the trace's own shapes (kept for the CLI).
    ``card_policy``: ``gpuSharing.policy`` (default: the configuration's default);
    ``compare``: only the first wave, once per policy, and a table of what each reaches."""
    del nodes
    policy = card_policy or GpuSharingSection().policy
    if policy not in POLICIES:
        print(f"batchsched: error: card policy {policy!r} is not one of {', '.join(POLICIES)}", file=sys.stderr)
        return 2
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
        if compare:
            return asyncio.run(_compare(state.kubeconfig, load_tasks(), POLICIES))
        return asyncio.run(_run(state.kubeconfig, load_tasks(), policy))
    finally:
        if keep:
            print(f"sandbox left running: KUBECONFIG={state.kubeconfig}; stop it with `batchsched sandbox down --name demo`")
        else:
            box.down()
