"""GPUs as Dynamic Resource Allocation publishes them: the ``resource.k8s.io/v1`` objects of
NVIDIA's DRA driver for GPUs, for tests, the demo and the perf suite.

A cluster with that driver has, per node, the ResourceSlices its kubelet plugin publishes,
and cluster-wide the DeviceClasses its Helm chart ships. Nothing here talks to a cluster:
the functions return plain dicts, ready to be created by whoever calls them.

Where each shape comes from (NVIDIA/k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin/``):

* device names: ``deviceinfo.go`` ``GpuInfo.CanonicalName`` (``gpu-<minor>``) and
  ``mig.go`` ``MigSpecTuple.ToCanonicalName`` (``gpu-<minor>-mig-<profile without dots,
  RFC 1123>-<GI profile id>-<placement start>``, e.g. ``gpu-0-mig-1g5gb-19-0``);
* attributes: ``deviceinfo.go`` ``GpuInfo.Attributes`` and ``mig.go``
  ``CommonAttributesMig`` (``type``, ``uuid``, ``productName``, ``brand``,
  ``architecture``, ``cudaComputeCapability``/``driverVersion``/``cudaDriverVersion`` as
  semver versions, ``resource.kubernetes.io/pciBusID`` and ``pcieRoot``; MIG devices
  ``parentUUID`` and ``profile``, and ``uuid`` only when the MIG device exists, i.e. static
  MIG); the driver sets no ``index`` or ``minor`` attribute (the minor is in the name);
* capacity: ``partitions.go`` ``fullGpuCapacity`` (``memory`` in bytes) and ``mig.go``
  ``CommonCapacitiesMig`` (``multiprocessors``, ``copyEngines``, ``decoders``,
  ``encoders``, ``jpegEngines``, ``ofaEngines``, ``memory``); a static MIG device also
  announces ``memorySlice<i>: 1`` for each memory slice of its placement
  (``MigDeviceInfo.GetDevice``);
* pools and slices: ``driver.go``. Without the DynamicMIG gate, ``publishResources``
  publishes one slice holding every device of the node; with it (KEP-4815 partitionable
  devices), ``generateSplitResourceSlices`` (Kubernetes 1.35+) publishes one slice with
  the shared counters of every GPU first, then one slice of devices per GPU, sorted by PCI
  bus ID. The pool is named after the node (``Pools: {nodeName: ...}``);
* partitionable counters: ``partitions.go``: one counter set per GPU,
  ``gpu-<minor>-counter-set``, whose counters are the largest capacity any MIG profile
  announces (names made DNS-like: ``copyEngines`` -> ``copy-engines``) plus
  ``memory-slice-<i>: 1`` per memory slice; each MIG device consumes its profile's
  capacity and the memory slices of its placement; the full GPU consumes all of it and
  announces those largest capacities (so its ``memory`` is the biggest profile's, not the
  board's). The MIG profile figures are what NVML reports (``nvidia-smi mig -lgip``),
  which the driver reads at run time; :data:`MODELS` holds them for two boards;
* object metadata: Kubernetes' ``k8s.io/dynamic-resource-allocation/resourceslice``
  controller, which the plugin drives: ``generateName`` ``<index, 5 hex digits>-<driver>-
  <node>-``, an owner reference to the Node, ``spec.pool`` with ``generation`` and
  ``resourceSliceCount``;
* DeviceClasses: ``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-*.yaml``.

:func:`shared_gpu_slices` is not NVIDIA's: the driver publishes no device with
``allowMultipleAllocations``. It shapes a GPU shared by capacity as KEP-5075 (consumable
capacity) describes it: the device allows several allocations and each capacity carries a
``requestPolicy`` (a default and a range of valid requests).
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"
#: the Kubernetes-standard attribute names the driver fills from sysfs
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
#: what the API accepts per slice (resource/v1 types.go): counter sets, and devices once
#: any device of the slice consumes counters
MAX_COUNTER_SETS = 8
MAX_DEVICES_WITH_COUNTERS = 64

MIG_MODES = ("none", "static", "partitionable")


@dataclass(slots=True, frozen=True)
class MigProfile:
    """One GPU instance profile as NVML describes it (``GpuInstanceProfileInfo`` and its
    possible placements). ``starts`` are the first memory slice of each placement, each
    ``size`` slices long."""

    name: str
    profile_id: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int
    size: int
    starts: tuple[int, ...]

    def capacity(self) -> dict[str, int]:
        """The capacity a device of this profile announces, as ``CommonCapacitiesMig``:
        counts, and memory in bytes."""
        return {
            "multiprocessors": self.multiprocessors, "copyEngines": self.copy_engines,
            "decoders": self.decoders, "encoders": self.encoders,
            "jpegEngines": self.jpeg_engines, "ofaEngines": self.ofa_engines,
            "memory": self.memory_mib * 2**20,
        }


@dataclass(slots=True, frozen=True)
class GpuModel:
    """A board: what NVML says of it, and its MIG profiles; ``balanced`` is a static MIG
    layout of (profile, placement start), the ``all-balanced`` one of mig-parted."""

    product: str
    architecture: str
    compute_capability: str
    memory_mib: int
    profiles: tuple[MigProfile, ...]
    balanced: tuple[tuple[str, int], ...]

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.profiles)
        raise ValueError(f"{self.product} has no MIG profile {name!r} (it has {known})")


A100_40GB = GpuModel(
    product="NVIDIA A100-SXM4-40GB", architecture="Ampere", compute_capability="8.0",
    memory_mib=40960,
    profiles=(
        MigProfile("1g.5gb", 19, 14, 1, 0, 0, 0, 0, 4864, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("1g.5gb+me", 20, 14, 1, 1, 0, 1, 1, 4864, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("1g.10gb", 15, 14, 1, 1, 0, 0, 0, 9856, 2, (0, 2, 4, 6)),
        MigProfile("2g.10gb", 14, 28, 2, 1, 0, 0, 0, 9856, 2, (0, 2, 4)),
        MigProfile("3g.20gb", 9, 42, 3, 2, 0, 0, 0, 19968, 4, (0, 4)),
        MigProfile("4g.20gb", 5, 56, 4, 2, 0, 0, 0, 19968, 4, (0,)),
        MigProfile("7g.40gb", 0, 98, 7, 5, 0, 1, 1, 40192, 8, (0,)),
    ),
    balanced=(("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 4)),
)
H100_80GB = GpuModel(
    product="NVIDIA H100 80GB HBM3", architecture="Hopper", compute_capability="9.0",
    memory_mib=81559,
    profiles=(
        MigProfile("1g.10gb", 19, 16, 1, 1, 0, 1, 0, 9984, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("1g.10gb+me", 20, 16, 1, 1, 0, 1, 1, 9984, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("1g.20gb", 15, 26, 1, 1, 0, 1, 0, 20096, 2, (0, 2, 4, 6)),
        MigProfile("2g.20gb", 14, 32, 2, 2, 0, 2, 0, 20096, 2, (0, 2, 4)),
        MigProfile("3g.40gb", 9, 60, 3, 3, 0, 3, 0, 40448, 4, (0, 4)),
        MigProfile("4g.40gb", 5, 64, 4, 4, 0, 4, 0, 40448, 4, (0,)),
        MigProfile("7g.80gb", 0, 132, 8, 7, 0, 7, 1, 81152, 8, (0,)),
    ),
    balanced=(("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)),
)
MODELS: dict[str, GpuModel] = {m.product: m for m in (A100_40GB, H100_80GB)}

#: what NVML reports on the host, the same for every GPU of a node
DRIVER_VERSION = "570.124.06"
CUDA_DRIVER_VERSION = "12.8"
BRAND = "Nvidia"
#: the PCI buses of a DGX A100's eight GPUs (further GPUs get buses after them)
DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


# -- values as the API writes them --------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def quantity(n: int) -> str:
    """``n`` as the canonical binary-SI quantity the driver's ``resource.NewQuantity(n,
    BinarySI)`` serialises to: ``40Gi``, ``4864Mi``, ``14``."""
    if n == 0:
        return "0"
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n % 2**power == 0:
            return f"{n // 2**power}{suffix}"
    return str(n)


@functools.lru_cache(maxsize=64)
def semver(version: str) -> str:
    """A version as ``semver.MustParse(v).String()`` (Masterminds) writes it: three
    numbers, leading zeros gone (``570.124.06`` -> ``570.124.6``, ``8.0`` -> ``8.0.0``)."""
    parts = [int(p) for p in version.split(".")]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"{version!r} is not a version of one to three numbers")
    return ".".join(str(p) for p in [*parts, 0, 0][:3])


@functools.lru_cache(maxsize=256)
def dns_name(name: str) -> str:
    """The driver's ``camelToDNSName``: ``copyEngines`` -> ``copy-engines``."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", name)
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1-\2", name)
    return rfc1123(name)


