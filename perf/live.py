"""One scheduler, one workload, one fresh control plane: the live measurement.

A run, in order:

1. bring up a fresh sandbox with the workload's nodes (apiserver flags: the union of the
   workload's peers', so every peer of a workload sees the same control plane);
2. start a watch on the run's namespace, then create the PodGroups and every pod that
   exists "before" (the creation rate is never what is measured);
3. start the scheduler process (time zero), and the stream of "stream" pods if any; once
   every "before" pod is bound, the PodGroups and pods that arrive "after" (they find the
   cluster full and fit only by preempting);
4. wait until the watch has seen every pod bound (``spec.nodeName`` set), the scheduler
   exits, or the workload's timeout passes; then watch ``settle_seconds`` more;
5. read CPU seconds and peak RSS of the scheduler, the apiserver and etcd from ``/proc``;
   scrape batchsched's ``/metrics``; check that no gang is partly bound (counting the
   members deleted, by preemption, as the watch saw them go), that each gang with a
   topology constraint sits inside one domain of it, and that no node holds more GPUs
   than it has; stop everything.

Throughput is reported two ways: over the bind window (first to last bind, the
scheduler's steady rate) and end to end (every pod over the time from the scheduler's
start to the last bind, start-up included).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError
from perf import dra, procstat
from perf.peers import GANG_X_K8S, Peer, Running
from perf.workload import Expanded, NodeSpec, PodSpec

if TYPE_CHECKING:
    from batchsched.sandbox.cluster import SandboxState
    from batchsched.sandbox.nodes import NodeShape

NAMESPACE = "perf"
CREATE_CONCURRENCY = 64


class RunError(RuntimeError):
    """A run could not be carried out (the sandbox, a peer or the API failed)."""


class StartError(RunError):
    """The control plane for a run could not start (a build or start-up failure)."""


# -- watching binds ---------------------------------------------------------------------


class BindWatch:
    """Records when each pod of a namespace is first seen bound, and when it is first seen
    going (a deletion timestamp, or deleted), from a list + watch of every pod version."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        #: pod name -> (monotonic time first seen bound, node)
        self.bound: dict[str, tuple[float, str]] = {}
        #: pod name -> monotonic time first seen deleted or being deleted
        self.deleted: dict[str, float] = {}
        self.synced = asyncio.Event()
        self.changed = asyncio.Event()
        self.errors = 0

    def _see(self, obj: dict[str, Any], now: float) -> None:
        node = (obj.get("spec") or {}).get("nodeName")
        if node:
            name = obj["metadata"]["name"]
            if name not in self.bound:
                self.bound[name] = (now, node)
                self.changed.set()

    async def run(self) -> None:
        rv = ""
        while True:
            if not rv:
                items, rv = await self.client.list(self.path)
                now = time.monotonic()
                for obj in items:
                    self._see(obj, now)
                self.synced.set()
            try:
                async for etype, obj in self.client.watch(self.path, rv, timeout_seconds=600):
                    now = time.monotonic()
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = new_rv
                    if etype in ("ADDED", "MODIFIED", "DELETED"):
                        self._see(obj, now)
                    if etype == "DELETED" or (obj.get("metadata") or {}).get("deletionTimestamp"):
                        self.deleted.setdefault(obj["metadata"]["name"], now)
            except KubeError:
                self.errors += 1
                rv = ""  # relist: binds seen again keep their first time
                await asyncio.sleep(0.2)


# -- creating the workload --------------------------------------------------------------


async def check_podgroup_crd(client: KubeClient) -> None:
    """The x-k8s PodGroup CRD comes from manifests/base/ (the sandbox applies it at start)."""
    try:
        await client.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/podgroups.scheduling.x-k8s.io")
    except NotFoundError:
        raise RunError("the scheduling.x-k8s.io PodGroup CRD is missing from manifests/base/") from None


async def create_all(client: KubeClient, items: Iterable[tuple[str, dict[str, Any]]], concurrency: int = CREATE_CONCURRENCY) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(path: str, body: dict[str, Any]) -> None:
        async with sem:
            for attempt in range(5):
                try:
                    await client.create(path, body)
                    return
                except ConflictError:
                    return
                except KubeError:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.2 * (attempt + 1))

    await asyncio.gather(*(one(p, b) for p, b in items))


# -- the run --------------------------------------------------------------------------------


