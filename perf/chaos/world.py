"""The world a chaos fault acts on: a sandbox, its nodes and queues, the workload, the
scheduler replicas, and the harness's own record of what happened.

:func:`open_world` makes, in one sandbox (a fresh one for ``python -m perf chaos``, the test
session's in CI), a namespace, a pool of 8-GPU nodes named after it, and three Queues: a
cohort root and two teams under it, each with a nominal half of the pool's GPUs and a
borrowing limit, counted in ``batchsched.io/gpu`` (cards, a share counted exactly). The
workload's pods select the pool's nodes and name a scheduler of their own
(``batchsched-<namespace>``), so a chaos world never takes capacity from, nor schedules,
anything else on a shared control plane.

The :class:`Recorder` is the witness every check is judged against. It runs in a thread of
its own, with its own event loop and client, so a harness blocked in a synchronous call
(starting a replica, waiting for a component) never delays what it sees: it watches the
namespace's pods (every node a pod uid was ever seen bound to, with the time), PodGroups
and Events, the pool's nodes and the world's Queues, and samples the checks of
:mod:`perf.chaos.checks` every second and on every change.

:class:`Schedulers` runs batchsched replicas as processes (``python -m batchsched run``),
each with its own identity, config file, log and metrics port, leader election on a Lease
in the namespace. A replica that exits on its own (a lost lease, a watch that failed) is
started again, as its Deployment would; one the harness stopped is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError
from batchsched.sandbox.cluster import free_port, grant_lease_namespace
from batchsched.sandbox.nodes import (
    SANDBOX_LABEL,
    NodeShape,
    create_nodes,
    delete_nodes,
    wait_nodes_ready,
)
from perf.chaos.checks import (
    GPU,
    GROUP_APIS,
    GROUP_LABEL,
    JOB_LABEL,
    K8S_API,
    MEMBER_LABEL,
    QUEUE_LABEL,
    QUOTA_RESOURCE,
    SHARE_ANNOTATION,
    WORLD_LABEL,
    XK8S_API,
    podgroups_path,
)
from perf.chaos.recorder import Recorder

if TYPE_CHECKING:
    from batchsched.sandbox.cluster import Sandbox, SandboxState
    from perf.chaos.checks import Verdict
    from perf.chaos.proxy import Proxy

QUEUES = "/apis/batchsched.io/v1alpha1/queues"
LEASES = "/apis/coordination.k8s.io/v1"
LEASE_NAME = "batchsched"


#: the replicas' lease renew deadline (s): a replica cut off from the apiserver this long stops leading
RENEW_DEADLINE = 3.0


@dataclass(frozen=True, slots=True)
class Injected:
    """What a fault reports back to the runner."""

    at: float
    detail: str = ""
    healed_at: float | None = None
    #: what the fault observed that a test may assert on (e.g. a relist seen)
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault as the table shows it."""

    name: str
    run: Callable[[World], Awaitable[Injected]]


@dataclass(slots=True)
class Job:
    """A gang (a PodGroup and its pods) or one single pod (``members == 1``)."""

    name: str
    namespace: str
    members: int
    min_member: int
    gpu: int
    share: float | None
    queue: str | None
    priority: str | None
    pods: list[str]
    #: when not empty, the only nodes its pods may go to (required node affinity)
    nodes: tuple[str, ...] = ()
    #: the API its PodGroup is written in (a gang's)
    api: str = XK8S_API

    @property
    def gang(self) -> bool:
        return self.members > 1

    @property
    def cards(self) -> float:
        """GPU cards one member holds."""
        return self.share if self.share is not None else float(self.gpu)


class WorldError(RuntimeError):
    """The world could not do what a fault or the runner asked."""




# -- the scheduler replicas ------------------------------------------------------------------


@dataclass(slots=True)
class Replica:
    name: str
    identity: str
    config: Path
    log: Path
    port: int
    kubeconfig: str
    proc: subprocess.Popen[bytes] | None = None
    #: started again after exiting on its own
    restarts: int = 0
    #: the harness stopped it: it is not started again
    held: bool = False


