"""The soak run: batchsched for a long time at a steady arrival rate, watched for growth.

A benchmark that runs for a minute cannot show a leak, a connection that is never closed,
or a unit that sleeps and is never woken: those show only after thousands of pods have
come and gone. The soak keeps a cluster at a steady state for ``minutes`` and samples the
scheduler process every few seconds.

The workload, on ``nodes`` 8-GPU nodes (a fresh sandbox, or the caller's nodes):

* three Queues under one root, nominal quotas of 50/30/20 % of the cluster's GPUs summing
  to all of them, no borrowing limit (a queue may borrow whatever the others leave idle;
  the first reclaims from borrowers at any priority, the others only from lower ones);
* jobs arriving as a Poisson stream (seeded) at ``rate`` per second, by default the rate
  that keeps about 85 % of the GPUs allocated: single pods of one GPU and of 2-8, gangs of
  2-16 pods (a ``scheduling.x-k8s.io`` PodGroup, quorum = size), pods asking for a share of
  one card (KAI's ``gpu-fraction`` annotation), CPU-only pods, and a few high-priority pods
  that preempt lower-priority work of their queue;
* each pod declares its run time (``batchsched.io/sim-duration``, so kwok completes it;
  ``batchsched.io/expected-runtime``, so reservations can plan with it), and the harness
  deletes finished pods and then their PodGroup, as a job controller's TTL would;
* after ``minutes`` no job arrives any more, and the run drains until every job has
  completed or been preempted (or the drain time runs out).

Every ``sample`` seconds: the scheduler's RSS, CPU (% of one core over the interval), open
file descriptors and TCP sockets (its fds matched by inode against ``/proc/net/tcp{,6}``),
its own ``/metrics``; pending pods, the GPUs allocated, binds/s, and the *fit wait*: how
long a pending unit has been, without a break, one that fits the free capacity as the
harness computes it from the pods it sees (whole cards, card shares, CPU, memory, pods per
node; a gang must fit whole); the apiserver's RSS and CPU for context.

The verdict (:func:`verdict`), after a warm-up (the first ``warmup`` fraction of the
arrival period): RSS grows by no more than max(64 MiB, 10 %) over its value at the end of
the warm-up, fds and TCP sockets by no more than 10; no unit fits and waits longer than
``fit_bound`` seconds (a unit the scheduler says is held back by a reservation, which is
its design, gets ``reservation_bound``: the longest run time plus ``fit_bound``); no node
is ever over-committed; every job that arrived is accounted for at the end (completed,
preempted with the ``DisruptionTarget`` condition, or still waiting with the scheduler's
reason; none lost, none partly bound); the scheduler never exited.

``python -m perf soak [--nodes 1000 --minutes 30 --rate R --seed S]`` writes
``<out>/soak/<tag>.json`` and ``.md``; ``tests/integration/test_soak.py`` runs the same code
at CI size.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError
from batchsched.kube.watch import Reflector
from batchsched.sandbox.nodes import SANDBOX_LABEL
from perf import procstat
from perf.live import RunError, check_podgroup_crd, create_all, fresh_sandbox, scrape, wait_ready
from perf.peers import X_K8S_LABEL, Running, get_peer
from perf.workload import NodeSpec

NAMESPACE = "soak"
QUEUES_PATH = "/apis/batchsched.io/v1alpha1/queues"
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1"
JOB_LABEL = "perf.batchsched.io/job"
QUEUE_LABEL = "batchsched.io/queue"
DURATION = "batchsched.io/sim-duration"
RUNTIME = "batchsched.io/expected-runtime"
FRACTION = "gpu-fraction"
CARDS = "batchsched.io/gpu-cards"
MIB = 1024 * 1024
MILLI = 1000

#: job kinds and their share of arrivals
MIX: tuple[tuple[str, float], ...] = (
    ("single", 0.43),   # one pod, one GPU
    ("multi", 0.14),    # one pod, 2, 4 or 8 GPUs
    ("gang", 0.10),     # 2-16 pods of 1, 2, 4 or 8 GPUs, all or nothing
    ("share", 0.15),    # one pod, a quarter or half of one card
    ("cpu", 0.15),      # one pod, no GPU
    ("urgent", 0.03),   # one pod of 2, 4 or 8 GPUs at high priority: preempts
)
#: the queues' shares of the GPUs (nominal), of arrivals, and what each may reclaim
QUEUES: tuple[tuple[str, float, str], ...] = (("a", 0.5, "Any"), ("b", 0.3, "LowerPriority"), ("c", 0.2, "LowerPriority"))
#: the scheduler's words for a unit held back by a reservation (batchsched/core/explain.py)
RESERVATION_WORDS = ("is reserved for", "holds a reservation", "which holds a reservation")


@dataclass(slots=True, frozen=True)
class SoakSize:
    nodes: int = 1000
    minutes: float = 30.0
    #: jobs per second; None: the rate that keeps ``busy`` of the GPUs allocated
    rate: float | None = None
    seed: int = 0
    busy: float = 0.85
    min_duration: float = 60.0
    max_duration: float = 300.0
    sample: float = 5.0
    warmup: float = 0.2
    #: seconds a unit may fit the free capacity and still wait
    fit_bound: float = 60.0
    #: RSS growth allowed after the warm-up: the larger of these
    rss_bound_bytes: int = 64 * MIB
    rss_bound_fraction: float = 0.10
    #: fds and TCP sockets allowed above their value at the end of the warm-up
    fd_bound: int = 10
    #: seconds the drain may last after the last arrival (default: twice the longest run time + 60)
    drain: float | None = None
    #: seconds sampled after the drain with nothing to do: longer than the API client's keep-alive
    #: (aiohttp: 15 s), so connections that are only pooled have closed and what is left is held
    quiet: float = 35.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.minutes <= 0 or self.sample <= 0:
            raise ValueError("nodes, minutes and the sample interval must be positive")
        if not 0 < self.min_duration <= self.max_duration:
            raise ValueError("run times: need 0 < min_duration <= max_duration")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"the arrival rate must be positive, got {self.rate}")
        if not 0 <= self.warmup < 1:
            raise ValueError("the warm-up is a fraction of the run, in [0, 1)")

    @property
    def tag(self) -> str:
        return f"{self.nodes}n-{self.minutes:g}min-seed{self.seed}"

    @property
    def drain_seconds(self) -> float:
        return self.drain if self.drain is not None else 2 * self.max_duration + 60

    @property
    def reservation_bound(self) -> float:
        return self.max_duration + self.fit_bound


# -- the jobs ----------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Ask:
    """What one pod asks: whole cards, a share of one card (thousandths), CPU (milli), memory (MiB)."""

    gpus: int = 0
    share: int = 0
    cpu: int = 1000
    memory: int = 4096


@dataclass(slots=True, frozen=True)
class Job:
    name: str
    kind: str
    queue: str
    ask: Ask
    members: int
    duration: float
    priority_class: str = ""

    @property
    def gang(self) -> bool:
        return self.kind == "gang"

    @property
    def gpu_seconds(self) -> float:
        return self.members * (self.ask.gpus + self.ask.share / MILLI) * self.duration

    def pod_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.members)]


class JobStream:
    """Seeded jobs of :data:`MIX`: the same seed gives the same jobs in the same order."""

    def __init__(self, size: SoakSize, queues: dict[str, str], *, seed: int) -> None:
        self.size = size
        self.rng = random.Random(seed)
        self.queues = queues
        self.count = 0
        #: a gang asks at most a quarter of the cluster's GPUs, so it fits beside other work
        self.gang_cap = max(2, size.nodes * 8 // 4)

    def next(self) -> Job:
        rng = self.rng
        kind = rng.choices([k for k, _ in MIX], [w for _, w in MIX])[0]
        queue = rng.choices([q for q, _, _ in QUEUES], [s for _, s, _ in QUEUES])[0]
        duration = round(rng.uniform(self.size.min_duration, self.size.max_duration), 1)
        members, priority = 1, ""
        if kind == "single":
            ask = Ask(gpus=1, cpu=1000, memory=8192)
        elif kind in ("multi", "urgent"):
            g = rng.choice((2, 4, 8))
            ask = Ask(gpus=g, cpu=1000 * g, memory=8192 * g)
            priority = "high-priority" if kind == "urgent" else ""
        elif kind == "gang":
            g = rng.choice([g for g in (1, 2, 4, 8) if 2 * g <= self.gang_cap])
            members = rng.randint(2, max(2, min(16, self.gang_cap // g)))
            ask = Ask(gpus=g, cpu=1000 * g, memory=8192 * g)
        elif kind == "share":
            ask = Ask(share=rng.choice((250, 500)), cpu=500, memory=2048)
        else:
            ask = Ask(cpu=rng.choice((1000, 2000, 4000)), memory=4096)
        self.count += 1
        return Job(name=f"j{self.count:06d}", kind=kind, queue=self.queues[queue], ask=ask, members=members,
                   duration=duration, priority_class=priority)


def mean_gpu_seconds(size: SoakSize, *, seed: int, draws: int = 20000) -> float:
    """GPU-seconds of the average job of the mix (drawn, not derived, so it follows :data:`MIX`)."""
    stream = JobStream(size, {q: q for q, _, _ in QUEUES}, seed=seed + 1)
    return sum(stream.next().gpu_seconds for _ in range(draws)) / draws


def default_rate(size: SoakSize) -> float:
    """Jobs per second that keep ``busy`` of the GPUs allocated (Little's law)."""
    return size.busy * size.nodes * 8 / mean_gpu_seconds(size, seed=size.seed)


def queue_objects(tag: str, gpus: int) -> list[dict[str, Any]]:
    """The root and its three queues; nominal quotas sum to the cluster's GPUs."""
    root = f"soak-{tag}"
    out: list[dict[str, Any]] = [{"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue",
                                  "metadata": {"name": root}, "spec": {}}]
    left = gpus
    for i, (q, share, reclaim) in enumerate(QUEUES):
        nominal = left if i == len(QUEUES) - 1 else int(gpus * share)
        left -= nominal
        out.append({
            "apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": f"{root}-{q}"},
            "spec": {"parent": root, "weight": 1,
                     "resources": [{"name": "nvidia.com/gpu", "nominal": nominal}],
                     "preemption": {"withinQueue": "LowerPriority", "reclaimWithinCohort": reclaim}},
        })
    return out