@functools.lru_cache(maxsize=4096)
def rfc1123(name: str) -> str:
    """The driver's ``toRFC1123Compliant``: lower case, anything else than ``[a-z0-9-.]``
    becomes ``-``, no leading or trailing ``-``, no trailing dot."""
    name = re.sub(r"[^a-z0-9-.]", "-", name.lower()).strip("-").removesuffix(".")
    return name[:253]


def _stable_uuid(*parts: object) -> str:
    """A UUID that is the same for the same inputs: fixtures compare equal across runs."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16]))


# -- one GPU -----------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class _Gpu:
    """One physical GPU of a node, with what the driver reads of it."""

    node: str
    minor: int
    model: GpuModel

    @property
    def name(self) -> str:
        return f"gpu-{self.minor}"

    @property
    def uuid(self) -> str:
        return "GPU-" + _stable_uuid(self.node, self.minor)

    @property
    def pci_bus_id(self) -> str:
        bus = DGX_BUSES[self.minor] if self.minor < len(DGX_BUSES) else 0xC0 + self.minor
        return f"0000:{bus:02x}:00.0"

    @property
    def pcie_root(self) -> str:
        bus = int(self.pci_bus_id.split(":")[1], 16)
        return f"pci0000:{bus & 0xC0:02x}"

    @property
    def counter_set(self) -> str:
        return rfc1123(f"{self.name}-counter-set")

    def board_attributes(self) -> dict[str, dict[str, str]]:
        """What a full GPU and its MIG devices both carry (``GpuInfo.Attributes`` less
        ``type`` and ``uuid``; ``CommonAttributesMig`` less ``type``/``parentUUID``/``profile``)."""
        return {
            "productName": {"string": self.model.product},
            "brand": {"string": BRAND},
            "architecture": {"string": self.model.architecture},
            "cudaComputeCapability": {"version": semver(self.model.compute_capability)},
            "driverVersion": {"version": semver(DRIVER_VERSION)},
            "cudaDriverVersion": {"version": semver(CUDA_DRIVER_VERSION)},
            PCI_BUS_ID: {"string": self.pci_bus_id},
            PCIE_ROOT: {"string": self.pcie_root},
        }

    def largest(self) -> dict[str, int]:
        """Per capacity, the largest any MIG profile announces (the driver's
        ``maxCapacities``, gathered while it walks the profiles)."""
        out: dict[str, int] = {}
        for p in self.model.profiles:
            for key, value in p.capacity().items():
                out[key] = max(out.get(key, 0), value)
        return out

    def memory_slices(self) -> int:
        return max(p.size for p in self.model.profiles)

    def device(self) -> dict[str, Any]:
        """The whole GPU as published without partitionable devices (``GpuInfo.GetDevice``)."""
        return {
            "name": self.name,
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": self.uuid}, **self.board_attributes()},
            "capacity": {"memory": {"value": quantity(self.model.memory_mib * 2**20)}},
        }

    def partitionable_device(self) -> dict[str, Any]:
        """The whole GPU of a partitionable pool (``GpuInfo.PartGetDevice``): the largest
        capacities, consuming every counter of its set."""
        device = self.device()
        largest = self.largest()
        device["capacity"] = {k: {"value": quantity(v)} for k, v in sorted(largest.items())}
        device["consumesCounters"] = [{
            "counterSet": self.counter_set,
            "counters": _counters(largest, 0, self.memory_slices()),
        }]
        return device

    def counter_set_object(self) -> dict[str, Any]:
        """This GPU's one counter set (``GpuInfo.PartSharedCounterSets``)."""
        return {"name": self.counter_set, "counters": _counters(self.largest(), 0, self.memory_slices())}

    def mig_name(self, profile: MigProfile, start: int) -> str:
        return f"{self.name}-mig-{rfc1123(profile.name.replace('.', ''))}-{profile.profile_id}-{start}"

    def mig_attributes(self, profile: MigProfile) -> dict[str, dict[str, str]]:
        return {
            "type": {"string": "mig"}, "parentUUID": {"string": self.uuid},
            "profile": {"string": profile.name}, **self.board_attributes(),
        }

    def static_mig_device(self, profile: MigProfile, start: int) -> dict[str, Any]:
        """An existing MIG device (``MigDeviceInfo.GetDevice``): its own UUID, and one
        ``memorySlice<i>`` capacity per memory slice it holds."""
        capacity = {k: {"value": quantity(v)} for k, v in sorted(profile.capacity().items())}
        for i in range(start, start + profile.size):
            capacity[f"memorySlice{i}"] = {"value": "1"}
        return {
            "name": self.mig_name(profile, start),
            "attributes": {**self.mig_attributes(profile),
                           "uuid": {"string": "MIG-" + _stable_uuid(self.node, self.minor, profile.name, start)}},
            "capacity": capacity,
        }

    def partition(self, profile: MigProfile, start: int) -> dict[str, Any]:
        """A MIG device the driver would create on allocation (``MigSpec.PartGetDevice``):
        no UUID yet; it consumes its capacity and its memory slices from the GPU's set."""
        return {
            "name": self.mig_name(profile, start),
            "attributes": self.mig_attributes(profile),
            "capacity": {k: {"value": quantity(v)} for k, v in sorted(profile.capacity().items())},
            "consumesCounters": [{
                "counterSet": self.counter_set,
                "counters": _counters(profile.capacity(), start, profile.size),
            }],
        }


