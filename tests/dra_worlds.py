"""Small random DRA worlds: GPU nodes published as NVIDIA's driver publishes them, and one
pod whose claims ask for devices in one of the shapes a user writes.

A world is drawn from a seed and built twice, as two *copies* that differ only in names
(node, pool, claim, template, pod) and scheduler: one for kube-scheduler, one for
batchsched (``tests/integration/test_dra_differential.py``). Every device selector the
world asks for is drawn together with a Python predicate saying the same thing, so the
checker of :mod:`tests.dra_check` judges an allocation without any CEL evaluator.

What a world may hold:

* nodes (one or two), each with one pool of: whole GPUs (1-4, A100 or H100), static MIG
  (the board's balanced layout on 1-2 GPUs), partitionable MIG (1-2 GPUs, shared
  counters) or GPUs shared by consumable capacity (1-2);
* one pod with one or two claims (a template, or a ResourceClaim of its own name), each
  with one or two requests: class ``gpu.nvidia.com`` or ``mig.nvidia.com``, ExactCount
  1-4 or All, CEL selectors on productName, memory capacity, driverVersion and the MIG
  profile, ``firstAvailable`` subrequests, a capacity request, and ``matchAttribute`` /
  ``distinctAttribute`` constraints.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchsched.sandbox import gpudra

D = gpudra.DRIVER
#: a device as the predicates see it: fully qualified attribute name -> value (strings,
#: versions as int tuples), and capacity name -> integer value
Attrs = Mapping[str, Any]
Caps = Mapping[str, int]
Predicate = Callable[[Attrs, Caps], bool]

KINDS = ("whole", "static", "partitionable", "shared")
PRODUCTS = tuple(gpudra.MODELS)
GI = 2**30


def parse_quantity(text: str) -> int:
    """The few quantity forms the worlds and kube-scheduler write: ``40Gi``, ``4864Mi``, ``14``."""
    for suffix, power in (("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * (1 << power)
    return int(text)


def device_view(device: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """A slice's device as (attributes, capacity) for the predicates."""
    attrs: dict[str, Any] = {}
    for name, value in (device.get("attributes") or {}).items():
        key = name if "/" in name else f"{D}/{name}"
        [(kind, v)] = value.items()
        attrs[key] = tuple(int(p) for p in v.split(".")) if kind == "version" else v
    caps = {k: parse_quantity(v["value"]) for k, v in (device.get("capacity") or {}).items()}
    return attrs, caps


@dataclass(slots=True, frozen=True)
class Selector:
    """A CEL expression and the predicate that means the same."""

    cel: str
    test: Predicate


#: each DeviceClass of the driver's chart, as a predicate
CLASSES: dict[str, Predicate] = {
    "gpu.nvidia.com": lambda a, c: a.get(f"{D}/type") == "gpu",
    "mig.nvidia.com": lambda a, c: a.get(f"{D}/type") == "mig",
}


def _product(p: str) -> Selector:
    return Selector(f"device.attributes['{D}'].productName == '{p}'", lambda a, c: a.get(f"{D}/productName") == p)


def _memory(gi: int) -> Selector:
    return Selector(f"device.capacity['{D}'].memory.compareTo(quantity('{gi}Gi')) >= 0",
                    lambda a, c: "memory" in c and c["memory"] >= gi * GI)


def _driver_version(v: str) -> Selector:
    want = tuple(int(p) for p in v.split("."))
    return Selector(f"device.attributes['{D}'].driverVersion.compareTo(semver('{v}')) >= 0",
                    lambda a, c: f"{D}/driverVersion" in a and a[f"{D}/driverVersion"] >= want)


def _profile(p: str) -> Selector:
    return Selector(f"device.attributes['{D}'].profile == '{p}'", lambda a, c: a.get(f"{D}/profile") == p)