def ready_timeout(nodes: int) -> float:
    """Seconds a sandbox of ``nodes`` nodes may take to bring them all Ready."""
    return max(120.0, nodes * 0.1)


def node_shape(nodes: int, node: NodeSpec) -> NodeShape:
    from batchsched.sandbox.nodes import NodeShape

    # a DRA node's GPUs are in its ResourceSlices (perf.dra), not in its allocatable
    return NodeShape(count=nodes, gpus=0 if node.dra else node.gpus, cpu=node.cpu, memory=node.memory, max_pods=node.max_pods,
                     nodes_per_rack=node.nodes_per_rack)


@contextlib.contextmanager
def fresh_sandbox(name: str, nodes: int, node: NodeSpec, apiserver_args: Iterable[str]) -> Iterator[SandboxState]:
    """A sandbox of ``nodes`` nodes shaped like ``node``, stopped on exit; StartError if it cannot start."""
    from batchsched.sandbox.cluster import Sandbox, SandboxError

    box = Sandbox(name)
    try:
        state = box.up(
            [node_shape(nodes, node)],
            apiserver_args=tuple(apiserver_args), ready_timeout=ready_timeout(nodes),
        )
    except (SandboxError, KubeError, OSError, TimeoutError) as exc:
        raise StartError(f"the sandbox did not start: {exc}") from exc
    try:
        yield state
    finally:
        box.down()


@dataclass(slots=True)
class RunConfig:
    peer: Peer
    workload: Expanded
    round: int
    apiserver_args: tuple[str, ...]
    workdir: Path
    sandbox_name: str
    timeout: float | None = None
    #: run the scheduler under cProfile (batchsched only; slows it down: not a measured run)
    profile: bool = False


@dataclass(slots=True)
class Measured:
    started: float = 0.0
    bound: dict[str, tuple[float, str]] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    stream_created: dict[str, float] = field(default_factory=dict)
    #: pods created after the cluster was filled -> when
    after_created: dict[str, float] = field(default_factory=dict)
    #: topology key -> node -> the node's value of that label
    domains: dict[str, dict[str, str]] = field(default_factory=dict)
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    #: a DRA workload's claims read back after the run (:func:`perf.dra.device_use`)
    devices: dict[str, Any] = field(default_factory=dict)


def run_once(cfg: RunConfig) -> dict[str, Any]:
    """One run on a fresh sandbox; the result as JSON-able data (``ok`` False on failure)."""
    from batchsched.sandbox.cluster import Sandbox, SandboxError

    ex = cfg.workload
    node = ex.workload.node
    box = Sandbox(cfg.sandbox_name)
    t_up = time.monotonic()
    try:
        state = box.up(
            [node_shape(ex.size.nodes, node)],
            apiserver_args=cfg.apiserver_args,
            ready_timeout=ready_timeout(ex.size.nodes),
        )
    except (SandboxError, KubeError, OSError, TimeoutError) as exc:
        raise StartError(f"the sandbox did not start: {exc}") from exc
    try:
        up_s = time.monotonic() - t_up
        procs = {p.name: p.pid for p in state.processes}
        try:
            m = asyncio.run(_measure(cfg, state.kubeconfig, procs))
        except (KubeError, TimeoutError) as exc:
            raise RunError(f"the run failed: {exc}") from exc
        m.timings["sandbox_up_s"] = up_s
    finally:
        box.down()
    return summarize(cfg, m)


