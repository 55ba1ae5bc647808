"""What-if scenarios: a small YAML file of nodes, queues and a timed list of jobs, replayed
through the session on a virtual clock.

.. code-block:: yaml

    config: {gpuSharing: {policy: binpack}}      # the batchsched configuration to try
    nodes:
      - {prefix: a100, count: 4, cpu: 64, memory: 512Gi, gpus: 8, model: A100, cardMemory: 81920}
    queues:                                      # Queue objects, resources flattened by name
      - {name: team-a, resources: {nvidia.com/gpu: {nominal: 16}}}
    jobs:
      - {name: train, at: 0, duration: 3600, pods: 8, gpus: 1, cpu: 8, memory: 64Gi,
         queue: team-a, minMember: 8, priority: 10}
      - {name: notebook, at: 60, duration: 600, core: 50}    # a share of one card

GPUs by Dynamic Resource Allocation: a node pool with ``dra`` publishes its ``gpus`` as
NVIDIA's DRA driver does (ResourceSlices, :mod:`batchsched.sandbox.gpudra`) instead of as
``nvidia.com/gpu``; ``dra`` is the driver's MIG mode: ``none`` (whole GPUs), ``static`` (the
board's balanced MIG layout made) or ``partitionable`` (each GPU whole or any MIG partition
of it); ``product`` names the board (``NVIDIA A100-SXM4-40GB`` by default, or ``NVIDIA H100
80GB HBM3``). The driver's DeviceClasses (``gpu.nvidia.com``, ``mig.nvidia.com``,
``vfio.gpu.nvidia.com``) then exist. A job with ``claim: {class: mig.nvidia.com, count: 2,
selectors: [CEL, ...]}`` gives each pod a claim made from a ResourceClaimTemplate of that
class and count (``count`` defaults to 1; ``selectors`` are CEL expressions every device
must pass, e.g. ``device.attributes['gpu.nvidia.com'].profile == '1g.5gb'``):

.. code-block:: yaml

    nodes:
      - {prefix: mig, count: 2, cpu: 64, memory: 512Gi, gpus: 8, dra: partitionable}
    jobs:
      - {name: inference, at: 0, duration: 600, pods: 4, minMember: 4,
         claim: {class: mig.nvidia.com, selectors: ["device.attributes['gpu.nvidia.com'].profile == '3g.20gb'"]}}

A job's pods ask ``gpus`` whole ``nvidia.com/gpu`` cards or ``core`` (``elasticgpu.io/gpu-core``)
each; ``minMember`` makes it a gang: a scheduler-plugins PodGroup, or Kubernetes' own
(``minMember`` as its ``minCount``) when the job says ``api: scheduling.k8s.io``. Each job starts when its
last member is bound and all its pods end ``duration`` seconds later; a job whose pods are
evicted (preemption, reclaim) is created again at once, as a training operator restarts
it, and runs its whole duration from its next start.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from batchsched.config import parse_config
from batchsched.core.devices import ELASTIC_CORE, ELASTIC_MEMORY, MODEL_LABEL
from batchsched.core.gangs import K8S, XK8S, parse_podgroup
from batchsched.sandbox import gpudra
from batchsched.simulate.engine import Simulation

LABEL_GROUP = "scheduling.x-k8s.io/pod-group"
QUEUE_LABEL = "batchsched.io/queue"
#: the PodGroup APIs a scenario's gang may be written in
APIS = (XK8S, K8S)
#: what a job's ``claim`` may say
CLAIM_KEYS = ("class", "count", "selectors")
#: the pod's entry in ``spec.resourceClaims`` for a job's claim
CLAIM_ENTRY = "gpu"


@dataclass(slots=True)
class JobResult:
    name: str
    queue: str
    arrived: float
    started: float | None = None
    ended: float | None = None
    #: times its pods were evicted (preempted or reclaimed): each time it is created again
    evictions: int = 0

    @property
    def wait(self) -> float | None:
        return None if self.started is None else self.started - self.arrived


@dataclass(slots=True)
class ScenarioResult:
    jobs: dict[str, JobResult] = field(default_factory=dict)
    #: (time, {queue: GPU cards held}) after every instant with events
    usage: list[tuple[float, dict[str, float]]] = field(default_factory=list)


def _node(spec: Mapping[str, Any], i: int) -> dict[str, Any]:
    name = f"{spec.get('prefix', 'node')}-{i}"
    alloc: dict[str, str] = {"cpu": str(spec.get("cpu", 64)), "memory": str(spec.get("memory", "256Gi")),
                             "pods": "110"}
    labels = {"kubernetes.io/hostname": name, **{str(k): str(v) for k, v in (spec.get("labels") or {}).items()}}
    gpus = int(spec.get("gpus", 0))
    if gpus and "dra" not in spec:
        alloc["nvidia.com/gpu"] = str(gpus)
        alloc[ELASTIC_CORE] = str(100 * gpus)
        if spec.get("cardMemory"):
            alloc[ELASTIC_MEMORY] = str(int(spec["cardMemory"]) * gpus)
    if spec.get("model"):
        labels[MODEL_LABEL] = str(spec["model"])
    return {"metadata": {"name": name, "uid": f"node-{name}", "labels": labels},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def _slices(spec: Mapping[str, Any], node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ResourceSlices a node of a ``dra`` pool publishes (none for other pools)."""
    if "dra" not in spec:
        return []
    name = str(node["metadata"]["name"])
    options: dict[str, Any] = {"gpus": int(spec.get("gpus", 0)), "mig": str(spec["dra"])}
    if spec.get("product"):
        options["product"] = str(spec["product"])
    try:
        return gpudra.gpu_node_slices(name, node_uid=str(node["metadata"]["uid"]), **options)
    except ValueError as exc:
        raise ValueError(f"node pool {spec.get('prefix', 'node')!r}: dra: {exc}") from None