def _counters(capacity: Mapping[str, int], start: int, size: int) -> dict[str, dict[str, str]]:
    """Capacities as counters (``capacitiesToCounters``) plus ``memory-slice-<i>: 1`` for
    the ``size`` slices from ``start`` (``addCountersForMemSlices``)."""
    counters = {dns_name(k): {"value": quantity(v)} for k, v in sorted(capacity.items())}
    for i in range(start, start + size):
        counters[f"memory-slice-{i}"] = {"value": "1"}
    return counters


# -- slices ------------------------------------------------------------------------------

_SUFFIX_LETTERS = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver draws generated names from


def _slice(node: str, index: int, count: int, generation: int, node_uid: str | None,
           body: Mapping[str, Any], driver: str = DRIVER) -> dict[str, Any]:
    """One ResourceSlice as the resourceslice controller creates it; the name the apiserver
    would generate gets a suffix derived from the node, generation and index."""
    width = max(5, len(f"{count - 1:x}"))
    prefix = f"{index:0{width}x}-{driver}-{node}-"
    digest = hashlib.sha256(f"{node}/{generation}/{index}".encode()).digest()
    suffix = "".join(_SUFFIX_LETTERS[b % len(_SUFFIX_LETTERS)] for b in digest[:5])
    meta: dict[str, Any] = {"name": prefix + suffix, "generateName": prefix}
    if node_uid is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                    "controller": True}]
    return {
        "apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **body,
        },
    }