async def _measure(cfg: RunConfig, kubeconfig: str, procs: dict[str, int]) -> Measured:
    ex = cfg.workload
    peer = cfg.peer
    m = Measured()
    client = await KubeClient.connect(kubeconfig, max_connections=CREATE_CONCURRENCY + 8)
    running: Running | None = None
    watch_task: asyncio.Task[None] | None = None
    stream_task: asyncio.Task[None] | None = None
    after_task: asyncio.Task[None] | None = None
    ready_task: asyncio.Task[None] | None = None
    try:
        if peer.gang_style == GANG_X_K8S and ex.gangs:
            await check_podgroup_crd(client)
        await client.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        watch = BindWatch(client, NAMESPACE)
        watch_task = asyncio.create_task(watch.run())
        await asyncio.wait_for(watch.synced.wait(), 60)
        t_create = time.monotonic()
        if ex.dra:
            m.devices["resourceslices"] = await dra.publish(client, ex.workload.node, extended=ex.extended)
            await create_all(client, dra.templates(ex, NAMESPACE))
        await create_all(client, peer.group_objects(ex, NAMESPACE, after=False))
        pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        first = [p for p in ex.pods if not p.stream and not p.after]
        await create_all(client, ((pod_path, peer.pod(p)) for p in first))
        templated = sum(1 for p in first if p.claim_template)
        if templated:
            # every claim made by kube-controller-manager before time zero: its speed is not
            # measured (the claims of extended-resource pods are the scheduler's to make)
            m.timings["claims_made_s"] = await dra.wait_claims(client, NAMESPACE, templated)
        m.timings["create_s"] = time.monotonic() - t_create

        windows = {
            name: procstat.Window(pid, started=time.monotonic())
            for name, pid in procs.items() if name in ("kube-apiserver", "etcd")
        }
        prof_path = cfg.workdir / f"{peer.name}.prof" if cfg.profile else None
        running = peer.start(kubeconfig, cfg.workdir, profile=prof_path)
        m.started = running.started
        ready_task = asyncio.create_task(_wait_ready(running, m))
        sched_window = procstat.Window(running.pid, start_cpu=0.0, started=running.started)
        stream = [p for p in ex.pods if p.stream]
        if stream:
            stream_task = asyncio.create_task(
                _stream(client, pod_path, peer, stream, ex.workload.stream_rate, m, watch)
            )
        if any(p.after for p in ex.pods):
            after_task = asyncio.create_task(_after(client, pod_path, peer, ex, m, watch))
        expected = ex.expected_bound
        timeout = cfg.timeout or ex.workload.timeout
        deadline = running.started + timeout
        settle = ex.workload.settle_seconds
        settle_until: float | None = None
        #: (monotonic, the scheduler's CPU seconds) at the first bind seen and once all are
        #: bound: its share of a core over the bind window
        at_first: tuple[float, float | None] | None = None
        at_all: tuple[float, float | None] | None = None
        #: the apiserver's requests at the first bind and once all are bound
        served: list[asyncio.Task[dict[str, dict[str, float]]]] = []
        while True:
            watch.changed.clear()
            if at_first is None and watch.bound:
                at_first = (time.monotonic(), procstat.cpu_seconds(running.pid))
                served.append(asyncio.create_task(apiserver_requests(client)))
            if at_all is None and len(watch.bound) >= expected:
                at_all = (time.monotonic(), procstat.cpu_seconds(running.pid))
                served.append(asyncio.create_task(apiserver_requests(client)))
            if not running.alive():
                m.error = f"{peer.name} exited with code {running.proc.returncode}: {running.log_tail()}"
                break
            if after_task is not None and after_task.done() and after_task.exception() is not None:
                m.error = f"creating the pods that arrive after failed: {after_task.exception()}"
                break
            now = time.monotonic()
            if len(watch.bound) >= expected:
                # everything a correct scheduler can bind is bound: watch a little longer
                # for binds that should not happen (parts of gangs that do not fit) and
                # for late evictions
                if settle_until is None:
                    settle_until = now + settle
                if now >= settle_until:
                    break
            elif now > deadline:
                m.error = f"{expected - len(watch.bound)} of {expected} pods not bound after {timeout:.0f} s"
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.changed.wait(), 0.1)
        now = time.monotonic()
        m.usage["scheduler"] = sched_window.end(now).to_json()
        if at_first is not None and at_all is not None and at_first[1] is not None and at_all[1] is not None \
                and at_all[0] > at_first[0]:
            used = at_all[1] - at_first[1]
            m.usage["scheduler_bind_window"] = {
                "cpu_seconds": round(used, 3), "cpu_percent": round(100 * used / (at_all[0] - at_first[0]), 1),
            }
        if len(served) == 2:
            before, after = await asyncio.gather(*served)
            if before and after:
                m.usage["apiserver_requests_bind_window"] = requests_between(before, after)
        for t in served:
            t.cancel()
        for name, w in windows.items():
            m.usage[name] = w.end(now).to_json()
        m.bound = dict(watch.bound)
        m.deleted = dict(watch.deleted)
        m.domains = await node_domains(client, {h.topology for h in ex.gang_heads.values() if h.topology})
        if ex.dra:
            m.devices.update(await dra.device_use(client, NAMESPACE, {p.name: p.gpus for p in ex.pods if p.extended}))
        if running.metrics_url and running.alive():
            m.metrics = await asyncio.get_running_loop().run_in_executor(None, scrape, running.metrics_url)
    finally:
        for task in (stream_task, after_task, watch_task, ready_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if running is not None:
            await asyncio.get_running_loop().run_in_executor(None, running.stop)
        await client.close()
    if cfg.profile:
        m.profile = profile_summary(cfg.workdir / f"{peer.name}.prof")
    return m


def profile_summary(path: Path, top: int = 30) -> dict[str, Any]:
    """The functions that took the most time, by own time and by cumulative time."""
    import pstats

    if not path.exists():
        return {"file": str(path), "error": "no profile written (the scheduler did not exit cleanly)"}
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]

    def rows(key: int) -> list[dict[str, Any]]:
        entries = sorted(stats.stats.items(), key=lambda kv: kv[1][key], reverse=True)[:top]  # type: ignore[attr-defined]
        return [
            {"function": f"{Path(f).name}:{line}({fn})", "calls": nc, "own_s": round(tt, 3), "cumulative_s": round(ct, 3)}
            for (f, line, fn), (_cc, nc, tt, ct, _callers) in entries
        ]

    return {"file": str(path), "total_s": round(total, 3), "by_own_time": rows(2), "by_cumulative_time": rows(3)}


