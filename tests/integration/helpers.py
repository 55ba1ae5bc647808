"""Helpers for integration tests: run batchsched against the sandbox (in this process or
as a process of its own), create pods and PodGroups, wait, inspect.

batchsched is started with the ``sandbox`` fixture, never with a kubeconfig path: it then
runs under its own ServiceAccount, with exactly the rights of ``manifests/base/rbac.yaml``
(:func:`scheduler_kubeconfig`), while the test's ``kube`` client stays admin."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

from batchsched.app import Scheduler
from batchsched.config import parse_config
from batchsched.core.quantity import to_units
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ExpiredError, NotFoundError
from tests.conftest import IN_CI, SCHEDULER_USER

T = TypeVar("T")


def unavailable(message: str) -> NoReturn:
    """A test whose real parts cannot be had: it fails under CI=true, is skipped elsewhere."""
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def built(build_it: Callable[[], T], what: str) -> T:
    """``build_it()`` (a tool built from its pinned Go module), or :func:`unavailable`."""
    from batchsched.sandbox.build import BuildError

    try:
        return build_it()
    except (BuildError, OSError) as exc:
        unavailable(f"{what} could not be built: {exc}")


@contextlib.contextmanager
def started(tool: T, what: str) -> Iterator[T]:
    """A tool process (:class:`batchsched.sandbox.tool.ToolProcess`) started for the
    tests in the ``with`` block and stopped after them, or :func:`unavailable`."""
    try:
        tool.start()  # type: ignore[attr-defined]
    except Exception as exc:  # any failure to start is reported the same way
        unavailable(f"{what} could not start: {exc}")
    try:
        yield tool
    finally:
        tool.stop()  # type: ignore[attr-defined]


async def wait_for(check: Callable[[], Awaitable[Any]], timeout: float = 30.0, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


def config(namespace: str, **overrides: Any) -> Any:
    data: dict[str, Any] = {
        "leaderElection": {"namespace": namespace, "leaseName": "batchsched",
                           "leaseDurationSeconds": 4, "renewDeadlineSeconds": 3, "retryPeriodSeconds": 0.5},
        "metricsAddress": "127.0.0.1:0",
        "cycle": {"retryUnschedulableSeconds": 30},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_config(data)


def scheduler_kubeconfig(sandbox: Any) -> str:
    """The kubeconfig batchsched runs with in the sandbox: its ServiceAccount's token."""
    if isinstance(sandbox, (str, Path)):
        raise TypeError("pass the sandbox fixture: batchsched runs under its own ServiceAccount, "
                        "not with the admin kubeconfig")
    return str(sandbox.kubeconfigs[SCHEDULER_USER])


@contextlib.asynccontextmanager
async def running_scheduler(sandbox: Any, namespace: str, *, kubeconfig: str | None = None,
                            **overrides: Any) -> AsyncIterator[Scheduler]:
    """batchsched in this process, leading, under its ServiceAccount; ``overrides`` are
    configuration keys (see :func:`config`); ``kubeconfig``: its ServiceAccount's, pointed
    elsewhere (through a proxy)."""
    client = await KubeClient.connect(kubeconfig or scheduler_kubeconfig(sandbox))
    sched = Scheduler(client, config(namespace, **overrides))
    task = asyncio.get_running_loop().create_task(sched.run())
    try:
        await wait_for(lambda: _ready(sched, task), timeout=60)
        yield sched
    finally:
        sched.stop()
        await asyncio.wait_for(task, 30)
        await client.close()


def start_process(sandbox: Any, config_file: Path, log: Path) -> subprocess.Popen[bytes]:
    """``python -m batchsched run`` as a process of its own (to be killed and restarted),
    under its ServiceAccount, its output appended to ``log``."""
    kubeconfig = scheduler_kubeconfig(sandbox)
    return subprocess.Popen(
        [sys.executable, "-m", "batchsched", "run", "--kubeconfig", kubeconfig, "--config", str(config_file)],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT, env={**os.environ, "BATCHSCHED_LOG_LEVEL": "INFO"},
    )


@contextlib.contextmanager
def running_kube_scheduler(sandbox: Any, workdir: Path, *, name: str, scheduler_name: str) -> Iterator[str]:
    """The sandbox's kube-scheduler, started as perf starts it, answering pods whose
    ``schedulerName`` is ``scheduler_name`` (so it never meets batchsched's pods); yields
    that name once its readiness endpoint answers, stops it after the block. ``name``
    tells its log and workdir apart from another test's."""
    from perf.peers import PEERS

    peer = dataclasses.replace(PEERS["kube-scheduler"], name=name, scheduler_name=scheduler_name)
    running = peer.start(sandbox.kubeconfig, workdir)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its own self-signed serving certificate
    try:
        deadline = time.monotonic() + 60
        while not _answers(running.ready_url, context):
            if not running.alive() or time.monotonic() > deadline:
                raise AssertionError(f"kube-scheduler was not ready:\n{running.log_tail()}")
            time.sleep(0.2)
        yield scheduler_name
    finally:
        running.stop()