def _pool(node: str, bodies: Sequence[Mapping[str, Any]], generation: int, node_uid: str | None,
          driver: str = DRIVER) -> list[dict[str, Any]]:
    return [_slice(node, i, len(bodies), generation, node_uid, b, driver) for i, b in enumerate(bodies)]


def _model(product: str) -> GpuModel:
    try:
        return MODELS[product]
    except KeyError:
        raise ValueError(f"no GPU model {product!r} (known: {', '.join(MODELS)})") from None


def gpu_node_slices(node: str, *, gpus: int = 8, product: str = A100_40GB.product, mig: str = "none",
                    generation: int = 1, node_uid: str | None = None,
                    layout: Sequence[tuple[str, int]] | None = None) -> list[dict[str, Any]]:
    """The ResourceSlices NVIDIA's GPU kubelet plugin publishes for ``node`` with ``gpus``
    boards of ``product`` (a key of :data:`MODELS`).

    ``mig``: ``"none"``, every GPU whole, in one slice; ``"static"``, MIG enabled on every
    GPU with the MIG devices of ``layout`` ((profile, placement start); the model's
    balanced layout by default) created, the whole GPUs not announced, all in one slice;
    ``"partitionable"`` (the driver's DynamicMIG gate), one slice of counter sets and one
    slice per GPU holding the whole GPU and every possible MIG placement.

    ``node_uid``: the Node's UID, for the owner reference the plugin sets (without it the
    slices have no owner: a reference to a UID that does not exist would have the garbage
    collector delete them). A ``ValueError`` says what is wrong with the arguments."""
    model = _model(product)
    if mig not in MIG_MODES:
        raise ValueError(f"mig must be one of {', '.join(MIG_MODES)}, got {mig!r}")
    if gpus < 1:
        raise ValueError(f"a node publishes at least one GPU, got gpus={gpus}")
    if generation < 1:
        raise ValueError(f"a pool's generation starts at 1, got {generation}")
    if layout is not None and mig != "static":
        raise ValueError("a MIG layout applies to mig='static' only")
    boards = [_Gpu(node, minor, model) for minor in range(gpus)]
    if mig == "partitionable":
        return _pool(node, _partitionable_bodies(boards), generation, node_uid)
    if mig == "static":
        placed = _check_layout(model, layout if layout is not None else model.balanced)
        devices = [b.static_mig_device(p, start) for b in boards for p, start in placed]
    else:
        devices = [b.device() for b in boards]
    return _pool(node, [{"devices": sorted(devices, key=lambda d: str(d["name"]))}], generation, node_uid)