async def _wait_ready(running: Running, m: Measured, interval: float = 0.02) -> None:
    """Record when the scheduler's /readyz first answers 200 (seconds from its start)."""
    ready = await wait_ready(running, interval)
    if ready is not None:
        m.timings["ready_s"] = ready


async def wait_ready(running: Running, interval: float = 0.02) -> float | None:
    """Seconds from the scheduler's start until its /readyz first answers 200 (None if it exits)."""
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    def probe() -> bool:
        try:
            with urllib.request.urlopen(running.ready_url, timeout=1, context=ctx) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    loop = asyncio.get_running_loop()
    while running.ready_url and running.alive():
        if await loop.run_in_executor(None, probe):
            return time.monotonic() - running.started
        await asyncio.sleep(interval)
    return None


async def _stream(
    client: KubeClient, path: str, peer: Peer, pods: list[PodSpec], rate: float, m: Measured, watch: BindWatch
) -> None:
    """Create ``pods`` at ``rate`` per second, from when the scheduler is ready (or first binds)."""
    while "ready_s" not in m.timings and not watch.bound:
        await asyncio.sleep(0.02)
    m.timings["stream_start_s"] = time.monotonic() - m.started
    created = m.stream_created
    start = time.monotonic()
    tasks = []
    for i, spec in enumerate(pods):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        created[spec.name] = time.monotonic()
        tasks.append(asyncio.create_task(create_all(client, [(path, peer.pod(spec))], concurrency=1)))
    await asyncio.gather(*tasks)


async def _after(client: KubeClient, path: str, peer: Peer, ex: Expanded, m: Measured, watch: BindWatch) -> None:
    """Once every "before" pod is bound (the cluster is full), create the PodGroups and
    pods that arrive after, as fast as the API takes them."""
    before = {p.name for p in ex.pods if not p.after and not p.stream}
    while not before <= watch.bound.keys():
        await asyncio.sleep(0.05)
    now = time.monotonic()
    m.timings["after_start_s"] = now - m.started
    await create_all(client, peer.group_objects(ex, NAMESPACE, after=True))
    after = [p for p in ex.pods if p.after]
    for spec in after:
        m.after_created[spec.name] = now
    await create_all(client, ((path, peer.pod(p)) for p in after))
    m.timings["after_created_s"] = time.monotonic() - m.started


async def node_domains(client: KubeClient, keys: set[str]) -> dict[str, dict[str, str]]:
    """key -> node name -> the node's label ``key`` (nodes without it left out)."""
    if not keys:
        return {}
    nodes, _ = await client.list("/api/v1/nodes")
    out: dict[str, dict[str, str]] = {k: {} for k in keys}
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        for key in keys:
            if key in labels:
                out[key][node["metadata"]["name"]] = labels[key]
    return out


#: the apiserver's figures per kind of request kept by :func:`apiserver_requests`
_REQUEST_FAMILIES = ("apiserver_request_total", "apiserver_request_duration_seconds")