def _template(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ResourceClaimTemplate of a job's ``claim`` (None when it has none); a ValueError
    names what is wrong with it."""
    claim = job.get("claim")
    if claim is None:
        return None
    where = f"job {job.get('name')!r}: claim"
    if not isinstance(claim, Mapping) or not claim.get("class"):
        raise ValueError(f"{where} needs a class (a DeviceClass name, e.g. mig.nvidia.com), got {claim!r}")
    unknown = sorted(set(map(str, claim)) - set(CLAIM_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(CLAIM_KEYS)})")
    selectors = claim.get("selectors") or []
    if not isinstance(selectors, list) or not all(isinstance(e, str) for e in selectors):
        raise ValueError(f"{where}: selectors must be a list of CEL expressions, got {selectors!r}")
    try:
        body = gpudra.claim_template(str(job["name"]), str(claim["class"]), int(claim.get("count", 1)), selectors)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    body["metadata"]["namespace"] = "default"
    return body


def _queue(spec: Mapping[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in spec.items() if k not in ("name", "resources")}
    if "resources" in spec:
        body["resources"] = [{"name": n, **v} for n, v in spec["resources"].items()]
    return {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": spec["name"]}, "spec": body}


def _pod(job: Mapping[str, Any], i: int, now: float, attempt: int = 0) -> dict[str, Any]:
    name = f"{job['name']}-{i}" if attempt == 0 else f"{job['name']}-r{attempt}-{i}"
    req: dict[str, str] = {"cpu": str(job.get("cpu", 1)), "memory": str(job.get("memory", "1Gi"))}
    if job.get("gpus"):
        req["nvidia.com/gpu"] = str(job["gpus"])
    if job.get("core"):
        req[ELASTIC_CORE] = str(job["core"])
    labels: dict[str, str] = {}
    if job.get("queue"):
        labels[QUEUE_LABEL] = str(job["queue"])
    spec: dict[str, Any] = {"schedulerName": "batchsched", "priority": int(job.get("priority", 0)),
                            "containers": [{"name": "main", "resources": {"requests": req}}]}
    if job.get("minMember") and _api(job) == K8S:
        spec["schedulingGroup"] = {"podGroupName": str(job["name"])}
    elif job.get("minMember"):
        labels[LABEL_GROUP] = str(job["name"])
    if job.get("claim") is not None:
        spec["resourceClaims"] = [{"name": CLAIM_ENTRY, "resourceClaimTemplateName": str(job["name"])}]
        spec["containers"][0]["resources"]["claims"] = [{"name": CLAIM_ENTRY}]
    import datetime as dt

    created = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"name": name, "namespace": "default", "uid": name, "labels": labels,
                         "creationTimestamp": created},
            "spec": spec, "status": {"phase": "Pending"}}


def _api(job: Mapping[str, Any]) -> str:
    api = str(job.get("api") or XK8S)
    if api not in APIS:
        raise ValueError(f"job {job.get('name')!r}: api must be one of {', '.join(APIS)}, got {api!r}")
    return api


def _group(job: Mapping[str, Any]) -> dict[str, Any]:
    """The PodGroup of a gang job, in the API it names."""
    meta = {"name": str(job["name"]), "namespace": "default", "uid": f"pg-{job['name']}"}
    if _api(job) == K8S:
        return {"metadata": meta, "spec": {"schedulingPolicy": {"gang": {"minCount": int(job["minMember"])}},
                                           "disruptionMode": {"single": {}}}}
    return {"metadata": meta, "spec": {"minMember": int(job["minMember"])}}


def _claimed_gpus(job: Mapping[str, Any]) -> float:
    """Whole GPUs a job's pod holds by its claim (MIG partitions are not counted as cards)."""
    claim = job.get("claim") or {}
    return float(claim.get("count", 1)) if claim.get("class") == "gpu.nvidia.com" else 0.0


def run(doc: Mapping[str, Any], *, use_jit: bool = True, retry: float = 30.0, horizon: float = 30 * 86400) -> ScenarioResult:
    """Replay the scenario ``doc`` (the parsed YAML) until every job ended or ``horizon``."""
    sim = Simulation(parse_config(doc.get("config") or None).session_settings(), use_jit=use_jit)
    pools = [(n, _node(n, i)) for n in doc.get("nodes") or [] for i in range(int(n.get("count", 1)))]
    sim.add_nodes(node for _, node in pools)
    slices = [s for spec, node in pools for s in _slices(spec, node)]
    if slices:
        sim.add_devices(slices=slices, classes=gpudra.device_classes(extended_resource=False))
    sim.session.on_queues_listed([_queue(q) for q in doc.get("queues") or []])
    jobs = {str(j["name"]): j for j in doc.get("jobs") or []}
    sim.claims.add([], [t for t in (_template(j) for j in jobs.values()) if t is not None])
    events: list[tuple[float, int, str]] = [(float(j.get("at", 0)), 0, name) for name, j in jobs.items()]
    heapq.heapify(events)
    out = ScenarioResult()
    waiting: dict[str, list[str]] = {}
    running: dict[str, list[str]] = {}
    #: the event code of each job's current end (an end scheduled before an eviction is stale)
    ends: dict[str, int] = {}
    now = 0.0
    while events or waiting:
        now = min(events[0][0] if events else float("inf"), now + retry if waiting else float("inf"))
        if now > horizon:
            break
        while events and events[0][0] <= now:
            _, what, name = heapq.heappop(events)
            job = jobs[name]
            if what == 0:
                n = int(job.get("pods", 1))
                if job.get("minMember") and name not in out.jobs:
                    sim.session.on_podgroup("ADDED", parse_podgroup(_api(job), _group(job)))
                attempt = out.jobs[name].evictions if name in out.jobs else 0
                waiting[name] = [sim.add_pod(_pod(job, i, now, attempt)).uid for i in range(n)]
                out.jobs.setdefault(name, JobResult(name, str(job.get("queue", "")), now))
            elif name in running and what == ends.get(name):
                for uid in running.pop(name, []):
                    sim.finish_pod(uid)
                out.jobs[name].ended = now
        sim.step(now)
        for name, uids in list(running.items()):
            if any(u in sim.evicted for u in uids):
                del running[name]
                for u in uids:
                    sim.delete_pod(u)
                out.jobs[name].evictions += 1
                heapq.heappush(events, (now, 0, name))  # created again
        for name, uids in list(waiting.items()):
            if all(u in sim.placed for u in uids):
                del waiting[name]
                running[name] = uids
                out.jobs[name].started = now
                ends[name] = ends.get(name, 1) + 1
                heapq.heappush(events, (now + float(jobs[name].get("duration", 3600)), ends[name], name))
        held: dict[str, float] = {}
        for name, uids in running.items():
            job = jobs[name]
            cards = float(job.get("gpus", 0)) or float(job.get("core", 0)) / 100 or _claimed_gpus(job)
            held[str(job.get("queue", ""))] = held.get(str(job.get("queue", "")), 0.0) + cards * len(uids)
        out.usage.append((now, held))
        if not events and waiting and not running:
            break  # nothing will end: what waits now waits for ever
    return out