def _answers(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


async def _ready(sched: Scheduler, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()  # raises what made it stop
        raise AssertionError("the scheduler stopped before it was ready")
    return sched.ready and sched.leading.is_set()


def pod_body(name: str, *, gpu: int = 0, cpu: str = "100m", memory: str = "128Mi",
             scheduler: str = "batchsched", **extra: Any) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpu:
        requests["nvidia.com/gpu"] = str(gpu)
        limits["nvidia.com/gpu"] = str(gpu)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "trainer:latest",
                        "resources": {"requests": requests, **({"limits": limits} if limits else {})}}],
    }
    spec.update(extra.pop("spec", {}))
    meta: dict[str, Any] = {"name": name, **extra.pop("metadata", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


async def create_pods(kube: KubeClient, namespace: str, bodies: list[dict[str, Any]], concurrency: int = 32) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)

    await asyncio.gather(*(one(b) for b in bodies))


async def list_pods(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
    return items


async def events_for(kube: KubeClient, namespace: str, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    items, _ = await kube.list(
        f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={name}"
    )
    return [e for e in items if reason is None or e.get("reason") == reason]


async def describe(sandbox: Any, namespace: str, kind: str, name: str) -> str:
    """What ``kubectl describe KIND NAME`` prints (the sandbox's own kubectl, admin), Events
    included: kubectl finds an object's Events by its kind, name, namespace and uid."""
    from batchsched.sandbox import build

    cmd = [str(build.ensure_binaries().kubectl), "--kubeconfig", str(sandbox.kubeconfig),
           "describe", kind, name, "-n", namespace]
    out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


async def assert_no_overcommit(kube: KubeClient) -> dict[str, dict[str, int]]:
    """Every node's bound, unfinished pods fit in its allocatable; returns usage per node."""
    nodes, _ = await kube.list("/api/v1/nodes")
    pods, _ = await kube.list("/api/v1/pods")
    alloc = {n["metadata"]["name"]: {k: to_units(k, v) for k, v in n["status"]["allocatable"].items()} for n in nodes}
    used: dict[str, dict[str, int]] = {name: {} for name in alloc}
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node or p["status"].get("phase") in ("Succeeded", "Failed") or node not in used:
            continue
        u = used[node]
        u["pods"] = u.get("pods", 0) + 1
        for c in p["spec"]["containers"]:
            for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
                u[k] = u.get(k, 0) + to_units(k, v)
    for node, u in used.items():
        for k, v in u.items():
            assert v <= alloc[node].get(k, 0), f"node {node} over-committed on {k}: {v} > {alloc[node].get(k, 0)}"
    return used


# -- PodGroups ------------------------------------------------------------------------------

XK8S = "/apis/scheduling.x-k8s.io/v1alpha1"
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"


async def create_group(kube: KubeClient, api: str, namespace: str, name: str, spec: dict[str, Any],
                       owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """A PodGroup of ``api`` (:data:`XK8S` or :data:`VOLCANO`)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    kind = "scheduling.x-k8s.io/v1alpha1" if api == XK8S else "scheduling.volcano.sh/v1beta1"
    return await kube.create(f"{api}/namespaces/{namespace}/podgroups",
                             {"apiVersion": kind, "kind": "PodGroup", "metadata": meta, "spec": spec})


async def get_group(kube: KubeClient, api: str, namespace: str, name: str) -> dict[str, Any]:
    return await kube.get(f"{api}/namespaces/{namespace}/podgroups/{name}")


def condition(group: dict[str, Any]) -> dict[str, Any]:
    """A PodGroup's one status condition (empty when it has none)."""
    [cond] = (group.get("status") or {}).get("conditions") or [{}]
    return cond


def bound(pods: list[dict[str, Any]], prefix: str) -> list[str]:
    """Names of the pods of ``prefix`` bound to a node."""
    return [p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")]


async def bound_at(kube: KubeClient, namespace: str, prefix: str, count: int) -> float:
    """When (wall clock) ``count`` pods of ``prefix`` were first seen bound (waits up to 150 s)."""
    async def enough() -> bool:
        return len(bound(await list_pods(kube, namespace), prefix)) >= count
    await wait_for(enough, timeout=150, interval=0.25)
    return time.time()


VOLCANO_CRD = Path(__file__).parent / "crds" / "volcano-podgroup.yaml"


async def owner(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """A stand-in for the job object (the PyTorchJob / RayCluster CRDs are not installed)."""
    cm = await kube.create(f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": name}})
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": cm["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


QUEUES = "/apis/batchsched.io/v1alpha1/queues"


@contextlib.asynccontextmanager
async def queues(kube: KubeClient, *specs: tuple[str, dict[str, Any]]) -> AsyncIterator[None]:
    """Queues (name, spec) made for the test, deleted after it."""
    made: list[str] = []
    try:
        for name, spec in specs:
            await kube.create(QUEUES, {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue",
                                       "metadata": {"name": name}, "spec": spec})
            made.append(name)
        yield
    finally:
        for name in reversed(made):
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"{QUEUES}/{name}")


# -- a large gang against a stream of small pods (the reservation tests) ------------------------


def small_gpu_pod(name: str, seconds: int, *, deadline: bool, pool: str | None = None) -> dict[str, Any]:
    """A 1-GPU pod that kwok completes after ``seconds`` and that declares that run time:
    as ``activeDeadlineSeconds`` (``deadline``) or as ``batchsched.io/expected-runtime``."""
    annotations = {"batchsched.io/sim-duration": f"{seconds}s"}
    spec: dict[str, Any] = {"nodeSelector": {"pool": pool}} if pool else {}
    if deadline:
        spec["activeDeadlineSeconds"] = seconds
    else:
        annotations["batchsched.io/expected-runtime"] = f"{seconds}s"
    return pod_body(name, gpu=1, metadata={"annotations": annotations}, spec=spec)


@contextlib.asynccontextmanager
async def arriving(kube: KubeClient, namespace: str, make: Callable[[int], dict[str, Any]],
                   every: float) -> AsyncIterator[None]:
    """A new pod ``make(i)`` every ``every`` seconds while the block runs."""

    async def stream() -> None:
        for i in range(1_000_000):
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", make(i))
            await asyncio.sleep(every)

    task = asyncio.get_running_loop().create_task(stream())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def gang_wait(kube: KubeClient, namespace: str, group: str, members: list[str], *,
                    since: float, timeout: float, late: str, what: str) -> tuple[float, dict[str, list[tuple[str, str]]]]:
    """Wait until every member of the scheduler-plugins PodGroup ``group`` is bound; return
    how long it waited since ``since`` (monotonic) and what it was told meanwhile, in order,
    each (reason, message) once: ``told["pod"]`` the members' ``PodScheduled=False``
    conditions, ``told["group"]`` the PodGroup's condition while not scheduled. Prints the
    wait and how many pods named ``late...`` started meanwhile (also when it times out)."""
    told: dict[str, list[tuple[str, str]]] = {"pod": [], "group": []}

    def note(who: str, c: dict[str, Any]) -> None:
        said = (c.get("reason", ""), c.get("message", ""))
        if said not in told[who]:
            told[who].append(said)

    async def bound() -> bool:
        pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
        for name in members:
            for c in pods[name]["status"].get("conditions") or []:
                if c.get("type") == "PodScheduled" and c.get("status") == "False":
                    note("pod", c)
        cond = condition(await get_group(kube, XK8S, namespace, group))
        if cond.get("reason") and cond.get("status") == "False":
            note("group", cond)
        return all(pods[n]["spec"].get("nodeName") for n in members)

    try:
        await wait_for(bound, timeout=timeout, interval=0.5)
    finally:
        wait = time.monotonic() - since
        started = sum(1 for p in await list_pods(kube, namespace)
                      if p["metadata"]["name"].startswith(late) and p["spec"].get("nodeName"))
        print(f"\n{what}: gang wait {wait:.1f} s (bound {timeout:g} s); {started} later small pods started meanwhile")
    return wait, told


class PodHistory:
    """Every version of every pod of a namespace from now on, in the order the apiserver
    sent them; :meth:`states` replays them as the namespace's pods after each change."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.initial: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PodHistory:
        self.initial, rv = await self.kube.list(self.path)

        async def run(rv: str) -> None:
            while True:
                try:
                    async for kind, obj in self.kube.watch(self.path, rv, timeout_seconds=300):
                        rv = obj.get("metadata", {}).get("resourceVersion") or rv
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            self.events.append((kind, obj))
                except ExpiredError:
                    raise AssertionError("the pod history lost events (410 Gone)") from None
                except Exception:
                    await asyncio.sleep(0.2)

        self.task = asyncio.get_running_loop().create_task(run(rv))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task

    def states(self) -> Iterator[list[dict[str, Any]]]:
        """The pods after each change seen."""
        current = {p["metadata"]["uid"]: p for p in self.initial}
        for kind, obj in self.events:
            if kind == "DELETED":
                current.pop(obj["metadata"]["uid"], None)
            else:
                current[obj["metadata"]["uid"]] = obj
            yield list(current.values())

    def versions(self, uid: str) -> list[dict[str, Any]]:
        return [obj for _, obj in self.events if obj["metadata"]["uid"] == uid]

    def disruption(self, uid: str) -> dict[str, Any] | None:
        """The DisruptionTarget condition the pod ``uid`` was given, if any."""
        for obj in self.versions(uid):
            for c in (obj.get("status") or {}).get("conditions") or []:
                if c.get("type") == "DisruptionTarget":
                    return dict(c)
        return None

    def deleted(self, uid: str) -> bool:
        return any(kind == "DELETED" and obj["metadata"]["uid"] == uid for kind, obj in self.events)


async def served(kube: KubeClient, verb: str, resource: str, subresource: str = "") -> int:
    """How many ``verb`` requests of ``resource`` (``subresource``) the apiserver has served
    so far, from every client (its ``apiserver_request_total``)."""
    from perf.live import apiserver_requests

    key = f"{verb} {resource}{'/' + subresource if subresource else ''}"
    return int((await apiserver_requests(kube)).get(key, {}).get("count", 0))