class Schedulers:
    """batchsched replicas as processes; see the module docstring."""

    def __init__(self, *, kubeconfig: str, namespace: str, scheduler_name: str, workdir: Path,
                 proxy: Proxy, base_config: dict[str, Any] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.scheduler_name = scheduler_name
        self.workdir = workdir
        self.proxy = proxy
        self.base_config = dict(base_config or {})
        self.replicas: dict[str, Replica] = {}
        self._lock = threading.Lock()
        self._admin: KubeClient | None = None

    def identity(self, name: str) -> str:
        return f"{self.namespace}-{name}"

    def log(self, name: str) -> Path:
        return self.workdir / f"scheduler-{name}.log"

    def config_document(self, name: str, port: int, extra: dict[str, Any] | None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schedulerNames": [self.scheduler_name],
            "identity": self.identity(name),
            "leaderElection": {"namespace": self.namespace, "leaseName": LEASE_NAME,
                               "leaseDurationSeconds": 4, "renewDeadlineSeconds": RENEW_DEADLINE,
                               "retryPeriodSeconds": 0.5},
            "metricsAddress": f"127.0.0.1:{port}",
            "cycle": {"retryUnschedulableSeconds": 30},
        }
        for key, value in {**self.base_config, **(extra or {})}.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key] = {**doc[key], **value}
            else:
                doc[key] = value
        return doc

    def start(self, name: str = "a", *, via_proxy: bool | None = None, extra_config: dict[str, Any] | None = None,
              ready_timeout: float = 120.0) -> int:
        """Start replica ``name`` (again) and wait for its /readyz; its pid. ``via_proxy``
        None: as it ran before (directly, for a new replica)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            old = self.replicas.get(name)
            port = old.port if old else free_port()
            if via_proxy is None:
                via_proxy = old is not None and old.kubeconfig == self.proxy.kubeconfig
            config = self.workdir / f"scheduler-{name}.yaml"
            config.write_text(yaml.safe_dump(self.config_document(name, port, extra_config), sort_keys=False))
            rep = Replica(name=name, identity=self.identity(name), config=config, log=self.log(name), port=port,
                          kubeconfig=self.proxy.kubeconfig if via_proxy else self.kubeconfig,
                          restarts=old.restarts if old else 0)
            self._spawn(rep)
            self.replicas[name] = rep
        self.wait_ready(name, timeout=ready_timeout)
        assert rep.proc is not None
        return rep.proc.pid

    def _spawn(self, rep: Replica) -> None:
        with open(rep.log, "ab") as out:
            out.write(f"--- {time.strftime('%H:%M:%S')} starting {rep.identity}\n".encode())
            out.flush()
            rep.proc = subprocess.Popen(
                [sys.executable, "-m", "batchsched", "run", "--kubeconfig", rep.kubeconfig, "--config", str(rep.config)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "BATCHSCHED_LOG_LEVEL": "INFO"},
            )

    def ready(self, name: str) -> bool:
        rep = self.replicas.get(name)
        if rep is None or not self.alive(name):
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{rep.port}/readyz", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, name: str, *, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready(name):
            rep = self.replicas[name]
            if rep.proc is not None and rep.proc.poll() is not None and rep.held:
                raise WorldError(f"replica {name} exited with code {rep.proc.returncode}: {self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise WorldError(f"replica {name} not ready within {timeout:.0f} s: {self.log_tail(name)}")
            time.sleep(0.1)

    def alive(self, name: str) -> bool:
        rep = self.replicas.get(name)
        return bool(rep and rep.proc is not None and rep.proc.poll() is None)

    def pid(self, name: str) -> int | None:
        rep = self.replicas.get(name)
        return rep.proc.pid if rep and rep.proc is not None and rep.proc.poll() is None else None

    def kill(self, name: str = "a", sig: int = signal.SIGKILL) -> None:
        """Send ``sig``; a replica killed this way stays down until :meth:`start`."""
        rep = self.replicas[name]
        rep.held = True
        if rep.proc is not None and rep.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                rep.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rep.proc.wait(30)

    def pause(self, name: str) -> None:
        rep = self.replicas[name]
        if rep.proc is not None:
            rep.proc.send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        rep = self.replicas[name]
        if rep.proc is not None:
            rep.proc.send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        for name, rep in self.replicas.items():
            rep.held = True
            if rep.proc is not None and rep.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    rep.proc.send_signal(signal.SIGCONT)
                    rep.proc.terminate()
                try:
                    rep.proc.wait(20)
                except subprocess.TimeoutExpired:
                    rep.proc.kill()
                    rep.proc.wait()
            del name

    def supervise(self) -> list[str]:
        """Start again every replica that exited on its own; the names started."""
        restarted = []
        with self._lock:
            for rep in self.replicas.values():
                if rep.held or rep.proc is None or rep.proc.poll() is None:
                    continue
                rep.restarts += 1
                with open(rep.log, "ab") as out:
                    out.write(f"--- exited with code {rep.proc.returncode}; started again\n".encode())
                self._spawn(rep)
                restarted.append(rep.name)
        return restarted

    def leader(self) -> str | None:
        """The replica holding the Lease now (read from the Lease object)."""
        holder = self.lease_holder()
        for name in self.replicas:
            if holder and holder == self.identity(name):
                return name
        return None

    def lease_holder(self) -> str:
        import ssl

        from batchsched.sandbox.pki import TOKEN_USERS  # noqa: F401  (the admin kubeconfig's user)

        kc = yaml.safe_load(Path(self.kubeconfig).read_text())
        server = kc["clusters"][0]["cluster"]["server"]
        ca = kc["clusters"][0]["cluster"].get("certificate-authority")
        token = kc["users"][0]["user"].get("token", "")
        ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        req = urllib.request.Request(f"{server}{LEASES}/namespaces/{self.namespace}/leases/{LEASE_NAME}",
                                     headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                import orjson

                lease = orjson.loads(resp.read())
        except OSError:
            return ""
        spec = lease.get("spec") or {}
        held_for = float(spec.get("leaseDurationSeconds") or 0)
        renewed = spec.get("renewTime") or ""
        if renewed and held_for:
            from datetime import datetime

            at = datetime.fromisoformat(renewed.replace("Z", "+00:00")).timestamp()
            if time.time() - at > held_for:
                return ""
        return str(spec.get("holderIdentity") or "")

    def log_tail(self, name: str, lines: int = 12) -> str:
        try:
            text = self.log(name).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


# -- the world --------------------------------------------------------------------------------


@dataclass(slots=True)
class Counters:
    jobs: itertools.count[int] = field(default_factory=itertools.count)
    gangs: itertools.count[int] = field(default_factory=itertools.count)
    replacements: itertools.count[int] = field(default_factory=itertools.count)


class World:
    """The running cluster, workload and scheduler processes the faults act on."""

    def __init__(self, *, kube: KubeClient, sandbox: SandboxState, namespace: str, nodes: list[str],
                 gpus_per_node: int, queues: dict[str, dict[str, Any]], schedulers: Schedulers,
                 recorder: Recorder, scheduler_name: str, pool: str, workdir: Path,
                 gang_timeout: float, group_apis: tuple[str, ...] = (XK8S_API,), upstream_every: int = 2) -> None:
        self.kube = kube
        self.sandbox = sandbox
        self.namespace = namespace
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.queues = queues
        self.schedulers = schedulers
        self.recorder = recorder
        self.scheduler_name = scheduler_name
        self.pool = pool
        self.workdir = workdir
        self.gang_timeout = gang_timeout
        #: the PodGroup APIs the cluster serves (Kubernetes' own from 1.36, when enabled)
        self.group_apis = group_apis
        #: every n-th gang is written in Kubernetes' own API (0: none)
        self.upstream_every = upstream_every
        #: gangs submitted in each PodGroup API, over the whole run
        self.gangs_by_api: dict[str, int] = {}
        self.jobs: dict[str, Job] = {}
        self._count = Counters()
        self._supervisor: asyncio.Task[None] | None = None
        self._controller: asyncio.Task[None] | None = None
        #: undone by the runner once the cluster recovered from the fault that added them
        self.after_recovery: list[Callable[[], Awaitable[None]]] = []
        #: member pods the job controller created again, and the errors it met
        self.replaced = 0
        self.controller_errors: list[str] = []

    def control_plane(self) -> Sandbox:
        """The sandbox as a :class:`~batchsched.sandbox.cluster.Sandbox`, to stop and start
        one of its components."""
        from batchsched.sandbox.cluster import Sandbox

        return Sandbox(self.sandbox.name, root=Path(self.sandbox.dir).parent)

    @property
    def team_queues(self) -> list[str]:
        return [q for q, spec in self.queues.items() if spec.get("parent")]

    # -- the workload ---------------------------------------------------------------------

    def pod_body(self, job: Job, pod: str, member: str) -> dict[str, Any]:
        requests: dict[str, str] = {"cpu": "100m", "memory": "128Mi"}
        limits: dict[str, str] = {}
        annotations: dict[str, str] = {}
        if job.share is not None:
            annotations[SHARE_ANNOTATION] = str(job.share)
        elif job.gpu:
            requests[GPU] = limits[GPU] = str(job.gpu)
        labels = {WORLD_LABEL: self.namespace, JOB_LABEL: job.name, MEMBER_LABEL: member}
        if job.gang and job.api == XK8S_API:
            labels[GROUP_LABEL] = job.name
        if job.queue:
            labels[QUEUE_LABEL] = job.queue
        spec: dict[str, Any] = {
            "schedulerName": self.scheduler_name,
            "nodeSelector": {SANDBOX_LABEL: self.pool},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "trainer:latest",
                            "resources": {"requests": requests, **({"limits": limits} if limits else {})}}],
        }
        if job.priority:
            spec["priorityClassName"] = job.priority
        if job.gang and job.api == K8S_API:
            spec["schedulingGroup"] = {"podGroupName": job.name}
        if job.nodes:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": list(job.nodes)}]}]}}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "labels": labels, "annotations": annotations}, "spec": spec}

    def group_body(self, job: Job, *, min_member: int | None = None) -> dict[str, Any]:
        """The gang's PodGroup in its API. Kubernetes' own has no schedule timeout: the
        replicas' ``gang.defaultScheduleTimeoutSeconds`` is the world's."""
        labels = {WORLD_LABEL: self.namespace}
        if job.queue:
            labels[QUEUE_LABEL] = job.queue
        spec: dict[str, Any] = {"minMember": min_member or job.min_member,
                                "scheduleTimeoutSeconds": int(self.gang_timeout)}
        if job.api == K8S_API:
            spec = {"schedulingPolicy": {"gang": {"minCount": min_member or job.min_member}}}
            if job.priority:
                spec["priorityClassName"] = job.priority
        return {"apiVersion": GROUP_APIS[job.api].removeprefix("/apis/"), "kind": "PodGroup",
                "metadata": {"name": job.name, "namespace": self.namespace, "labels": labels}, "spec": spec}

    def group_path(self, job: Job) -> str:
        """The collection the gang's PodGroup is in."""
        return podgroups_path(job.api, self.namespace)

    def next_gang_api(self) -> str:
        """The API of the next gang: every :attr:`upstream_every`-th is Kubernetes' own when
        the cluster serves it, the others scheduler-plugins'."""
        n = next(self._count.gangs)
        if K8S_API in self.group_apis and self.upstream_every and n % self.upstream_every == self.upstream_every - 1:
            return K8S_API
        return XK8S_API

    async def submit(self, *, members: int, min_member: int | None = None, gpu: int = 1, share: float | None = None,
                     queue: str | None = None, priority: str | None = None, name: str | None = None,
                     nodes: tuple[str, ...] = (), api: str | None = None) -> Job:
        """One gang (``members > 1``: a PodGroup and its pods) or one single pod; ``nodes``,
        when given, are the only nodes its pods may go to; ``api``: the gang's PodGroup API
        (default: :meth:`next_gang_api`)."""
        name = name or f"j{next(self._count.jobs):04d}"
        pods = [f"{name}-{i}" for i in range(members)] if members > 1 else [name]
        job = Job(name=name, namespace=self.namespace, members=members, min_member=min_member or members,
                  gpu=gpu, share=share, queue=queue, priority=priority, pods=pods, nodes=nodes)
        if job.gang:
            job.api = api or self.next_gang_api()
            self.gangs_by_api[job.api] = self.gangs_by_api.get(job.api, 0) + 1
        self.jobs[name] = job
        if job.gang:
            await retrying(lambda: self.kube.create(self.group_path(job), self.group_body(job)))
        await asyncio.gather(*(self._create_pod(job, pod, pod) for pod in pods))
        return job

    async def _create_pod(self, job: Job, pod: str, member: str) -> None:
        body = self.pod_body(job, pod, member)
        await retrying(lambda: self.kube.create(f"/api/v1/namespaces/{self.namespace}/pods", body))

    async def replace_member(self, job: Job, pod: str) -> str:
        """Create a new pod for the member ``pod`` played (as a job controller does when a
        member's pod is gone); the new pod's name, now in ``job.pods``."""
        member = self.recorder.member_of(pod)
        new = f"{member}-r{next(self._count.replacements)}"
        await self._create_pod(job, new, member)
        job.pods[job.pods.index(pod)] = new
        return new

    async def retire(self, job: Job) -> None:
        """Delete a job: its pods and its PodGroup (the work is done)."""
        self.recorder.retire(job.name)
        ns = self.namespace
        for pod in job.pods:
            with contextlib.suppress(NotFoundError):
                await retrying(lambda pod=pod: self.kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod}",  # type: ignore[misc]
                                                                gracePeriodSeconds=0))
        if job.gang:
            with contextlib.suppress(NotFoundError):
                await retrying(lambda: self.kube.delete(f"{self.group_path(job)}/{job.name}"))
        self.jobs.pop(job.name, None)

    async def wait_bound(self, job: Job, timeout: float) -> None:
        """Every pod of ``job`` bound (raises :class:`WorldError` on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            bound = self.recorder.bound_now()
            missing = [p for p in job.pods if p not in bound]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise WorldError(f"{len(missing)} of {len(job.pods)} pods of {job.name} not bound after {timeout:.0f} s")
            await asyncio.sleep(0.2)

    def free_cards(self) -> dict[str, int]:
        """Whole GPU cards free now on each open node of the pool (by the recorder)."""
        from perf.chaos.checks import free_cards

        with self.recorder.locked() as mirror:
            return free_cards(mirror)

    def queue_room(self) -> dict[str, float]:
        """Cards each team queue may still take within its nominal quota (by the recorder)."""
        from perf.chaos.checks import cards_used

        with self.recorder.locked() as m:
            used = cards_used(m)
        room = {}
        for q in self.team_queues:
            nominal = sum(float(r.get("nominal", 0)) for r in self.queues[q].get("resources") or [])
            room[q] = nominal - used.get(q, 0.0)
        return room

    async def make_room(self, cards: int, *, queue: str | None = None, timeout: float = 120.0) -> int:
        """Retire the oldest bound jobs until ``cards`` whole cards are free in the pool and
        within the nominal quota of ``queue`` (of each team queue, split evenly, when None);
        returns the cards free. Waits for the retired pods to be gone."""
        deadline = time.monotonic() + timeout
        while True:
            free = sum(self.free_cards().values())
            room = self.queue_room()
            wanted = {queue: cards} if queue else {q: cards / len(room) for q in room}
            short = [q for q, need in wanted.items() if room.get(q, 0.0) < need]
            if free >= cards and not short:
                return free
            if time.monotonic() > deadline:
                return free
            bound = self.recorder.bound_now()
            candidates = [j for j in self.jobs.values() if any(p in bound for p in j.pods)]
            preferred = [j for j in candidates if j.queue in short] or candidates
            if not preferred:
                await asyncio.sleep(0.5)
                continue
            await self.retire(preferred[0])
            await asyncio.sleep(0.3)

    # -- the job controller -------------------------------------------------------------

    async def replace_lost(self) -> int:
        """Play the job controller once: a member pod of a live job that is gone (deleted,
        evicted, finished) gets a new pod. Returns how many were created."""
        made = 0
        with self.recorder.locked() as m:
            latest = {}
            for rec in m.pods.values():
                latest.setdefault(rec.name, rec)
                if rec.gone is None:
                    latest[rec.name] = rec
            gone = [(job, pod) for job in self.jobs.values() if job.name not in m.retired
                    for pod in job.pods if pod in latest and latest[pod].gone is not None]
        for job, pod in gone:
            await self.replace_member(job, pod)
            made += 1
        self.replaced += made
        return made

    def start_job_controller(self, interval: float = 1.0) -> None:
        if self._controller is not None:
            return

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.replace_lost()
                except KubeError as exc:  # the apiserver may be away: try again
                    self.controller_errors.append(str(exc))

        self._controller = asyncio.get_running_loop().create_task(loop())

    async def stop_job_controller(self) -> None:
        if self._controller is not None:
            self._controller.cancel()
            with contextlib.suppress(BaseException):
                await self._controller
            self._controller = None

    # -- judging --------------------------------------------------------------------------

    async def verdict(self) -> Verdict:
        """The checks now, with everything sampled since the world opened."""
        return self.recorder.verdict()

    async def recovered(self, timeout: float, *, quiet: float = 3.0) -> float:
        """Seconds until the cluster has settled: no pod that fits waits (by the harness's
        conservative reckoning), every waiting pod was told why, nothing is partly bound,
        and no bind or unbind happened for ``quiet`` seconds. Raises on timeout."""
        from perf.chaos.checks import settled

        start = time.monotonic()
        while True:
            with self.recorder.locked() as mirror:
                reasons = settled(mirror, now=time.time(), quiet=quiet, jobs=self.jobs)
            if not reasons:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise WorldError(f"not recovered after {timeout:.0f} s: {'; '.join(reasons[:3])}")
            await asyncio.sleep(0.25)

    # -- scheduler supervision -------------------------------------------------------------

    def start_supervisor(self) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(0.5)
                await asyncio.get_running_loop().run_in_executor(None, self.schedulers.supervise)

        self._supervisor = asyncio.get_running_loop().create_task(loop())

    async def stop_supervisor(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(BaseException):
                await self._supervisor


async def retrying(call: Callable[[], Awaitable[Any]], *, attempts: int = 60, delay: float = 0.5) -> Any:
    """``call`` again while the apiserver is away (a fault may have stopped it); a conflict
    on create means an earlier attempt landed."""
    for attempt in range(attempts):
        try:
            return await call()
        except ConflictError:
            return None
        except NotFoundError:
            raise
        except KubeError as exc:
            if attempt == attempts - 1 or exc.status not in (0, 429, 500, 502, 503, 504):
                raise
            await asyncio.sleep(delay)
    return None


async def _default_account(kube: KubeClient, namespace: str, timeout: float = 120.0) -> None:
    """Wait for the namespace's ``default`` ServiceAccount: until the controller manager
    made it, the apiserver refuses every pod created there."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return
        except NotFoundError:
            if time.monotonic() > deadline:
                raise WorldError(f"namespace {namespace} got no default ServiceAccount in {timeout:.0f} s") from None
            await asyncio.sleep(0.1)