@dataclass(slots=True)
class Shape:
    """What one request (or subrequest) asks: class, count (0 = All), selectors, capacity."""

    cls: str
    count: int
    selectors: list[Selector]
    capacity: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"deviceClassName": self.cls}
        if self.count:
            out.update(allocationMode="ExactCount", count=self.count)
        else:
            out["allocationMode"] = "All"
        if self.selectors:
            out["selectors"] = [{"cel": {"expression": s.cel}} for s in self.selectors]
        if self.capacity:
            out["capacity"] = {"requests": dict(self.capacity)}
        return out

    def matches(self, attrs: Attrs, caps: Caps) -> bool:
        """Class and selectors (the capacity a request asks is the checker's own matter)."""
        return CLASSES[self.cls](attrs, caps) and all(s.test(attrs, caps) for s in self.selectors)


@dataclass(slots=True)
class Request:
    name: str
    shapes: list[Shape]  # one: ``exactly``; more: ``firstAvailable`` subrequests s0, s1, ...

    def body(self) -> dict[str, Any]:
        if len(self.shapes) == 1:
            return {"name": self.name, "exactly": self.shapes[0].body()}
        return {"name": self.name,
                "firstAvailable": [{"name": f"s{i}", **s.body()} for i, s in enumerate(self.shapes)]}

    def shape_of(self, result_request: str) -> Shape | None:
        """The shape a result's ``request`` field names (``r`` or ``r/s1``)."""
        head, _, sub = result_request.partition("/")
        if head != self.name or (len(self.shapes) > 1) != bool(sub):
            return None
        if not sub:
            return self.shapes[0]
        index = int(sub[1:]) if sub[:1] == "s" and sub[1:].isdigit() else -1
        return self.shapes[index] if 0 <= index < len(self.shapes) else None


@dataclass(slots=True)
class Constraint:
    requests: list[str]  # empty: every request of the claim
    attribute: str
    distinct: bool

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"distinctAttribute" if self.distinct else "matchAttribute": self.attribute}
        if self.requests:
            out["requests"] = list(self.requests)
        return out


@dataclass(slots=True)
class Claim:
    """One pod claim: ``named`` a ResourceClaim of its own, else made from a template."""

    key: str  # the pod's claim name
    named: bool
    requests: list[Request]
    constraints: list[Constraint]

    def spec(self) -> dict[str, Any]:
        devices: dict[str, Any] = {"requests": [r.body() for r in self.requests]}
        if self.constraints:
            devices["constraints"] = [c.body() for c in self.constraints]
        return {"devices": devices}


@dataclass(slots=True)
class Node:
    kind: str
    product: str
    gpus: int


