"""Workloads as data: ``perf/workloads/*.yaml`` read, checked and expanded into pods.

A workload file names the schedulers that run it, the node shape, one or more pod
*classes* (what each pod asks for, whether pods come in gangs and how those gangs are
declared: quorum, topology constraint, disruption mode; their priority class; and when
they are created: before the scheduler starts, as a stream, or ``after`` every earlier pod
is bound, so that they find the cluster full) and named *sizes* (nodes and total pods). :func:`expand` turns a workload at one size into concrete
:class:`PodSpec` values; :mod:`perf.peers` renders them for one scheduler (its
``schedulerName`` and its way of declaring a gang).

An unknown key or a bad value is a :class:`WorkloadError` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

WORKLOADS = Path(__file__).parent / "workloads"
#: the DeviceClasses of NVIDIA's driver a pod class may ask (:func:`batchsched.sandbox.gpudra.device_classes`)
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
#: the boards of a DRA workload's nodes: whole GPUs on the others, partitionable ones on the
#: ``mig_share`` of nodes; a whole-GPU claim selects the first by product, so MIG devices
#: always have their nodes to themselves (else a scheduler may rightly fill them with whole
#: GPUs and leave the MIG pods nowhere: the workload must fit whatever the placement)
GPU_PRODUCT = "NVIDIA A100-SXM4-40GB"
MIG_PRODUCT = "NVIDIA H100 80GB HBM3"


class WorkloadError(ValueError):
    """A workload file is not valid; the message names the file and the key."""


@dataclass(slots=True, frozen=True)
class NodeSpec:
    gpus: int = 8
    cpu: str = "96"
    memory: str = "1024Gi"
    max_pods: int = 110
    #: nodes per rack: the sandbox labels node i ``batchsched.io/rack: <prefix>-rack-<i // this>``
    nodes_per_rack: int = 8
    #: the GPUs published by DRA as NVIDIA's driver does (ResourceSlices, :mod:`perf.dra`)
    #: instead of the ``nvidia.com/gpu`` extended resource, which the nodes then lack
    dra: bool = False
    #: with ``dra``: the share of nodes whose GPUs are partitionable (MIG devices made on demand)
    mig_share: float = 0.0


@dataclass(slots=True, frozen=True)
class PodClass:
    name: str
    share: float = 1.0
    gpus: int = 1
    cpu: str = "100m"
    memory: str = "128Mi"
    #: members per gang; 0 = single pods
    gang: int = 0
    #: gang quorum; 0 = the whole gang
    min_count: int = 0
    priority_class: str = ""
    #: "before" (created before the scheduler starts), "stream" (created at stream_rate) or
    #: "after" (created, PodGroups included, once every "before" pod is bound)
    arrival: str = "before"
    #: a node label key each gang must fit inside one domain of (the PodGroup's
    #: ``schedulingConstraints.topology``); "" for none
    topology: str = ""
    #: the PodGroup's ``disruptionMode``: "all" (members are preempted together), "single",
    #: or "" (not written: the API's default, single)
    disruption: str = ""
    #: a DeviceClass (``gpu.nvidia.com``: ``gpus`` whole GPUs; ``mig.nvidia.com``: one MIG
    #: device of ``mig_profile``) asked through a ResourceClaimTemplate instead of
    #: ``nvidia.com/gpu``; needs a node with ``dra``
    device_class: str = ""
    mig_profile: str = ""
    #: with ``device_class`` gpu.nvidia.com: ask ``gpus`` as ``nvidia.com/gpu`` in the
    #: container's requests and limits, no claim of the pod's own; the DeviceClass names that
    #: extended resource (``extendedResourceName``), so the scheduler makes and allocates one
    #: claim for the pod (DRAExtendedResource)
    extended: bool = False


@dataclass(slots=True, frozen=True)
class Size:
    nodes: int
    pods: int


@dataclass(slots=True, frozen=True)
class Workload:
    name: str
    description: str
    schedulers: tuple[str, ...]
    node: NodeSpec
    classes: tuple[PodClass, ...]
    sizes: dict[str, Size]
    default_size: str
    timeout: float = 900.0
    stream_rate: float = 0.0
    #: more GPUs asked than exist: only whole gangs that fit can be bound (a race)
    oversubscribed: bool = False
    #: after the expected pods are bound, keep watching this long for stray binds
    settle_seconds: float = 0.0
    path: str = ""

    @property
    def gangs(self) -> bool:
        return any(c.gang for c in self.classes)


@dataclass(slots=True, frozen=True)
class PodSpec:
    """One pod of an expanded workload, before it is rendered for a scheduler."""

    name: str
    klass: str
    gpus: int
    cpu: str
    memory: str
    priority_class: str
    stream: bool
    #: the gang this pod belongs to ("" for a single pod), its size and quorum
    gang: str = ""
    gang_size: int = 0
    min_count: int = 0
    #: created once every "before" pod is bound
    after: bool = False
    #: the gang's topology key and disruption mode (see :class:`PodClass`)
    topology: str = ""
    disruption: str = ""
    #: the DRA claim the pod asks instead of ``nvidia.com/gpu`` (see :class:`PodClass`)
    device_class: str = ""
    mig_profile: str = ""
    #: ``nvidia.com/gpu`` asked, served by devices of ``device_class`` (see :class:`PodClass`)
    extended: bool = False

    @property
    def claim_template(self) -> bool:
        """The pod asks its GPUs through a claim made from its class's template."""
        return bool(self.device_class) and not self.extended

    @property
    def gpu_share(self) -> float:
        """The GPUs the pod holds: ``gpus`` whole ones, or the share of one board a MIG
        device's memory slices are (what it takes from the node's capacity)."""
        if self.device_class == MIG_CLASS:
            from batchsched.sandbox.gpudra import MODELS

            return MODELS[MIG_PRODUCT].profile(self.mig_profile).size / 8
        return float(self.gpus)