def team_queues(namespace: str, total_gpus: int) -> dict[str, dict[str, Any]]:
    """A cohort root and two teams: each guaranteed half the GPUs, allowed to borrow a
    quarter more; team b lends at most half of its own."""
    half = total_gpus // 2
    return {
        f"{namespace}": {},
        f"{namespace}-a": {"parent": namespace, "weight": 1,
                           "resources": [{"name": QUOTA_RESOURCE, "nominal": half, "borrowingLimit": max(1, total_gpus // 4)}],
                           "preemption": {"withinQueue": "LowerPriority", "reclaimWithinCohort": "Any"}},
        f"{namespace}-b": {"parent": namespace, "weight": 1,
                           "resources": [{"name": QUOTA_RESOURCE, "nominal": total_gpus - half,
                                          "borrowingLimit": max(1, total_gpus // 4), "lendingLimit": max(1, (total_gpus - half) // 2)}],
                           "preemption": {"withinQueue": "LowerPriority", "reclaimWithinCohort": "Any"}},
    }


async def served_group_apis(kube: KubeClient, namespace: str) -> tuple[str, ...]:
    """The PodGroup APIs of :data:`~perf.chaos.checks.GROUP_APIS` the cluster serves
    (Kubernetes' own needs 1.36+ with its feature gates; scheduler-plugins' needs its CRD)."""
    served = []
    for api in GROUP_APIS:
        try:
            await kube.list(podgroups_path(api, namespace))
        except NotFoundError:
            continue
        served.append(api)
    return tuple(served)


def _with_gang_timeout(config: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
    """The replicas' configuration with the world's gang timeout as the default (what a
    Kubernetes PodGroup, which has no timeout of its own, waits), unless it sets one."""
    doc = dict(config or {})
    doc["gang"] = {"defaultScheduleTimeoutSeconds": timeout, **(doc.get("gang") or {})}
    return doc


def queue_body(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": name, "labels": {WORLD_LABEL: namespace}}, "spec": spec}


@contextlib.asynccontextmanager
async def open_world(sandbox: SandboxState, *, workdir: Path, nodes: int = 8, gpus_per_node: int = 8,
                     namespace: str | None = None, kubeconfig: str | None = None, gang_timeout: float = 20.0,
                     scheduler_config: dict[str, Any] | None = None, settle: float = 0.0,
                     upstream_every: int = 2) -> AsyncIterator[World]:
    """A world in ``sandbox``: namespace, nodes, queues, recorder and proxy, all removed on exit.

    ``kubeconfig`` is the one replicas use (default: the sandbox's admin kubeconfig). Every
    ``upstream_every``-th gang is written in Kubernetes' own PodGroup API when the cluster
    serves it (0: none), the others in scheduler-plugins'."""
    from perf.chaos.proxy import Proxy

    namespace = namespace or f"chaos-{uuid.uuid4().hex[:6]}"
    workdir.mkdir(parents=True, exist_ok=True)
    kube = await KubeClient.connect(sandbox.kubeconfig, max_connections=96)
    scheduler_name = f"batchsched-{namespace}"
    node_names: list[str] = []
    queues = team_queues(namespace, nodes * gpus_per_node)
    made_queues: list[str] = []
    recorder: Recorder | None = None
    proxy: Proxy | None = None
    schedulers: Schedulers | None = None
    world: World | None = None
    try:
        await kube.create("/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {WORLD_LABEL: namespace}}})
        await _default_account(kube, namespace)
        await grant_lease_namespace(kube, namespace)  # the replicas keep their Lease here
        apis = await served_group_apis(kube, namespace)
        node_names = await create_nodes(kube, [NodeShape(count=nodes, prefix=namespace, gpus=gpus_per_node,
                                                         labels={WORLD_LABEL: namespace})])
        await wait_nodes_ready(kube, node_names, timeout=max(120.0, nodes * 0.2))
        for name, spec in queues.items():
            await kube.create(QUEUES, queue_body(namespace, name, spec))
            made_queues.append(name)
        recorder = Recorder(sandbox.kubeconfig, namespace=namespace, pool=namespace,
                             gpus_per_node=gpus_per_node, group_apis=apis)
        recorder.start()
        proxy = Proxy(sandbox, kubeconfig=kubeconfig or sandbox.kubeconfig, workdir=workdir)
        proxy.start()
        schedulers = Schedulers(kubeconfig=kubeconfig or sandbox.kubeconfig, namespace=namespace,
                                scheduler_name=scheduler_name, workdir=workdir, proxy=proxy,
                                base_config=_with_gang_timeout(scheduler_config, gang_timeout))
        world = World(kube=kube, sandbox=sandbox, namespace=namespace, nodes=node_names, gpus_per_node=gpus_per_node,
                      queues=queues, schedulers=schedulers, recorder=recorder, scheduler_name=scheduler_name,
                      pool=namespace, workdir=workdir, gang_timeout=gang_timeout, group_apis=apis,
                      upstream_every=upstream_every)
        recorder.jobs = world.jobs
        world.start_supervisor()
        yield world
    finally:
        if world is not None:
            await world.stop_job_controller()
            await world.stop_supervisor()
        if schedulers is not None:
            await asyncio.get_running_loop().run_in_executor(None, schedulers.stop_all)
        if proxy is not None:
            proxy.stop()
        if recorder is not None:
            recorder.stop()
        for name in made_queues:
            with contextlib.suppress(KubeError):
                await kube.delete(f"{QUEUES}/{name}")
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/namespaces/{namespace}", gracePeriodSeconds=0)
        with contextlib.suppress(KubeError):
            await delete_nodes(kube, node_names)
        await kube.close()

__all__ = ["Fault", "Injected", "Job", "Recorder", "Schedulers", "World", "WorldError", "open_world", "retrying"]