def pod_body(job: Job, name: str, pool: str) -> dict[str, Any]:
    ask = job.ask
    requests = {"cpu": f"{ask.cpu}m", "memory": f"{ask.memory}Mi"}
    limits: dict[str, str] = {}
    if ask.gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(ask.gpus)
    run = f"{job.duration:g}s"
    annotations = {DURATION: run, RUNTIME: run}
    if ask.share:
        annotations[FRACTION] = f"{ask.share / MILLI:g}"
    labels = {JOB_LABEL: job.name, QUEUE_LABEL: job.queue}
    if job.gang:
        labels[X_K8S_LABEL] = job.name
    spec: dict[str, Any] = {
        "schedulerName": "batchsched",
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {SANDBOX_LABEL: pool},
        "containers": [{"name": "main", "image": "trainer:latest",
                        "resources": {"requests": requests, **({"limits": limits} if limits else {})}}],
    }
    if job.priority_class:
        spec["priorityClassName"] = job.priority_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "annotations": annotations}, "spec": spec}


def group_body(job: Job) -> dict[str, Any]:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": job.name, "labels": {QUEUE_LABEL: job.queue}},
            "spec": {"minMember": job.members}}


# -- what the harness sees ----------------------------------------------------------------


@dataclass(slots=True)
class PodSeen:
    job: str
    node: str = ""
    bound_at: float | None = None
    phase: str = ""
    #: the scheduler's PodScheduled=False message, if any
    message: str = ""
    #: card index -> thousandths, for a share (from the assignment annotation)
    cards: dict[int, int] = field(default_factory=dict)
    disrupted: bool = False
    #: being deleted (by an eviction, or by the harness once finished)
    terminating: bool = False