@dataclass(slots=True, frozen=True)
class Expanded:
    workload: Workload
    size_name: str
    size: Size
    pods: tuple[PodSpec, ...]

    @property
    def gangs(self) -> dict[str, tuple[int, int]]:
        """gang name -> (members, quorum)."""
        return {p.gang: (p.gang_size, p.min_count) for p in self.pods if p.gang}

    @property
    def gang_heads(self) -> dict[str, PodSpec]:
        """gang name -> its first member (which carries what the gang's PodGroup says)."""
        heads: dict[str, PodSpec] = {}
        for p in self.pods:
            if p.gang and p.gang not in heads:
                heads[p.gang] = p
        return heads

    @property
    def gpu_demand(self) -> float:
        total = sum(p.gpu_share for p in self.pods)
        return int(total) if total == int(total) else round(total, 1)

    @property
    def dra(self) -> bool:
        """The pods ask GPUs through ResourceClaims (the nodes publish ResourceSlices)."""
        return self.workload.node.dra

    @property
    def extended(self) -> bool:
        """Some pods ask ``nvidia.com/gpu`` served by DRA devices: the GPU DeviceClass names
        that extended resource."""
        return any(c.extended for c in self.workload.classes)

    @property
    def gpu_capacity(self) -> int:
        return self.size.nodes * self.workload.node.gpus

    @property
    def expected_bound(self) -> int:
        """How many pods a correct scheduler binds: all, or the whole gangs that fit."""
        if not self.workload.oversubscribed:
            return len(self.pods)
        c = self.workload.classes[0]
        per_node = self.workload.node.gpus // max(c.gpus, 1)
        quorum = c.min_count or c.gang
        gangs_fit = self.size.nodes * per_node // quorum
        return min(len(self.gangs), gangs_fit) * c.gang


_TOP = {
    "name", "description", "schedulers", "node", "classes", "sizes", "default_size", "timeout",
    "stream_rate", "oversubscribed", "settle_seconds",
}


def _fields(cls: type[Any]) -> set[str]:
    return set(cls.__dataclass_fields__)