@dataclass(slots=True)
class World:
    index: int
    nodes: list[Node]
    claims: list[Claim]

    def describe(self) -> str:
        nodes = ", ".join(f"{n.kind} {n.gpus}x{n.product.split()[1]}" for n in self.nodes)
        return f"world {self.index} [{nodes}]: " + "; ".join(
            f"{c.key}{'(named)' if c.named else ''}={c.spec()['devices']}" for c in self.claims)

    # -- one copy ------------------------------------------------------------------------

    def prefix(self, copy: str) -> str:
        return f"w{self.index:03d}{copy}"

    def node_names(self, copy: str) -> list[str]:
        return [f"{self.prefix(copy)}-{i}" for i in range(len(self.nodes))]

    def slices(self, copy: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for node, name in zip(self.nodes, self.node_names(copy), strict=True):
            if node.kind == "shared":
                out += gpudra.shared_gpu_slices(name, gpus=node.gpus, product=node.product)
            else:
                mig = "none" if node.kind == "whole" else node.kind
                out += gpudra.gpu_node_slices(name, gpus=node.gpus, product=node.product, mig=mig)
        return out

    def claim_name(self, copy: str, claim: Claim) -> str:
        return f"{self.prefix(copy)}-{claim.key}"

    def claim_objects(self, copy: str) -> list[tuple[str, dict[str, Any]]]:
        """(collection, body) of the named claims and the templates, namespaced paths relative."""
        out = []
        for c in self.claims:
            meta = {"name": self.claim_name(copy, c)}
            if c.named:
                out.append(("resourceclaims", {"apiVersion": gpudra.API_VERSION, "kind": "ResourceClaim",
                                               "metadata": meta, "spec": c.spec()}))
            else:
                out.append(("resourceclaimtemplates", {"apiVersion": gpudra.API_VERSION,
                                                       "kind": "ResourceClaimTemplate",
                                                       "metadata": meta, "spec": {"spec": c.spec()}}))
        return out

    def pod(self, copy: str, scheduler: str, label: str) -> dict[str, Any]:
        """The world's pod, kept to the copy's nodes by ``label`` (the nodes' prefix label)."""
        return gpudra.pod_with_claims(
            self.prefix(copy), scheduler=scheduler,
            templates={c.key: self.claim_name(copy, c) for c in self.claims if not c.named},
            claims={c.key: self.claim_name(copy, c) for c in self.claims if c.named},
            nodeSelector={label: self.prefix(copy)},
        )


# -- drawing -------------------------------------------------------------------------------


def _node(rng: random.Random) -> Node:
    kind = rng.choice(KINDS)
    gpus = rng.randint(1, 4) if kind == "whole" else rng.randint(1, 2)
    return Node(kind, rng.choice(PRODUCTS), gpus)


def _selectors(rng: random.Random, cls: str) -> list[Selector]:
    pool: list[Callable[[], Selector]] = [
        lambda: _product(rng.choice(PRODUCTS)),
        lambda: _memory(rng.choice((5, 10, 20, 40))),
        lambda: _driver_version(rng.choice(("550.0.0", "570.124.6", "570.124.6", "580.1.0"))),
    ]
    if cls == "mig.nvidia.com":
        profiles = sorted({p.name for m in gpudra.MODELS.values() for p in m.profiles})
        pool.append(lambda: _profile(rng.choice(profiles)))
    return [make() for make in rng.sample(pool, k=rng.choice((0, 0, 0, 1, 1, 2)))]


def _shape(rng: random.Random, shared: bool, mig: float) -> Shape:
    # mostly a class the world's nodes offer: a world nothing could serve says little
    cls = "mig.nvidia.com" if rng.random() < mig else "gpu.nvidia.com"
    count = 0 if rng.random() < 0.08 else rng.choice((1, 1, 1, 1, 2, 2, 3, 4))
    shape = Shape(cls, count, _selectors(rng, cls))
    if cls == "gpu.nvidia.com" and rng.random() < (0.5 if shared else 0.1):
        shape.capacity = rng.choice(({"memory": "16Gi"}, {"memory": "30Gi"}, {"memory": "7Gi", "multiprocessors": "20"},
                                     {"memory": "50Gi"}))
    return shape


#: attributes worth a constraint: equal or not among a node's devices
MATCHABLE = (f"{D}/productName", f"{D}/parentUUID", "resource.kubernetes.io/pcieRoot", f"{D}/type", f"{D}/profile")
DISTINCT = (f"{D}/uuid", "resource.kubernetes.io/pciBusID", f"{D}/parentUUID", f"{D}/profile")


def _claim(rng: random.Random, key: str, shared: bool, mig: float) -> Claim:
    requests = []
    for r in range(rng.choice((1, 1, 1, 2))):
        subs = 2 if rng.random() < 0.25 else 1
        requests.append(Request(f"r{r}", [_shape(rng, shared, mig) for _ in range(subs)]))
    constraints = []
    if rng.random() < 0.35:
        distinct = rng.random() < 0.4
        names = [r.name for r in requests] if rng.random() < 0.5 else []
        constraints.append(Constraint(names, rng.choice(DISTINCT if distinct else MATCHABLE), distinct))
    return Claim(key, rng.random() < 0.3, requests, constraints)


def draw(rng: random.Random, index: int) -> World:
    nodes = [_node(rng) for _ in range(rng.choice((1, 1, 2)))]
    shared = any(n.kind == "shared" for n in nodes)
    # how often a request asks for MIG devices: mostly what the world's nodes offer
    mig = 0.05 + 0.75 * sum(n.kind in ("static", "partitionable") for n in nodes) / len(nodes)
    claims = [_claim(rng, f"c{i}", shared, mig) for i in range(rng.choice((1, 1, 1, 2)))]
    return World(index, nodes, claims)


__all__ = ["CLASSES", "Claim", "Constraint", "Node", "Request", "Selector", "Shape", "World", "device_view", "draw",
           "parse_quantity"]