async def apiserver_requests(client: KubeClient) -> dict[str, dict[str, float]]:
    """The apiserver's requests so far by ``VERB resource/subresource``: how many, and
    the seconds it spent serving them (its own side of each request, without the client's
    queueing). Empty if its ``/metrics`` cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = await client.text("/metrics")
    except KubeError:
        return {}
    wanted = "\n".join(line for line in text.splitlines()
                        if line.startswith(_REQUEST_FAMILIES) and "_bucket" not in line)
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(wanted):
        for s in fam.samples:
            labels = s.labels
            if labels.get("verb") in (None, "WATCH", "CONNECT"):
                continue
            sub = labels.get("subresource", "")
            key = f"{labels['verb']} {labels.get('resource', '')}{'/' + sub if sub else ''}"
            row = out.setdefault(key, {"count": 0.0, "seconds": 0.0})
            if s.name == "apiserver_request_total":
                row["count"] += s.value
            elif s.name == "apiserver_request_duration_seconds_sum":
                row["seconds"] += s.value
    return out


def requests_between(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    """What the apiserver served between two :func:`apiserver_requests`: per kind of request
    its count and mean seconds, the most numerous first."""
    rows = []
    for key, row in after.items():
        was = before.get(key, {"count": 0.0, "seconds": 0.0})
        n = row["count"] - was["count"]
        if n >= 1:
            rows.append((key, int(n), (row["seconds"] - was["seconds"]) / n))
    rows.sort(key=lambda r: -r[1])
    return {key: {"count": n, "mean_ms": round(1e3 * mean, 1)} for key, n, mean in rows}


def scrape(url: str) -> dict[str, float]:
    """batchsched's ``/metrics``: every ``batchsched_*`` sample, keyed by name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith("batchsched_") or s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


# -- summarizing -------------------------------------------------------------------------