@dataclass(slots=True)
class JobRecord:
    job: Job
    arrived: float
    bound_at: float | None = None
    finished_at: float | None = None
    #: completed, preempted, lost, failed (set when the job is over)
    outcome: str = ""
    message: str = ""
    group_deleted: bool = False


class Tracker:
    """The run's pods, from a list + watch: binds, completions, evictions, the scheduler's messages.

    Finished pods are handed to :attr:`to_delete`; a job is over when all its pods are gone,
    and its outcome is decided by what they went through (completed, evicted, vanished).
    """

    def __init__(self) -> None:
        self.pods: dict[str, PodSeen] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.pod_job: dict[str, str] = {}
        self.deleting: set[str] = set()
        self.to_delete: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.binds: list[float] = []
        self.lost: list[str] = []

    def expect(self, job: Job, now: float) -> None:
        self.jobs[job.name] = JobRecord(job=job, arrived=now)
        for name in job.pod_names():
            self.pod_job[name] = job.name

    def on_list(self, items: list[dict[str, Any]]) -> None:
        seen = set()
        for obj in items:
            seen.add(obj["metadata"]["name"])
            self.on_event("MODIFIED", obj)
        for name in [n for n in self.pods if n not in seen]:
            self._gone(name, None)

    def on_event(self, etype: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        job = self.pod_job.get(name)
        if job is None:
            return
        if etype == "DELETED":
            self._gone(name, obj)
            return
        now = time.monotonic()
        pod = self.pods.setdefault(name, PodSeen(job=job))
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        node = spec.get("nodeName") or ""
        if node and pod.bound_at is None:
            pod.node, pod.bound_at = node, now
            self.binds.append(now)
            self._job_bound(job, now)
        pod.phase = status.get("phase") or ""
        pod.terminating = bool(obj["metadata"].get("deletionTimestamp"))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                pod.message = cond.get("message") or cond.get("reason") or ""
            if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
                pod.disrupted = True
        cards = ((obj["metadata"].get("annotations") or {}).get(CARDS) or "")
        share = self.jobs[job].job.ask.share
        if cards and share:  # "main=0": the card of the share
            pod.cards = {int(i): share for i in re.findall(r"\d+", cards.split("=", 1)[-1])}
        if pod.phase in ("Succeeded", "Failed") and name not in self.deleting:
            self.deleting.add(name)
            self.to_delete.put_nowait(("pod", name))

    def _job_bound(self, job: str, now: float) -> None:
        rec = self.jobs[job]
        if rec.bound_at is None and all(
            (p := self.pods.get(n)) is not None and p.bound_at is not None for n in rec.job.pod_names()
        ):
            rec.bound_at = now

    def _gone(self, name: str, obj: dict[str, Any] | None) -> None:
        pod = self.pods.pop(name, None)
        job = self.pod_job[name]
        rec = self.jobs[job]
        if obj is not None:
            for cond in (obj.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True" and pod is not None:
                    pod.disrupted = True
        if pod is None:
            return
        if pod.phase == "Failed":
            rec.outcome = rec.outcome or "failed"
        elif pod.disrupted:
            if rec.outcome in ("", "completed"):
                rec.outcome = "preempted"
        elif name not in self.deleting:
            self.lost.append(name)
            rec.outcome = "lost"
        elif pod.phase == "Succeeded" and not rec.outcome:
            rec.outcome = "completed"
        if not any(n in self.pods for n in rec.job.pod_names()):
            rec.finished_at = time.monotonic()
            rec.outcome = rec.outcome or "completed"
            if rec.job.gang and not rec.group_deleted:
                rec.group_deleted = True
                self.to_delete.put_nowait(("podgroup", job))

    def live(self) -> list[JobRecord]:
        """Jobs that arrived and are not over."""
        return [r for r in self.jobs.values() if r.finished_at is None]

    def message_of(self, rec: JobRecord) -> str:
        for n in rec.job.pod_names():
            p = self.pods.get(n)
            if p is not None and p.message and p.bound_at is None:
                return p.message
        return ""


# -- free capacity, as the harness sees it -------------------------------------------------


@dataclass(slots=True)
class Free:
    """One node's free capacity: whole cards free, each shared card's used thousandths, CPU, memory, pods."""

    whole: int
    shared: dict[int, int]
    cpu: int
    memory: int
    pods: int

    def fits(self, ask: Ask) -> bool:
        if self.pods < 1 or self.cpu < ask.cpu or self.memory < ask.memory or self.whole < ask.gpus:
            return False
        return not ask.share or self.whole >= 1 or any(u + ask.share <= MILLI for u in self.shared.values())

    def take(self, ask: Ask) -> None:
        self.pods -= 1
        self.cpu -= ask.cpu
        self.memory -= ask.memory
        self.whole -= ask.gpus
        if ask.share:
            for card, used in self.shared.items():
                if used + ask.share <= MILLI:
                    self.shared[card] = used + ask.share
                    return
            self.whole -= 1
            self.shared[-1 - len(self.shared)] = ask.share

    def copy(self) -> Free:
        return Free(self.whole, dict(self.shared), self.cpu, self.memory, self.pods)


def free_capacity(nodes: Iterable[str], node: NodeSpec, tracker: Tracker) -> dict[str, Free]:
    """Each node's free capacity, from the pods bound to it that have not finished."""
    cpu = int(float(node.cpu) * MILLI)
    memory = _mib(node.memory)
    free = {n: Free(node.gpus, {}, cpu, memory, node.max_pods) for n in nodes}
    for pod in tracker.pods.values():
        f = free.get(pod.node)
        if f is None or pod.phase in ("Succeeded", "Failed"):
            continue
        ask = tracker.jobs[pod.job].job.ask
        f.pods -= 1
        f.cpu -= ask.cpu
        f.memory -= ask.memory
        f.whole -= ask.gpus
        if ask.share:
            if pod.cards:
                for card, share in pod.cards.items():
                    f.shared[card] = f.shared.get(card, 0) + share
            else:  # not recorded (yet): count a card of its own
                f.shared[-1 - len(f.shared)] = ask.share
    for f in free.values():
        f.whole -= len(f.shared)
    return free


def _str_keys(cards: dict[int, int]) -> dict[str, int]:
    """Card index -> thousandths, as JSON can hold it (a card not yet named is negative)."""
    return {str(k): v for k, v in cards.items()}


def _mib(quantity: str) -> int:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(float(quantity)) // MIB


def unit_fits(job: Job, free: dict[str, Free]) -> bool:
    """Do all ``job``'s pods fit the free capacity at once? (greedy best fit: a yes is a real placement)"""
    order = sorted(free.values(), key=lambda f: (f.whole, f.cpu))
    if job.members == 1:
        return any(f.fits(job.ask) for f in order)
    taken: dict[int, Free] = {}
    for _ in range(job.members):
        for i, f in enumerate(order):
            g = taken.get(i, f)
            if g.fits(job.ask):
                if i not in taken:
                    g = taken[i] = f.copy()
                g.take(job.ask)
                break
        else:
            return False
    return True


# -- the process ---------------------------------------------------------------------------


def open_fds(pid: int) -> tuple[int, int] | None:
    """(open fds, TCP sockets among them) of a process, from /proc."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return None
    sockets = {link[8:-1] for link in links if link.startswith("socket:[")}
    tcp = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as fh:
            next(fh, None)
            tcp += sum(1 for line in fh if line.split()[9] in sockets)
    return len(links), tcp


# -- the run -------------------------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    t: float
    phase: str
    rss_mib: float | None
    cpu_percent: float | None
    fds: int | None
    tcp: int | None
    pending_pods: int
    pending_jobs: int
    running_pods: int
    gpus_allocated_percent: float
    binds_per_s: float
    fit_wait_s: float
    fit_wait_job: str
    held_wait_s: float
    overcommitted_nodes: int
    apiserver_rss_mib: float | None
    apiserver_cpu_percent: float | None
    scheduler_pending: float | None


@dataclass(slots=True)
class Run:
    size: SoakSize
    kubeconfig: str
    nodes: list[str]
    pool: str
    node: NodeSpec
    namespace: str
    tag: str
    workdir: Path
    apiserver_pid: int | None
    log: Callable[[str], None]
    rate: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    #: job -> start of its unbroken stretch of fitting the free capacity
    fit_since: dict[str, float] = field(default_factory=dict)
    #: the longest fit wait of each job, and the scheduler's message at the time
    fit_waits: dict[str, tuple[float, str]] = field(default_factory=dict)
    create_errors: list[str] = field(default_factory=list)
    #: the first over-committed nodes seen: the node, its free capacity, the pods the harness saw on it
    overcommits: list[dict[str, Any]] = field(default_factory=list)


async def _arrive(run: Run, client: KubeClient, tracker: Tracker, stream: JobStream, until: float) -> None:
    rng = random.Random(run.size.seed)
    pods_path = f"/api/v1/namespaces/{run.namespace}/pods"
    groups_path = f"{PODGROUPS}/namespaces/{run.namespace}/podgroups"
    tasks: set[asyncio.Task[None]] = set()

    async def create(job: Job) -> None:
        try:
            if job.gang:
                await create_all(client, [(groups_path, group_body(job))], concurrency=1)
            tracker.expect(job, time.monotonic())
            await create_all(client, [(pods_path, pod_body(job, n, run.pool)) for n in job.pod_names()], concurrency=16)
        except KubeError as exc:
            run.create_errors.append(f"{job.name}: {exc}")

    t = time.monotonic()
    while True:
        t += rng.expovariate(run.rate)
        if t >= until:
            break
        await asyncio.sleep(max(0.0, t - time.monotonic()))
        task = asyncio.create_task(create(stream.next()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


async def _delete(client: KubeClient, tracker: Tracker, namespace: str) -> None:
    """Delete finished pods and then their PodGroups, as a job controller's TTL would."""
    async def one() -> None:
        while True:
            kind, name = await tracker.to_delete.get()
            path = (f"/api/v1/namespaces/{namespace}/pods/{name}" if kind == "pod"
                    else f"{PODGROUPS}/namespaces/{namespace}/podgroups/{name}")
            for attempt in range(5):
                try:
                    await client.delete(path, gracePeriodSeconds=0)
                    break
                except NotFoundError:
                    break
                except KubeError:
                    await asyncio.sleep(0.2 * (attempt + 1))

    await asyncio.gather(*(one() for _ in range(8)))


def _sample(run: Run, tracker: Tracker, running: Running, phase: str, t0: float, last: dict[str, Any]) -> Sample:
    now = time.monotonic()
    free = free_capacity(run.nodes, run.node, tracker)
    over_nodes = [n for n, f in free.items() if f.whole < 0 or f.cpu < 0 or f.memory < 0 or f.pods < 0]
    for n in over_nodes[: max(0, 20 - len(run.overcommits))]:
        run.overcommits.append({
            "t": round(now - t0, 2), "node": n, "free": {**asdict(free[n]), "shared": _str_keys(free[n].shared)},
            "pods": [{"pod": name, "ask": asdict(tracker.jobs[p.job].job.ask), "kind": tracker.jobs[p.job].job.kind,
                      "phase": p.phase, "terminating": p.terminating, "disrupted": p.disrupted, "cards": _str_keys(p.cards),
                      "bound_s_ago": round(now - (p.bound_at or now), 2)}
                     for name, p in tracker.pods.items() if p.node == n],
        })
    over = len(over_nodes)
    capacity = len(run.nodes) * run.node.gpus
    allocated = sum(
        tracker.jobs[p.job].job.ask.gpus + tracker.jobs[p.job].job.ask.share / MILLI
        for p in tracker.pods.values() if p.node and p.phase not in ("Succeeded", "Failed")
    )
    # the units that fit now: whole, not being bound (every member unbound)
    fitting: set[str] = set()
    memo: dict[tuple[Ask, int], bool] = {}
    pending_pods = 0
    live = tracker.live()
    for rec in live:
        names = rec.job.pod_names()
        pods = [tracker.pods.get(n) for n in names]
        unbound = sum(1 for p in pods if p is None or p.bound_at is None)
        pending_pods += unbound
        if unbound < len(names) or any(p is None for p in pods):
            continue
        key = (rec.job.ask, rec.job.members)
        if key not in memo:
            memo[key] = unit_fits(rec.job, free)
        if memo[key]:
            fitting.add(rec.job.name)
    for name in [n for n in run.fit_since if n not in fitting]:
        del run.fit_since[name]
    worst, worst_job, held = 0.0, "", 0.0
    for name in fitting:
        since = run.fit_since.setdefault(name, now)
        wait = now - since
        message = tracker.message_of(tracker.jobs[name])
        if wait > run.fit_waits.get(name, (0.0, ""))[0]:
            run.fit_waits[name] = (wait, message)
        if any(w in message for w in RESERVATION_WORDS):
            held = max(held, wait)
        elif wait > worst:
            worst, worst_job = wait, name
    binds = sum(1 for b in tracker.binds if b > last["t"])
    interval = now - last["t"]
    usage = last["sched"].end(now)
    api = last["api"].end(now) if last["api"] is not None else None
    fds = open_fds(running.pid)
    metrics = scrape(running.metrics_url) if running.metrics_url else {}
    rss = procstat.rss(running.pid)
    api_rss = procstat.rss(run.apiserver_pid) if run.apiserver_pid else None
    last["t"] = now
    last["sched"] = procstat.Window(running.pid, started=now)
    last["api"] = procstat.Window(run.apiserver_pid, started=now) if run.apiserver_pid else None
    return Sample(
        t=round(now - t0, 2), phase=phase,
        rss_mib=None if rss is None else round(rss / MIB, 1),
        cpu_percent=None if usage.cpu_percent is None else round(usage.cpu_percent, 1),
        fds=None if fds is None else fds[0], tcp=None if fds is None else fds[1],
        pending_pods=pending_pods, pending_jobs=sum(1 for r in live if r.bound_at is None),
        running_pods=sum(1 for p in tracker.pods.values() if p.node and p.phase not in ("Succeeded", "Failed")),
        gpus_allocated_percent=round(100 * allocated / capacity, 1) if capacity else 0.0,
        binds_per_s=round(binds / interval, 2) if interval > 0 else 0.0,
        fit_wait_s=round(worst, 1), fit_wait_job=worst_job, held_wait_s=round(held, 1),
        overcommitted_nodes=over,
        apiserver_rss_mib=None if api_rss is None else round(api_rss / MIB, 1),
        apiserver_cpu_percent=None if api is None or api.cpu_percent is None else round(api.cpu_percent, 1),
        scheduler_pending=metrics.get("batchsched_pending_pods"),
    )


async def _soak(run: Run) -> dict[str, Any]:
    size = run.size
    client = await KubeClient.connect(run.kubeconfig, max_connections=96)
    tracker = Tracker()
    stream = JobStream(size, {q: f"soak-{run.tag}-{q}" for q, _, _ in QUEUES}, seed=size.seed)
    queues = queue_objects(run.tag, len(run.nodes) * run.node.gpus)
    running: Running | None = None
    tasks: list[asyncio.Task[Any]] = []
    out: dict[str, Any] = {}
    try:
        await check_podgroup_crd(client)
        with contextlib.suppress(ConflictError):
            await client.create("/api/v1/namespaces", {"metadata": {"name": run.namespace}})
        await create_all(client, [(QUEUES_PATH, q) for q in queues], concurrency=1)
        reflector = Reflector(client, f"/api/v1/namespaces/{run.namespace}/pods",
                              on_list=tracker.on_list, on_event=tracker.on_event, name="soak pods")
        tasks.append(asyncio.create_task(reflector.run()))
        await asyncio.wait_for(reflector.synced.wait(), 60)
        tasks.append(asyncio.create_task(_delete(client, tracker, run.namespace)))

        running = get_peer("batchsched").start(run.kubeconfig, run.workdir)
        ready = await wait_ready(running)
        if ready is None:
            raise RunError(f"batchsched exited before it was ready: {running.log_tail()}")
        run.log(f"soak {run.size.tag}: batchsched ready in {ready:.1f} s; {run.rate:.2f} jobs/s for {size.minutes:g} min")
        t0 = time.monotonic()
        arrivals_end = t0 + size.minutes * 60
        arrivals = asyncio.create_task(_arrive(run, client, tracker, stream, arrivals_end))
        tasks.append(arrivals)
        last: dict[str, Any] = {
            "t": t0, "sched": procstat.Window(running.pid, started=t0),
            "api": procstat.Window(run.apiserver_pid, started=t0) if run.apiserver_pid else None,
        }
        next_log = t0
        crashed = ""
        drain_end: float | None = None
        quiet_end: float | None = None
        t_drained = arrivals_end
        while True:
            await asyncio.sleep(max(0.0, t0 + size.sample * (len(run.samples) + 1) - time.monotonic()))
            now = time.monotonic()
            if not running.alive():
                crashed = f"batchsched exited with code {running.proc.returncode}: {running.log_tail()}"
                break
            phase = "arrivals" if not arrivals.done() else "drain" if quiet_end is None else "quiet"
            s = _sample(run, tracker, running, phase, t0, last)
            run.samples.append(s)
            if now >= next_log:
                next_log = now + 60
                run.log(f"soak {run.size.tag}: {s.t:.0f} s {phase}: RSS {s.rss_mib} MiB, CPU {s.cpu_percent}%, "
                        f"fds {s.fds}, tcp {s.tcp}, {s.running_pods} running, {s.pending_pods} pending, "
                        f"GPUs {s.gpus_allocated_percent}%, {s.binds_per_s} binds/s, fit wait {s.fit_wait_s} s")
            if quiet_end is not None:
                if now >= quiet_end:
                    break
            elif arrivals.done():
                arrivals.result()
                drain_end = drain_end or now + size.drain_seconds
                if not tracker.live() or now >= drain_end:
                    t_drained, quiet_end = now, now + size.quiet
        out["metrics"] = scrape(running.metrics_url) if running.metrics_url else {}
        out["crashed"] = crashed
        out["arrival_s"] = round(min(arrivals_end, t_drained) - t0, 1)
        out["drain_s"] = round(max(0.0, t_drained - arrivals_end), 1)
        out["quiet_s"] = size.quiet
        out["ready_s"] = round(ready, 2)
        out["peak_rss_mib"] = (procstat.peak_rss(running.pid) or 0) / MIB
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if running is not None:
            await asyncio.get_running_loop().run_in_executor(None, running.stop)
        for q in reversed(queues):
            with contextlib.suppress(KubeError):
                await client.delete(f"{QUEUES_PATH}/{q['metadata']['name']}")
        await client.close()
    out["accounting"] = account(run, tracker)
    return out


def account(run: Run, tracker: Tracker) -> dict[str, Any]:
    """Every job that arrived, by kind and outcome; the waiting ones with the scheduler's reason."""
    by_kind: dict[str, dict[str, int]] = {}
    waiting: list[dict[str, Any]] = []
    partial: list[str] = []
    latency: dict[str, list[float]] = {}
    for rec in tracker.jobs.values():
        names = rec.job.pod_names()
        bound = sum(1 for n in names if (p := tracker.pods.get(n)) is not None and p.bound_at is not None)
        outcome = rec.outcome
        if rec.finished_at is None:
            outcome = "running" if rec.bound_at is not None else ("waiting" if bound == 0 else "partly bound")
            if outcome == "partly bound":
                partial.append(rec.job.name)
            elif outcome == "waiting":
                waiting.append({"job": rec.job.name, "kind": rec.job.kind, "members": rec.job.members,
                                "waited_s": round(time.monotonic() - rec.arrived, 1),
                                "reason": tracker.message_of(rec)})
        row = by_kind.setdefault(rec.job.kind, {})
        row[outcome] = row.get(outcome, 0) + 1
        if rec.bound_at is not None:
            latency.setdefault(rec.job.kind, []).append(rec.bound_at - rec.arrived)
    return {
        "jobs": len(tracker.jobs),
        "pods": sum(r.job.members for r in tracker.jobs.values()),
        "by_kind": by_kind,
        "outcomes": _totals(by_kind),
        "waiting": waiting,
        "partly_bound": partial,
        "lost_pods": list(tracker.lost),
        "create_errors": list(run.create_errors),
        "bind_wait_s": {k: _spread(v) for k, v in sorted(latency.items())},
    }


def _totals(by_kind: dict[str, dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in by_kind.values():
        for k, v in row.items():
            out[k] = out.get(k, 0) + v
    return out


def _spread(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {"n": len(v), "p50": round(v[len(v) // 2], 2), "p99": round(v[min(len(v) - 1, int(len(v) * 0.99))], 2),
            "max": round(v[-1], 2)}


# -- the verdict ---------------------------------------------------------------------------

SERIES = ("rss_mib", "cpu_percent", "fds", "tcp", "pending_pods", "fit_wait_s", "held_wait_s", "binds_per_s",
          "gpus_allocated_percent", "running_pods", "apiserver_rss_mib", "apiserver_cpu_percent")


def _values(samples: list[Sample], key: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, key)) is not None]


def summary(samples: list[Sample], warm: float) -> dict[str, Any]:
    """min/median/max of each series over the steady state (the arrivals after the warm-up);
    the RSS slope (MiB per 10 min) over the same samples."""
    after = [s for s in samples if s.t >= warm and s.phase == "arrivals"] or samples
    table = {}
    for key in SERIES:
        v = _values(after, key)
        if v:
            table[key] = {"min": round(min(v), 2), "median": round(statistics.median(v), 2), "max": round(max(v), 2)}
    steady = [(s.t, s.rss_mib) for s in after if s.rss_mib is not None]
    slope = None
    if len(steady) >= 3:
        mt = statistics.fmean(t for t, _ in steady)
        mr = statistics.fmean(r for _, r in steady)
        den = sum((t - mt) ** 2 for t, _ in steady)
        slope = round(600 * sum((t - mt) * (r - mr) for t, r in steady) / den, 2) if den else None
    return {"series": table, "rss_slope_mib_per_10min": slope}


def verdict(size: SoakSize, samples: list[Sample], result: dict[str, Any], warm: float) -> list[dict[str, Any]]:
    """The checks, each with its value, its bound and whether it holds."""
    at_warm = next((s for s in samples if s.t >= warm), samples[-1] if samples else None)
    after = [s for s in samples if s.t >= warm]
    checks: list[dict[str, Any]] = []

    def check(name: str, value: Any, bound: Any, ok: bool, detail: str = "") -> None:
        checks.append({"check": name, "value": value, "bound": bound, "ok": bool(ok), "detail": detail})

    check("the scheduler ran to the end", result.get("crashed") or "yes", "no exit", not result.get("crashed"))
    if at_warm is None or not after:
        check("samples after the warm-up", 0, ">= 1", False)
        return checks
    base = at_warm.rss_mib
    rss = _values(after, "rss_mib")
    if base is None or not rss:
        check("RSS after the warm-up", None, "sampled", False, "the process could not be read")
    else:
        bound = round(max(size.rss_bound_bytes / MIB, size.rss_bound_fraction * base), 1)
        growth = round(max(rss) - base, 1)
        check("RSS growth after the warm-up (MiB)", growth, bound, growth <= bound,
              f"{base} MiB at {at_warm.t:.0f} s, max {max(rss)}, at the end {rss[-1]}")
    # fds and sockets: held ones are counted once the quiet end has let pooled connections close
    quiet = [s for s in samples if s.phase == "quiet"]
    for key, name in (("fds", "open fds"), ("tcp", "TCP sockets")):
        base_n = getattr(at_warm, key)
        values = _values(after, key)
        end = _values(quiet, key)
        if base_n is None or not values or not end:
            check(f"{name} at the quiet end", None, "sampled", False, "the process could not be read or no quiet end")
            continue
        growth_n = end[-1] - base_n
        check(f"{name} at the quiet end, above the warm-up", growth_n, size.fd_bound, growth_n <= size.fd_bound,
              f"{base_n} at {at_warm.t:.0f} s, {end[-1]} after {size.quiet:g} s quiet; during the run at most "
              f"{max(values)} (+{max(values) - base_n}: pooled connections, see the report)")
    worst = max(after, key=lambda s: s.fit_wait_s)
    check("longest wait of a unit that fits (s)", worst.fit_wait_s, size.fit_bound, worst.fit_wait_s <= size.fit_bound,
          f"{worst.fit_wait_job} at {worst.t:.0f} s" if worst.fit_wait_job else "")
    held = max(s.held_wait_s for s in after)
    check("longest wait of a fitting unit held back by a reservation (s)", held, size.reservation_bound,
          held <= size.reservation_bound)
    over = sum(s.overcommitted_nodes for s in samples)
    check("over-committed node samples", over, 0, over == 0)
    acc = result["accounting"]
    unaccounted = [w["job"] for w in acc["waiting"] if not w["reason"]]
    check("jobs lost (a pod gone without completing or being preempted)", len(acc["lost_pods"]), 0,
          not acc["lost_pods"], ", ".join(acc["lost_pods"][:5]))
    check("gangs partly bound at the end", len(acc["partly_bound"]), 0, not acc["partly_bound"],
          ", ".join(acc["partly_bound"][:5]))
    check("waiting jobs without a reason at the end", len(unaccounted), 0, not unaccounted, ", ".join(unaccounted[:5]))
    check("jobs that could not be created", len(acc["create_errors"]), 0, not acc["create_errors"],
          "; ".join(acc["create_errors"][:3]))
    failed = acc["outcomes"].get("failed", 0)
    check("failed jobs", failed, 0, failed == 0)
    return checks


# -- entry points --------------------------------------------------------------------------


async def soak_on(
    *, size: SoakSize, kubeconfig: str, nodes: list[str], pool: str, node: NodeSpec, namespace: str, tag: str,
    workdir: Path, apiserver_pid: int | None, log: Callable[[str], None],
) -> dict[str, Any]:
    """The soak against a running control plane whose ``nodes`` (labelled ``pool``) are the run's own;
    queues are named after ``tag``. Returns the result, verdict included."""
    from perf.suite import machine

    rate = size.rate or default_rate(size)
    run = Run(size=size, kubeconfig=kubeconfig, nodes=nodes, pool=pool, node=node, namespace=namespace, tag=tag,
              workdir=workdir, apiserver_pid=apiserver_pid, log=log, rate=rate)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load = os.getloadavg()
    result = await _soak(run)
    warm = size.warmup * size.minutes * 60
    checks = verdict(size, run.samples, result, warm)
    longest = sorted(run.fit_waits.items(), key=lambda kv: kv[1][0], reverse=True)[:10]
    return {
        "benchmark": "soak", "tag": size.tag, "size": asdict(size), "nodes": len(nodes),
        "gpus": len(nodes) * node.gpus, "rate_jobs_per_s": round(rate, 3),
        "mean_gpu_seconds_per_job": round(mean_gpu_seconds(size, seed=size.seed), 1),
        "mix": dict(MIX), "queues": [q["metadata"]["name"] for q in queue_objects(tag, len(nodes) * node.gpus)],
        "started": started, "load_before": load, "machine": machine(),
        "warmup_s": warm, "sample_s": size.sample,
        **{k: v for k, v in result.items() if k != "metrics"},
        "scheduler_metrics_at_end": result.get("metrics", {}),
        "summary": summary(run.samples, warm),
        "longest_fit_waits": [{"job": j, "wait_s": round(w, 1), "message": m} for j, (w, m) in longest],
        "checks": checks, "ok": all(c["ok"] for c in checks),
        "overcommitted": run.overcommits,
        "samples": [asdict(s) for s in run.samples],
    }


def run_soak(*, size: SoakSize, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The soak on a fresh sandbox of ``size.nodes`` nodes; writes ``<out>/soak/<tag>.json`` and ``.md``."""
    from perf.suite import write_json

    node = NodeSpec()
    workdir = out / "work" / f"soak-{size.tag}"
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"soak {size.tag}: a sandbox of {size.nodes} nodes ...")
    with fresh_sandbox(f"perf-{os.getpid()}-soak", size.nodes, node, []) as state:
        procs = {p.name: p.pid for p in state.processes}
        data = asyncio.run(soak_on(
            size=size, kubeconfig=state.kubeconfig, nodes=[f"gpu-node-{i}" for i in range(size.nodes)],
            pool="gpu-node", node=node, namespace=NAMESPACE, tag=f"{os.getpid()}", workdir=workdir,
            apiserver_pid=procs.get("kube-apiserver"), log=log,
        ))
    data["command"] = (f"python -m perf soak --nodes {size.nodes} --minutes {size.minutes:g} --seed {size.seed}"
                       + (f" --rate {size.rate:g}" if size.rate else ""))
    write_json(out / "soak" / f"{size.tag}.json", data)
    (out / "soak" / f"{size.tag}.md").write_text(markdown(data))
    return data


def table(data: dict[str, Any]) -> list[str]:
    """The time series, summarized: min / median / max over the steady state."""
    rows = [f"{'metric':<28} {'min':>10} {'median':>10} {'max':>10}"]
    for key, v in data["summary"]["series"].items():
        rows.append(f"{key:<28} {v['min']:>10} {v['median']:>10} {v['max']:>10}")
    rows.append(f"RSS slope over the arrivals: {data['summary']['rss_slope_mib_per_10min']} MiB per 10 min")
    return rows


def markdown(data: dict[str, Any]) -> str:
    size = data["size"]
    acc = data["accounting"]
    lines = [
        f"# Soak: {data['nodes']} nodes, {size['minutes']:g} minutes",
        "",
        f"`{data.get('command', '')}` ({data['started']}; code {data['machine']['code']}; "
        f"{data['machine']['cpus']} CPUs, load {data['load_before'][0]:.1f} before the run). "
        "The machine is shared: other engineers' tests and control planes ran beside it, so CPU "
        "figures include their contention.",
        "",
        f"**Verdict: {'PASS' if data['ok'] else 'FAIL'}.** {data['rate_jobs_per_s']} jobs/s (Poisson, seed "
        f"{size['seed']}), {acc['jobs']} jobs / {acc['pods']} pods over {data['arrival_s']} s of arrivals, then "
        f"{data['drain_s']} s of drain and {data.get('quiet_s', 0):g} s quiet; {data['gpus']} GPUs; a sample every {data['sample_s']:g} s; warm-up "
        f"{data['warmup_s']:.0f} s; batchsched ready in {data['ready_s']} s, peak RSS {data['peak_rss_mib']:.0f} MiB.",
        "",
        "| check | value | bound | holds | detail |",
        "|---|---|---|---|---|",
    ]
    for c in data["checks"]:
        lines.append(f"| {c['check']} | {c['value']} | {c['bound']} | {'yes' if c['ok'] else '**no**'} | {c['detail']} |")
    lines += ["", "The steady state (arrivals, after the warm-up):", "", "| metric | min | median | max |",
              "|---|---|---|---|"]
    for key, v in data["summary"]["series"].items():
        lines.append(f"| {key} | {v['min']} | {v['median']} | {v['max']} |")
    lines += ["", f"RSS slope over the arrivals: {data['summary']['rss_slope_mib_per_10min']} MiB per 10 minutes.",
              "", "Jobs by kind and outcome:", "", "| kind | outcomes | bind wait p50 / p99 / max (s) |", "|---|---|---|"]
    for kind, row in sorted(acc["by_kind"].items()):
        w = acc["bind_wait_s"].get(kind)
        waits = f"{w['p50']} / {w['p99']} / {w['max']}" if w else ""
        lines.append(f"| {kind} | {', '.join(f'{k} {v}' for k, v in sorted(row.items()))} | {waits} |")
    if acc["waiting"]:
        lines += ["", "Still waiting at the end, with the scheduler's reason:", ""]
        lines += [f"- {w['job']} ({w['kind']}, {w['members']} pods, {w['waited_s']} s): {w['reason']}"
                  for w in acc["waiting"][:20]]
    if data["longest_fit_waits"]:
        lines += ["", "Longest fit waits (a unit that fit the free capacity, waiting), with the scheduler's message:", ""]
        lines += [f"- {w['job']}: {w['wait_s']} s: {w['message'] or '(no message)'}" for w in data["longest_fit_waits"]]
    return "\n".join(lines) + "\n"