def _partitionable_bodies(boards: Sequence[_Gpu]) -> list[dict[str, Any]]:
    """``generateSplitResourceSlices``: the counter sets of every GPU, then each GPU's devices."""
    if len(boards) > MAX_COUNTER_SETS:
        raise ValueError(
            f"the driver puts every GPU's counter set in one slice, and a slice holds at most "
            f"{MAX_COUNTER_SETS}: {len(boards)} GPUs cannot be published as partitionable devices")
    bodies: list[dict[str, Any]] = [{"sharedCounters": [b.counter_set_object() for b in boards]}]
    for board in sorted(boards, key=lambda b: b.pci_bus_id):
        devices = [board.partitionable_device()]
        devices += [board.partition(p, start) for p in board.model.profiles for start in p.starts]
        bodies.append({"devices": sorted(devices, key=lambda d: str(d["name"]))})
    return bodies


def _check_layout(model: GpuModel, layout: Iterable[tuple[str, int]]) -> list[tuple[MigProfile, int]]:
    """The layout's profiles, each at a placement the profile has, none sharing a memory slice."""
    placed: list[tuple[MigProfile, int]] = []
    used: set[int] = set()
    for name, start in layout:
        profile = model.profile(name)
        if start not in profile.starts:
            raise ValueError(f"MIG profile {name} of {model.product} cannot start at memory slice {start} "
                             f"(its placements start at {', '.join(map(str, profile.starts))})")
        slices = set(range(start, start + profile.size))
        if slices & used:
            raise ValueError(f"MIG device {name} at {start} overlaps another device of the layout")
        used |= slices
        placed.append((profile, start))
    return placed


def shared_gpu_slices(node: str, *, gpus: int = 8, product: str = A100_40GB.product, generation: int = 1,
                      node_uid: str | None = None, memory_step_gi: int = 1) -> list[dict[str, Any]]:
    """``gpus`` whole GPUs that several claims can share by capacity (KEP-5075).

    Each device is NVIDIA's whole GPU (same name, attributes, pool and slice) with
    ``allowMultipleAllocations: true`` and two consumable capacities: ``memory``
    (requests default to ``memory_step_gi`` GiB, in steps of it, up to the board) and
    ``multiprocessors`` (default 1, any whole number up to the board's). The driver itself
    publishes no such device; use these instead of :func:`gpu_node_slices` for a node,
    never both (one pool per node and driver)."""
    model = _model(product)
    if gpus < 1 or memory_step_gi < 1:
        raise ValueError(f"gpus and memory_step_gi must be at least 1, got {gpus} and {memory_step_gi}")
    step = memory_step_gi * 2**30
    devices = []
    for board in (_Gpu(node, minor, model) for minor in range(gpus)):
        device = board.device()
        memory = model.memory_mib * 2**20
        sms = board.largest()["multiprocessors"]
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "memory": {"value": quantity(memory), "requestPolicy": {
                "default": quantity(step),
                "validRange": {"min": quantity(step), "max": quantity(memory - memory % step), "step": quantity(step)},
            }},
            "multiprocessors": {"value": quantity(sms), "requestPolicy": {
                "default": "1", "validRange": {"min": "1", "max": quantity(sms), "step": "1"},
            }},
        }
        devices.append(device)
    return _pool(node, [{"devices": devices}], generation, node_uid)