def _timeline(times: list[float], points: int = 400) -> list[tuple[float, int]]:
    """(seconds since start, pods bound) at up to ``points`` steps."""
    if not times:
        return []
    step = max(1, len(times) // points)
    out = [(round(t, 4), i + 1) for i, t in enumerate(times) if i % step == 0]
    if out[-1][1] != len(times):
        out.append((round(times[-1], 4), len(times)))
    return out


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    return {
        "p50": round(v[len(v) // 2], 2),
        "p99": round(v[min(len(v) - 1, int(len(v) * 0.99))], 2),
        "max": round(v[-1], 2),
    }


def _dist(values: list[float]) -> dict[str, float] | None:
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3)} if values else None


def gang_figures(ex: Expanded, m: Measured, bound: dict[str, tuple[float, str]]) -> dict[str, Any]:
    """What the watch saw of each gang, per class: partly bound at the end (members seen
    deleted count as gone), preempted (a bound member deleted) and of those partly (some
    members still bound), spanning more than one domain of its topology key, and when its
    first and last member were bound (from the scheduler's start, or for gangs arriving
    after the cluster was filled, from their creation)."""
    by_name = {p.name: p for p in ex.pods}
    members: dict[str, list[str]] = {}
    for p in ex.pods:
        if p.gang:
            members.setdefault(p.gang, []).append(p.name)
    live = {n for n in bound if n not in m.deleted}
    lists: dict[str, dict[str, list[Any]]] = {}
    for gang, names in members.items():
        head = by_name[names[0]]
        c = lists.setdefault(head.klass, {k: [] for k in ("gangs", "partial", "preempted", "partly", "spanning",
                                                          "topology", "first", "last")})
        c["gangs"].append(gang)
        alive = [n for n in names if n in live]
        if 0 < len(alive) < head.min_count:
            c["partial"].append(gang)
        if any(n in m.deleted for n in names if n in bound):
            c["preempted"].append(gang)
            if alive:
                c["partly"].append(gang)
        if head.topology:
            c["topology"].append(gang)
            where = m.domains.get(head.topology, {})
            if len({where.get(bound[n][1], "") for n in names if n in bound}) > 1:
                c["spanning"].append(gang)
        times = [bound[n][0] for n in names if n in bound]
        if len(times) >= head.min_count:
            t0 = m.after_created.get(names[0], m.started)
            c["first"].append(min(times) - t0)
            c["last"].append(max(times) - t0)
    classes = {
        k: {
            "gangs": len(c["gangs"]), "bound_whole": len(c["first"]), "partial": len(c["partial"]),
            "preempted": len(c["preempted"]), "partly_preempted": len(c["partly"]),
            "topology_gangs": len(c["topology"]), "spanning": len(c["spanning"]),
            "first_bind_s": _dist(c["first"]), "last_bind_s": _dist(c["last"]),
        }
        for k, c in sorted(lists.items())
    }

    def every(key: str) -> list[str]:
        return sorted(g for c in lists.values() for g in c[key])

    return {"classes": classes, "partial": every("partial"), "preempted": every("preempted"),
            "partly_preempted": every("partly"), "spanning": every("spanning"), "topology_gangs": len(every("topology"))}


def summarize(cfg: RunConfig, m: Measured) -> dict[str, Any]:
    ex = cfg.workload
    by_name = {p.name: p for p in ex.pods}
    bound = {n: v for n, v in m.bound.items() if n in by_name}
    times = sorted(t - m.started for t, _ in bound.values())
    n = len(times)
    first = times[0] if times else None
    last = times[-1] if times else None
    window = (last - first) if n > 1 and first is not None and last is not None else 0.0

    gangs = gang_figures(ex, m, bound)
    partial = gangs["partial"]
    members: dict[str, list[float]] = {}
    for name, (t, _) in bound.items():
        if by_name[name].gang:
            members.setdefault(by_name[name].gang, []).append(t)
    spreads = [(max(ts) - min(ts)) * 1e3 for ts in members.values() if len(ts) > 1]

    # no node holds more GPUs than it has (pods the watch saw deleted hold none); for DRA
    # pods, no device handed out twice (from their claims)
    gpus_on: dict[str, float] = {}
    for name, (_, node) in bound.items():
        if name not in m.deleted:
            gpus_on[node] = gpus_on.get(node, 0) + by_name[name].gpu_share
    overcommitted = sorted(nd for nd, g in gpus_on.items() if g > ex.workload.node.gpus)
    twice = int(m.devices.get("devices_twice") or 0)
    unserved = int(m.devices.get("extended_faults") or 0)

    latency: dict[str, list[float]] = {}
    for name, created in {**m.stream_created, **m.after_created}.items():
        if name in bound:
            latency.setdefault(by_name[name].klass, []).append((bound[name][0] - created) * 1e3)

    ok = (not m.error and n == ex.expected_bound and not partial and not overcommitted and not gangs["spanning"]
          and not twice and not unserved)
    error = m.error
    if not error and partial:
        error = f"{len(partial)} partly bound gangs: {', '.join(partial[:5])}"
    if not error and gangs["spanning"]:
        error = f"{len(gangs['spanning'])} gangs span domains of their topology key: {', '.join(gangs['spanning'][:5])}"
    if not error and overcommitted:
        error = f"{len(overcommitted)} nodes hold more GPUs than they have"
    if not error and twice:
        error = f"{twice} devices allocated to two claims: {', '.join(m.devices['devices_twice_first'])}"
    if not error and unserved:
        error = (f"{unserved} bound pods without one claim for their nvidia.com/gpu: "
                 f"{'; '.join(m.devices['extended_faults_first'])}")
    return {
        "scheduler": cfg.peer.name,
        "round": cfg.round,
        "ok": ok,
        "error": error,
        "pods": len(ex.pods),
        "expected_bound": ex.expected_bound,
        "bound": n,
        "nodes_used": len(gpus_on),
        "first_bind_s": None if first is None else round(first, 4),
        "last_bind_s": None if last is None else round(last, 4),
        "pods_per_s": round((n - 1) / window, 1) if window > 0 else None,
        "pods_per_s_e2e": round(n / last, 1) if last else None,
        "gangs": len(ex.gangs),
        "partial_gangs": len(partial),
        "gang_bind_spread_ms": (
            {"median": round(statistics.median(spreads), 1), "max": round(max(spreads), 1)} if spreads else None
        ),
        "gang_classes": gangs["classes"],
        "pods_deleted": len([x for x in m.deleted if x in bound]),
        "gangs_preempted": len(gangs["preempted"]),
        "gangs_partly_preempted": len(gangs["partly_preempted"]),
        "topology_gangs": gangs["topology_gangs"],
        "gangs_spanning_domains": len(gangs["spanning"]),
        "overcommitted_nodes": len(overcommitted),
        **({"dra": m.devices} if ex.dra else {}),
        "stream_latency_ms": {k: _percentiles(v) for k, v in sorted(latency.items())},
        "usage": m.usage,
        "scheduler_metrics": m.metrics,
        "timings": {k: round(v, 2) for k, v in m.timings.items()},
        "timeline": _timeline(times),
        **({"profile": m.profile, "profiled": True} if cfg.profile else {}),
    }