def _check_keys(data: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise WorkloadError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def parse_workload(data: Any, *, path: str = "") -> Workload:
    where = path or "workload"
    if not isinstance(data, dict):
        raise WorkloadError(f"{where}: expected a mapping")
    _check_keys(data, _TOP, where)
    try:
        node_data = data.get("node") or {}
        _check_keys(node_data, _fields(NodeSpec), f"{where}: node")
        node = NodeSpec(**node_data)
        classes = []
        for i, c in enumerate(data.get("classes") or []):
            _check_keys(c, _fields(PodClass), f"{where}: classes[{i}]")
            classes.append(PodClass(**c))
        sizes = {}
        for name, s in (data.get("sizes") or {}).items():
            _check_keys(s, _fields(Size), f"{where}: sizes.{name}")
            sizes[str(name)] = Size(nodes=int(s["nodes"]), pods=int(s["pods"]))
        wl = Workload(
            name=str(data["name"]),
            description=str(data.get("description", "")),
            schedulers=tuple(str(s) for s in data.get("schedulers") or ()),
            node=node,
            classes=tuple(classes),
            sizes=sizes,
            default_size=str(data.get("default_size") or next(iter(sizes), "")),
            timeout=float(data.get("timeout", 900)),
            stream_rate=float(data.get("stream_rate", 0)),
            oversubscribed=bool(data.get("oversubscribed", False)),
            settle_seconds=float(data.get("settle_seconds", 0)),
            path=path,
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, WorkloadError):
            raise
        raise WorkloadError(f"{where}: {exc}") from None
    if not wl.classes:
        raise WorkloadError(f"{where}: needs at least one pod class")
    if not wl.schedulers:
        raise WorkloadError(f"{where}: schedulers: needs at least one scheduler")
    if wl.default_size not in wl.sizes:
        raise WorkloadError(f"{where}: default_size {wl.default_size!r} is not one of sizes")
    for c in wl.classes:
        if c.arrival not in ("before", "stream", "after"):
            raise WorkloadError(f"{where}: class {c.name}: arrival must be before, stream or after, got {c.arrival!r}")
        if c.disruption not in ("", "all", "single"):
            raise WorkloadError(f"{where}: class {c.name}: disruption must be all or single, got {c.disruption!r}")
        if (c.topology or c.disruption) and not c.gang:
            raise WorkloadError(f"{where}: class {c.name}: topology and disruption are a gang's (set gang)")
        if c.gang < 0 or c.min_count < 0 or (c.gang and c.min_count > c.gang):
            raise WorkloadError(f"{where}: class {c.name}: need 0 <= min_count <= gang")
        if c.share <= 0:
            raise WorkloadError(f"{where}: class {c.name}: share must be positive")
        _check_claim(wl, c, where)
    if wl.oversubscribed and (len(wl.classes) != 1 or not wl.classes[0].gang):
        raise WorkloadError(f"{where}: oversubscribed workloads need exactly one class, of gangs")
    if not 0 <= wl.node.mig_share <= 1 or (wl.node.mig_share and not wl.node.dra):
        raise WorkloadError(f"{where}: node: mig_share is a share of the DRA nodes (dra: true), from 0 to 1")
    if wl.node.nodes_per_rack < 1:
        raise WorkloadError(f"{where}: node: nodes_per_rack must be at least 1")
    if any(c.arrival == "after" for c in wl.classes) and not any(c.arrival == "before" for c in wl.classes):
        raise WorkloadError(f"{where}: classes arriving after need a class created before")
    if any(c.arrival == "stream" for c in wl.classes) and wl.stream_rate <= 0:
        raise WorkloadError(f"{where}: stream classes need a positive stream_rate")
    return wl


def _check_claim(wl: Workload, c: PodClass, where: str) -> None:
    """A class asking a DRA claim: a class of the driver, on nodes that publish it."""
    from batchsched.sandbox.gpudra import MODELS

    if wl.node.dra and not c.device_class:
        raise WorkloadError(f"{where}: class {c.name}: the nodes publish GPUs by DRA: set device_class")
    if not c.device_class:
        if c.mig_profile:
            raise WorkloadError(f"{where}: class {c.name}: mig_profile needs device_class {MIG_CLASS}")
        if c.extended:
            raise WorkloadError(f"{where}: class {c.name}: extended needs device_class {GPU_CLASS}")
        return
    if not wl.node.dra:
        raise WorkloadError(f"{where}: class {c.name}: device_class needs nodes with dra: true")
    if c.device_class == GPU_CLASS:
        if c.mig_profile:
            raise WorkloadError(f"{where}: class {c.name}: mig_profile is for {MIG_CLASS}, not {GPU_CLASS}")
        if c.extended and wl.node.mig_share:
            # nvidia.com/gpu has no product selector: it would take the partitionable boards too
            raise WorkloadError(f"{where}: class {c.name}: extended classes need nodes without MIG (mig_share: 0)")
        return
    if c.extended:
        raise WorkloadError(f"{where}: class {c.name}: extended needs device_class {GPU_CLASS} "
                            "(the class that names nvidia.com/gpu)")
    if c.device_class != MIG_CLASS:
        raise WorkloadError(f"{where}: class {c.name}: device_class must be {GPU_CLASS} or {MIG_CLASS}, "
                            f"got {c.device_class!r}")
    if wl.node.mig_share <= 0:
        raise WorkloadError(f"{where}: class {c.name}: MIG devices need nodes with a positive mig_share")
    if c.gpus != 1:
        raise WorkloadError(f"{where}: class {c.name}: a MIG class asks one device (gpus: 1)")
    try:
        MODELS[MIG_PRODUCT].profile(c.mig_profile)
    except ValueError as exc:
        raise WorkloadError(f"{where}: class {c.name}: {exc}") from None


def mig_node(index: int, share: float) -> bool:
    """Whether node ``index`` is one of the ``share`` of nodes with partitionable GPUs: spread
    evenly (every fourth node at 0.25), so any prefix of the nodes holds its share."""
    return int((index + 1) * share) > int(index * share)


def available() -> list[str]:
    return sorted(p.stem for p in WORKLOADS.glob("*.yaml"))


def load_workload(name_or_path: str) -> Workload:
    """A workload by name (``perf/workloads/NAME.yaml``) or by file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = WORKLOADS / f"{name_or_path}.yaml"
    if not path.exists():
        raise WorkloadError(f"no workload {name_or_path!r} (known: {', '.join(available())})")
    return parse_workload(yaml.safe_load(path.read_text()), path=str(path))


def parse_size(wl: Workload, text: str | None) -> tuple[str, Size]:
    """A named size of the workload, or ``NODESxPODS`` for any other."""
    name = text or wl.default_size
    if name in wl.sizes:
        return name, wl.sizes[name]
    nodes, sep, pods = name.partition("x")
    if sep and nodes.isdigit() and pods.isdigit() and int(nodes) > 0 and int(pods) > 0:
        return name, Size(nodes=int(nodes), pods=int(pods))
    raise WorkloadError(
        f"{wl.name}: unknown size {name!r} (named: {', '.join(wl.sizes)}; or NODESxPODS)"
    )


def _check_claims_fit(ex: Expanded) -> None:
    """MIG devices exist on the partitionable nodes only, and whole-GPU claims select the
    other nodes' boards: each demand must fit its nodes' GPUs."""
    node = ex.workload.node
    mig_nodes = sum(1 for i in range(ex.size.nodes) if mig_node(i, node.mig_share))
    for what, klass, nodes in (("MIG devices", MIG_CLASS, mig_nodes),
                               ("whole GPUs", GPU_CLASS, ex.size.nodes - mig_nodes)):
        asked = sum(p.gpu_share for p in ex.pods if p.device_class == klass)
        if asked > nodes * node.gpus:
            where = "the partitionable nodes" if klass == MIG_CLASS else "the other nodes"
            raise WorkloadError(f"{ex.workload.name}@{ex.size_name}: {what} worth {asked:g} GPUs asked for, "
                                f"{where} have {nodes * node.gpus}")


def expand(wl: Workload, size_name: str | None = None) -> Expanded:
    """Every pod of ``wl`` at one size: each class gets its share, rounded to whole gangs."""
    sname, size = parse_size(wl, size_name)
    total_share = sum(c.share for c in wl.classes)
    pods: list[PodSpec] = []
    for c in wl.classes:
        count = round(size.pods * c.share / total_share)
        if c.gang:
            count -= count % c.gang
        common = dict(
            klass=c.name, gpus=c.gpus, cpu=c.cpu, memory=c.memory,
            priority_class=c.priority_class, stream=c.arrival == "stream", after=c.arrival == "after",
            device_class=c.device_class, mig_profile=c.mig_profile, extended=c.extended,
        )
        if c.gang:
            quorum = c.min_count or c.gang
            for g in range(count // c.gang):
                gang = f"{c.name}-g{g:05d}"
                for m in range(c.gang):
                    pods.append(PodSpec(
                        name=f"{gang}-{m:03d}", gang=gang, gang_size=c.gang, min_count=quorum,
                        topology=c.topology, disruption=c.disruption, **common,  # type: ignore[arg-type]
                    ))
        else:
            for i in range(count):
                pods.append(PodSpec(name=f"{c.name}-{i:06d}", **common))  # type: ignore[arg-type]
    if not pods:
        raise WorkloadError(f"{wl.name}@{sname}: no pods (a size too small for its gangs?)")
    ex = Expanded(workload=wl, size_name=sname, size=size, pods=tuple(pods))
    _check_claims_fit(ex)
    # pods created "after" find the cluster full: they fit only by preempting, so each
    # phase on its own must fit
    phases = [[p for p in pods if not p.after], [p for p in pods if p.after]]
    for phase in phases:
        demand = sum(p.gpus for p in phase)
        if demand > ex.gpu_capacity and not wl.oversubscribed:
            raise WorkloadError(
                f"{wl.name}@{sname}: {demand} GPUs asked for, only {ex.gpu_capacity} exist: "
                "not every pod could be bound"
            )
    return ex