# -- device classes ----------------------------------------------------------------------


def device_classes(*, extended_resource: bool = True) -> list[dict[str, Any]]:
    """The DeviceClasses of the driver's Helm chart when GPUs are enabled: ``gpu.nvidia.com``,
    ``mig.nvidia.com`` and ``vfio.gpu.nvidia.com``, each selecting the driver's devices of
    one ``type``. On ``resource.k8s.io/v1`` the chart maps the extended resource
    ``nvidia.com/gpu`` to ``gpu.nvidia.com`` (``extended_resource=False`` leaves that out:
    with it, kube-scheduler serves a pod's ``nvidia.com/gpu`` from these devices on nodes
    that do not list that resource). The compute-domain classes belong to the chart's other
    driver (``compute-domain.nvidia.com``) and are not here."""

    def one(name: str, kind: str) -> dict[str, Any]:
        expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}

    gpu = one("gpu.nvidia.com", "gpu")
    if extended_resource:
        gpu["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    return [gpu, one("mig.nvidia.com", "mig"), one("vfio.gpu.nvidia.com", "vfio")]


# -- what a user writes ------------------------------------------------------------------


def device_claim(class_name: str, count: int = 1, selectors: Sequence[str] = (), *, request: str = "gpu",
                 all_devices: bool = False, capacity: Mapping[str, str] | None = None,
                 match_attribute: str | None = None) -> dict[str, Any]:
    """A claim's ``spec``: one request of ``count`` devices of ``class_name`` (or all of
    them) that pass every CEL expression of ``selectors``; ``capacity`` asks a shared
    device for that much of each capacity; ``match_attribute`` (a fully qualified
    attribute name) makes every device of the request agree on it."""
    exactly: dict[str, Any] = {"deviceClassName": class_name}
    if all_devices:
        exactly["allocationMode"] = "All"
    else:
        if count < 1:
            raise ValueError(f"a request asks for at least one device, got count={count}")
        exactly["allocationMode"] = "ExactCount"
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    devices: dict[str, Any] = {"requests": [{"name": request, "exactly": exactly}]}
    if match_attribute:
        devices["constraints"] = [{"requests": [request], "matchAttribute": match_attribute}]
    return {"devices": devices}


def claim_template(name: str, class_name: str, count: int = 1, selectors: Sequence[str] = (),
                   **options: Any) -> dict[str, Any]:
    """A ResourceClaimTemplate; ``options`` as :func:`device_claim`."""
    return {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": device_claim(class_name, count, selectors, **options)}}


def resource_claim(name: str, class_name: str, count: int = 1, selectors: Sequence[str] = (),
                   **options: Any) -> dict[str, Any]:
    """A ResourceClaim of its own, for pods to share by name; ``options`` as :func:`device_claim`."""
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": device_claim(class_name, count, selectors, **options)}


def pod_with_claims(name: str, *, templates: Mapping[str, str] | None = None,
                    claims: Mapping[str, str] | None = None, scheduler: str = "batchsched",
                    containers: int = 1, **spec: Any) -> dict[str, Any]:
    """A pod whose ``spec.resourceClaims`` names, per pod-level claim name, a template
    (``templates``: a claim made for this pod) or an existing claim (``claims``: shared);
    every container uses every claim (``resources.claims``). ``spec`` adds pod spec fields."""
    entries = [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    entries += [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    names = [e["name"] for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"a pod's claim names must be unique, got {names}")
    if not entries:
        raise ValueError("a pod with claims names at least one template or claim")
    body = [{"name": f"c{i}" if containers > 1 else "main", "image": "trainer:latest",
             "resources": {"claims": [{"name": n} for n in names]}} for i in range(containers)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "containers": body, "resourceClaims": entries, **spec}}


__all__ = [
    "A100_40GB", "API_VERSION", "DRIVER", "H100_80GB", "MODELS", "GpuModel", "MigProfile", "claim_template",
    "device_claim", "device_classes", "gpu_node_slices", "pod_with_claims", "quantity", "resource_claim",
    "semver", "shared_gpu_slices",
]
