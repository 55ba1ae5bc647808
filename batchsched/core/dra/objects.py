"""The ``resource.k8s.io/v1`` objects the structured allocator reads, as frozen values.

ResourceSlices (what drivers publish), DeviceClasses (what administrators offer),
DeviceTaintRules (taints an administrator puts on devices) and ResourceClaims (what pods
ask for) are parsed once into dataclasses; the allocator in
:mod:`batchsched.core.dra.allocator` works on these values only. A rule's taint is added
to the devices it matches when the slices are grouped into :class:`Pools`, so the
allocator sees it as a taint the driver published.

Errors: every ``parse_*`` function raises :class:`DraError` (a ``ValueError``) whose
message a user reads, naming the object and the field ("ResourceClaim ns/c: request
gpu: allocationMode 'Some' is not ExactCount or All"). Nothing else escapes a parse.
A field this module does not implement is refused the same way, never dropped:

- slices: ``nodeAllocatableResources``, ``compatibilityGroups`` and list-valued
  attributes (``ints``/``strings``/...) make the slice unreadable, so its pool counts
  as incomplete, as upstream treats a slice it cannot read;
- claims: ``derivedAttributes``, a selector other than ``cel``, a constraint other than
  ``matchAttribute``/``distinctAttribute``.

Devices with ``bindingConditions`` are parsed but never allocated (the scheduler does
not wait for binding conditions); the allocator says so when one would have matched.
``bindsToNode`` is honoured: the allocation is pinned to the node.

Rules taken from upstream (k8s.io/dynamic-resource-allocation/structured):

- an attribute or capacity name without a domain belongs to the driver's domain, so
  ``model`` of driver ``gpu.nvidia.com`` is ``gpu.nvidia.com/model``;
- of a pool (driver, pool name) only the slices of the newest generation count, and
  only when all ``resourceSliceCount`` of them are present: an incomplete pool offers
  no device (and a request for ``All`` devices fails while it is incomplete);
- a pool with a duplicate device name, a duplicate counter set, or a device consuming
  a counter its pool does not declare is invalid and offers no device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cached_property
from typing import TYPE_CHECKING, Any

from batchsched.core.model import Requirement, Term, parse_node_terms, parse_time
from batchsched.core.quantity import QuantityError, parse_quantity

if TYPE_CHECKING:
    from batchsched.core.dra.cel import DeviceEnv  # type: ignore[import-not-found,unused-ignore]

#: upstream's limit on devices in one claim's allocation (AllocationResultsMaxSize)
MAX_RESULTS_PER_CLAIM = 32

_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = ("ints", "bools", "strings", "versions")
_NAME_FIELD = "metadata.name"


class DraError(ValueError):
    """A DRA object that cannot be read or asks for something not implemented; the
    message says which object and field, for a user to read."""


# ---------------------------------------------------------------- small values


@dataclass(slots=True, frozen=True)
class Qty:
    """A quantity: its exact value and the text it was written as (kept for output)."""

    value: Decimal
    text: str

    @staticmethod
    def of(raw: Any, where: str) -> Qty:
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise DraError(f"{where}: {raw!r} is not a quantity")
        try:
            value = parse_quantity(raw)
        except QuantityError as exc:
            raise DraError(f"{where}: {exc}") from None
        return Qty(value, str(raw).strip())


@dataclass(slots=True, frozen=True)
class DeviceId:
    """A device as allocation results name it: ``<driver>/<pool>/<device>``."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(slots=True, frozen=True)
class CounterId:
    """One counter of one counter set of one pool."""

    driver: str
    pool: str
    counter_set: str
    counter: str


@dataclass(slots=True, frozen=True)
class NodeSelector:
    """A ``v1.NodeSelector``: terms ORed. ``raw`` is kept to copy into allocations."""

    terms: tuple[Term, ...]
    raw: Mapping[str, Any]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        return any(_term_matches(t, name, labels) for t in self.terms)


def _term_matches(term: Term, name: str, labels: Mapping[str, str]) -> bool:
    """A node selector term: every requirement holds; an empty term matches nothing."""
    if not term.expressions and not term.fields:
        return False
    return all(_expression_matches(r, labels) for r in term.expressions) and all(
        _field_matches(r, name) for r in term.fields
    )


def _expression_matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, bound = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _field_matches(req: Requirement, name: str) -> bool:
    if req.key != _NAME_FIELD:
        return False
    if req.operator == "In":
        return name in req.values
    if req.operator == "NotIn":
        return name not in req.values
    return False


def _node_selector(raw: Any, where: str, *, one_term: bool = True) -> NodeSelector | None:
    """A node selector; a slice's or device's must have exactly one term (upstream
    validation), an allocation's may have any number."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise DraError(f"{where}: nodeSelector is not an object")
    terms = raw.get("nodeSelectorTerms") or []
    if not isinstance(terms, list) or not all(isinstance(t, Mapping) for t in terms):
        raise DraError(f"{where}: nodeSelector.nodeSelectorTerms is not a list of terms")
    if one_term and len(terms) != 1:
        raise DraError(f"{where}: nodeSelector must have exactly one term")
    return NodeSelector(parse_node_terms(terms), dict(raw))


# ---------------------------------------------------------------- slices


@dataclass(slots=True, frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str


@dataclass(slots=True, frozen=True)
class CapacityPolicy:
    """``requestPolicy`` of a consumable capacity (only on allowMultipleAllocations)."""

    default: Qty | None = None
    valid_values: tuple[Qty, ...] = ()
    min: Qty | None = None
    max: Qty | None = None
    step: Qty | None = None
    has_range: bool = False


@dataclass(slots=True, frozen=True)
class Capacity:
    value: Qty
    policy: CapacityPolicy | None = None


@dataclass(slots=True, frozen=True)
class CounterUse:
    """What a device consumes of one counter set while it is allocated."""

    counter_set: str
    counters: Mapping[str, Decimal]


@dataclass(frozen=True)
class Device:
    """One device of a slice. ``attributes`` are keyed by fully qualified name and hold
    the API values (``{"int": 3}``); ``capacity`` is keyed by the name as published
    (claims' capacity requests and results use that name)."""

    driver: str
    pool: str
    name: str
    slice_name: str
    attributes: Mapping[str, Mapping[str, Any]]
    capacity: Mapping[str, Capacity]
    consumes: tuple[CounterUse, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    allow_multiple: bool = False
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False

    @property
    def id(self) -> DeviceId:
        return DeviceId(self.driver, self.pool, self.name)

    def qualified(self, name: str) -> str:
        return name if "/" in name else f"{self.driver}/{name}"

    @cached_property
    def env(self) -> DeviceEnv:
        """The CEL input of this device, built once."""
        from batchsched.core.dra.cel import device_env  # type: ignore[import-not-found,unused-ignore]

        cap = {self.qualified(k): {"value": c.value.text} for k, c in self.capacity.items()}
        return device_env(self.driver, self.attributes, cap, self.allow_multiple)


@dataclass(slots=True, frozen=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node_name: str | None
    node_selector: NodeSelector | None
    all_nodes: bool
    per_device_node_selection: bool
    devices: tuple[Device, ...]
    shared_counters: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)
    skip_node_operations: tuple[str, ...] = ()

    def serves(self, node: str, labels: Mapping[str, str]) -> bool:
        """Whether any device of this slice may be used on the node."""
        if self.per_device_node_selection:
            return any(_device_serves(d, node, labels) for d in self.devices)
        return _place_serves(self.node_name, self.all_nodes, self.node_selector, node, labels)


def _place_serves(
    name: str | None, all_nodes: bool, selector: NodeSelector | None, node: str, labels: Mapping[str, str]
) -> bool:
    if name is not None:
        return name == node
    if all_nodes:
        return True
    return selector is not None and selector.matches(node, labels)


def _device_serves(d: Device, node: str, labels: Mapping[str, str]) -> bool:
    return _place_serves(d.node_name, d.all_nodes, d.node_selector, node, labels)


def _obj(raw: Any, where: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise DraError(f"{where} is not an object")
    return raw


def _list(raw: Any, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise DraError(f"{where} is not a list")
    return raw


def _str(raw: Any, where: str, *, required: bool = True) -> str:
    if raw is None or raw == "":
        if required:
            raise DraError(f"{where} is missing")
        return ""
    if not isinstance(raw, str):
        raise DraError(f"{where} is not a string")
    return raw


def _int(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise DraError(f"{where} is not an integer")
    return raw


def _bool(raw: Any, where: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise DraError(f"{where} is not a boolean")
    return raw


def _strs(raw: Any, where: str) -> tuple[str, ...]:
    return tuple(_str(v, where) for v in _list(raw, where))


def parse_resource_slice(obj: Mapping[str, Any]) -> ResourceSlice:
    """A ResourceSlice; raises :class:`DraError` naming the slice and field."""
    name = _str(_obj(obj.get("metadata"), "metadata").get("name"), "ResourceSlice metadata.name")
    where = f"ResourceSlice {name}"
    spec = _obj(obj.get("spec"), f"{where}: spec")
    if spec.get("nodeAllocatableResources"):
        raise DraError(f"{where}: nodeAllocatableResources is not supported")
    driver = _str(spec.get("driver"), f"{where}: spec.driver")
    pool = _obj(spec.get("pool"), f"{where}: spec.pool")
    pool_name = _str(pool.get("name"), f"{where}: spec.pool.name")
    count = _int(pool.get("resourceSliceCount"), f"{where}: spec.pool.resourceSliceCount")
    if count < 1:
        raise DraError(f"{where}: spec.pool.resourceSliceCount must be at least 1")
    node_name = _str(spec.get("nodeName"), f"{where}: spec.nodeName", required=False) or None
    selector = _node_selector(spec.get("nodeSelector"), f"{where}: spec")
    all_nodes = _bool(spec.get("allNodes"), f"{where}: spec.allNodes")
    per_device = _bool(spec.get("perDeviceNodeSelection"), f"{where}: spec.perDeviceNodeSelection")
    if sum((node_name is not None, selector is not None, all_nodes, per_device)) > 1:
        raise DraError(f"{where}: more than one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection")
    devices = tuple(
        _device(d, driver, pool_name, name, per_device, where, i)
        for i, d in enumerate(_list(spec.get("devices"), f"{where}: spec.devices"))
    )
    return ResourceSlice(
        name=name, driver=driver, pool=pool_name,
        generation=_int(pool.get("generation", 0), f"{where}: spec.pool.generation"),
        slice_count=count, node_name=node_name, node_selector=selector, all_nodes=all_nodes,
        per_device_node_selection=per_device, devices=devices,
        shared_counters=_counter_sets(spec.get("sharedCounters"), where),
        skip_node_operations=_strs(spec.get("skipNodeOperations"), f"{where}: spec.skipNodeOperations"),
    )


def _counter_sets(raw: Any, where: str) -> dict[str, Mapping[str, Decimal]]:
    sets: dict[str, Mapping[str, Decimal]] = {}
    for i, cs in enumerate(_list(raw, f"{where}: spec.sharedCounters")):
        cs = _obj(cs, f"{where}: sharedCounters #{i}")
        set_name = _str(cs.get("name"), f"{where}: sharedCounters #{i}.name")
        if set_name in sets:
            raise DraError(f"{where}: counter set {set_name} is declared twice")
        sets[set_name] = _counters(cs.get("counters"), f"{where}: counter set {set_name}")
    return sets


def _counters(raw: Any, where: str) -> dict[str, Decimal]:
    return {
        str(k): Qty.of(_obj(v, f"{where}: counter {k}").get("value"), f"{where}: counter {k}").value
        for k, v in _obj(raw, where).items()
    }


def _device(
    raw: Any, driver: str, pool: str, slice_name: str, per_device: bool, in_slice: str, index: int
) -> Device:
    d = _obj(raw, f"{in_slice}: device #{index}")
    name = _str(d.get("name"), f"{in_slice}: device #{index}: name")
    where = f"{in_slice}: device {name}"
    node_name = _str(d.get("nodeName"), f"{where}: nodeName", required=False) or None
    selector = _node_selector(d.get("nodeSelector"), where)
    all_nodes = _bool(d.get("allNodes"), f"{where}: allNodes")
    placed = sum((node_name is not None, selector is not None, all_nodes))
    if per_device and placed != 1:
        raise DraError(f"{where}: with perDeviceNodeSelection exactly one of nodeName, nodeSelector, allNodes")
    if not per_device and placed:
        raise DraError(f"{where}: nodeName/nodeSelector/allNodes only with perDeviceNodeSelection")
    consumes = []
    for i, c in enumerate(_list(d.get("consumesCounters"), f"{where}: consumesCounters")):
        c = _obj(c, f"{where}: consumesCounters #{i}")
        if c.get("compatibilityGroups"):
            raise DraError(f"{where}: consumesCounters.compatibilityGroups is not supported")
        set_name = _str(c.get("counterSet"), f"{where}: consumesCounters #{i}.counterSet")
        consumes.append(CounterUse(set_name, _counters(c.get("counters"), f"{where}: consumesCounters {set_name}")))
    return Device(
        driver=driver, pool=pool, name=name, slice_name=slice_name,
        attributes=_attributes(d.get("attributes"), driver, where),
        capacity=_capacities(d.get("capacity"), where),
        consumes=tuple(consumes),
        taints=tuple(_taint(t, f"{where}: taint #{i}") for i, t in enumerate(_list(d.get("taints"), where))),
        allow_multiple=_bool(d.get("allowMultipleAllocations"), f"{where}: allowMultipleAllocations"),
        binds_to_node=_bool(d.get("bindsToNode"), f"{where}: bindsToNode"),
        binding_conditions=_strs(d.get("bindingConditions"), f"{where}: bindingConditions"),
        binding_failure_conditions=_strs(d.get("bindingFailureConditions"), f"{where}: bindingFailureConditions"),
        node_name=node_name, node_selector=selector, all_nodes=all_nodes,
    )


def _attributes(raw: Any, driver: str, where: str) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for key, value in _obj(raw, f"{where}: attributes").items():
        value = _obj(value, f"{where}: attribute {key}")
        kinds = [k for k in value if value[k] is not None]
        listed = [k for k in kinds if k in _LIST_KINDS]
        if listed:
            raise DraError(f"{where}: attribute {key}: list values ({listed[0]}) are not supported")
        if len(kinds) != 1 or kinds[0] not in _ATTRIBUTE_KINDS:
            raise DraError(f"{where}: attribute {key} must have exactly one of int, bool, string, version")
        kind = kinds[0]
        expected = {"int": int, "bool": bool, "string": str, "version": str}[kind]
        v = value[kind]
        if not isinstance(v, expected) or (kind == "int" and isinstance(v, bool)):
            raise DraError(f"{where}: attribute {key}: {kind} value {v!r} has the wrong type")
        qualified = key if "/" in key else f"{driver}/{key}"
        if qualified in out:
            raise DraError(f"{where}: attribute {qualified} is given twice")
        out[qualified] = {kind: v}
    return out


def _capacities(raw: Any, where: str) -> dict[str, Capacity]:
    out: dict[str, Capacity] = {}
    for key, value in _obj(raw, f"{where}: capacity").items():
        w = f"{where}: capacity {key}"
        value = _obj(value, w)
        out[str(key)] = Capacity(Qty.of(value.get("value"), w), _policy(value.get("requestPolicy"), w))
    return out


def _policy(raw: Any, where: str) -> CapacityPolicy | None:
    if raw is None:
        return None
    p = _obj(raw, f"{where}: requestPolicy")
    w = f"{where}: requestPolicy"

    def q(v: Any, name: str) -> Qty | None:
        return None if v is None else Qty.of(v, f"{w}.{name}")

    rng = p.get("validRange")
    r = _obj(rng, f"{w}.validRange")
    values = tuple(Qty.of(v, f"{w}.validValues") for v in _list(p.get("validValues"), f"{w}.validValues"))
    if rng is not None and values:
        raise DraError(f"{w}: validRange and validValues are exclusive")
    policy = CapacityPolicy(
        default=q(p.get("default"), "default"), valid_values=values,
        min=q(r.get("min"), "validRange.min"), max=q(r.get("max"), "validRange.max"),
        step=q(r.get("step"), "validRange.step"), has_range=rng is not None,
    )
    if policy.step is not None and policy.step.value <= 0:
        raise DraError(f"{w}: validRange.step must be positive")
    return policy


def _taint(raw: Any, where: str) -> DeviceTaint:
    t = _obj(raw, where)
    return DeviceTaint(
        key=_str(t.get("key"), f"{where}.key"),
        value=_str(t.get("value"), f"{where}.value", required=False),
        effect=_str(t.get("effect"), f"{where}.effect", required=False),
    )


# ---------------------------------------------------------------- classes


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    config: tuple[Mapping[str, Any], ...]  # DeviceConfiguration objects, as written
    extended_resource_name: str | None = None
    #: ``metadata.creationTimestamp`` (Unix seconds): of two classes naming one extended
    #: resource, the newer serves it
    created: float = 0.0


def _selectors(raw: Any, where: str) -> tuple[str, ...]:
    out = []
    for i, s in enumerate(_list(raw, f"{where}: selectors")):
        s = _obj(s, f"{where}: selector #{i}")
        cel = s.get("cel")
        if cel is None:
            raise DraError(f"{where}: selector #{i} has no cel expression (only cel selectors are supported)")
        out.append(_str(_obj(cel, f"{where}: selector #{i}.cel").get("expression"), f"{where}: selector #{i}.cel.expression"))
    return tuple(out)


def _device_config(raw: Any, where: str) -> dict[str, Any]:
    c = _obj(raw, where)
    if not isinstance(c.get("opaque"), Mapping):
        raise DraError(f"{where}: only opaque configuration is supported")
    return {"opaque": dict(c["opaque"])}


def parse_device_class(obj: Mapping[str, Any]) -> DeviceClass:
    """A DeviceClass; raises :class:`DraError`."""
    meta = _obj(obj.get("metadata"), "metadata")
    name = _str(meta.get("name"), "DeviceClass metadata.name")
    where = f"DeviceClass {name}"
    spec = _obj(obj.get("spec"), f"{where}: spec")
    return DeviceClass(
        name=name,
        created=parse_time(meta.get("creationTimestamp")),
        selectors=_selectors(spec.get("selectors"), where),
        config=tuple(_device_config(c, f"{where}: config #{i}") for i, c in enumerate(_list(spec.get("config"), where))),
        extended_resource_name=_str(spec.get("extendedResourceName"), f"{where}: extendedResourceName", required=False) or None,
    )


# ---------------------------------------------------------------- taint rules


@dataclass(slots=True, frozen=True)
class DeviceTaintRule:
    """A ``DeviceTaintRule``: its taint on every device its selector matches, as if the
    driver had published the taint in the device's ResourceSlice. A field of the selector
    left unset matches any value; a rule without ``deviceSelector`` matches no device
    (upstream's rule: only an empty selector matches every device)."""

    name: str
    taint: DeviceTaint
    selects: bool  # False: no deviceSelector, no device is tainted
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    def covers(self, driver: str, pool: str) -> bool:
        """Whether some device of pool ``driver``/``pool`` may match."""
        return self.selects and self.driver in (None, driver) and self.pool in (None, pool)

    def matches(self, device: Device) -> bool:
        return self.covers(device.driver, device.pool) and self.device in (None, device.name)


#: fields of a rule's selector the API had once and removed in 1.35: refused if present
#: (an older client's object), since a rule read without them would taint more devices
_REMOVED_SELECTOR_FIELDS = ("deviceClassName", "selectors")


def parse_device_taint_rule(obj: Mapping[str, Any]) -> DeviceTaintRule:
    """A DeviceTaintRule; raises :class:`DraError` naming the rule and field.

    Its taint's effect is kept as written: only ``NoSchedule`` and ``NoExecute`` keep a
    device from new claims, and ``None`` or an effect this version does not know has no
    effect on scheduling (the API asks consumers to treat unknown effects as ``None``)."""
    name = _str(_obj(obj.get("metadata"), "metadata").get("name"), "DeviceTaintRule metadata.name")
    where = f"DeviceTaintRule {name}"
    spec = _obj(obj.get("spec"), f"{where}: spec")
    taint = _taint(spec.get("taint"), f"{where}: spec.taint")
    if not taint.effect:
        raise DraError(f"{where}: spec.taint.effect is missing")
    raw = spec.get("deviceSelector")
    if raw is None:
        return DeviceTaintRule(name=name, taint=taint, selects=False)
    sel = _obj(raw, f"{where}: spec.deviceSelector")
    for removed in _REMOVED_SELECTOR_FIELDS:
        if sel.get(removed):
            raise DraError(f"{where}: spec.deviceSelector.{removed} is not supported "
                           "(removed from resource.k8s.io in Kubernetes 1.35)")

    def one(field_name: str) -> str | None:
        value = sel.get(field_name)
        return None if value is None else _str(value, f"{where}: spec.deviceSelector.{field_name}", required=False)

    return DeviceTaintRule(name=name, taint=taint, selects=True,
                           driver=one("driver"), pool=one("pool"), device=one("device"))


def tainted_by_rules(rs: ResourceSlice, rules: Sequence[DeviceTaintRule]) -> ResourceSlice:
    """``rs`` with the taints of the ``rules`` that match its devices added to them (the
    slice itself when none does)."""
    here = [r for r in rules if r.covers(rs.driver, rs.pool)]
    if not here:
        return rs
    devices = []
    for d in rs.devices:
        added = tuple(r.taint for r in here if r.matches(d) and r.taint not in d.taints)
        devices.append(replace(d, taints=d.taints + added) if added else d)
    return replace(rs, devices=tuple(devices))


# ---------------------------------------------------------------- claims


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str
    raw: Mapping[str, Any]

    def tolerates(self, taint: DeviceTaint) -> bool:
        """Upstream's rule: an empty effect matches every effect, an empty key with
        Exists matches every key; Equal compares values."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("Equal", "") and self.value == taint.value


@dataclass(frozen=True)
class Choice:
    """A request's ``exactly`` or one ``firstAvailable`` subrequest: what to allocate."""

    name: str  # the result's request name: "req" or "req/sub"
    class_name: str
    selectors: tuple[str, ...]
    all_devices: bool
    count: int
    admin_access: bool
    tolerations: tuple[Toleration, ...]
    capacity: Mapping[str, Qty] | None  # capacity.requests, None when unset


@dataclass(frozen=True)
class Request:
    name: str
    choices: tuple[Choice, ...]  # one for ``exactly``; the subrequests in order
    first_available: bool


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]  # empty: every request
    attribute: str
    distinct: bool  # distinctAttribute, else matchAttribute

    def applies(self, request: str, choice: str) -> bool:
        return not self.requests or request in self.requests or choice in self.requests


@dataclass(frozen=True)
class ClaimConfig:
    requests: tuple[str, ...]
    config: Mapping[str, Any]


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    id: DeviceId
    admin_access: bool
    share_id: str | None
    consumed: Mapping[str, Qty]


@dataclass(frozen=True)
class Allocation:
    """``status.allocation``: the parsed results, and the object as written."""

    results: tuple[AllocatedDevice, ...]
    node_selector: NodeSelector | None
    raw: Mapping[str, Any]


@dataclass(frozen=True)
class ResourceClaim:
    namespace: str
    name: str
    uid: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...] = ()
    config: tuple[ClaimConfig, ...] = ()
    allocation: Allocation | None = None
    reserved_for: tuple[Mapping[str, Any], ...] = ()
    #: the version read: the precondition of the status write that allocates it
    resource_version: str = ""
    #: the UID of the pod it was made for by a scheduler, for the pod's extended resources
    #: (annotated ``resource.kubernetes.io/extended-resource-claim``, owned by the pod); ""
    #: for any other claim
    extended_for: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_resource_claim(obj: Mapping[str, Any]) -> ResourceClaim:
    """A ResourceClaim (spec and status); raises :class:`DraError`."""
    meta = _obj(obj.get("metadata"), "metadata")
    name = _str(meta.get("name"), "ResourceClaim metadata.name")
    namespace = _str(meta.get("namespace"), "ResourceClaim metadata.namespace", required=False)
    where = f"ResourceClaim {namespace}/{name}"
    devices = _obj(_obj(obj.get("spec"), f"{where}: spec").get("devices"), f"{where}: spec.devices")
    requests = tuple(_request(r, where, i) for i, r in enumerate(_list(devices.get("requests"), where)))
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise DraError(f"{where}: two requests have the same name")
    status = _obj(obj.get("status"), f"{where}: status")
    return ResourceClaim(
        namespace=namespace, name=name, uid=str(meta.get("uid") or ""), requests=requests,
        constraints=tuple(_constraint(c, requests, f"{where}: constraint #{i}")
                          for i, c in enumerate(_list(devices.get("constraints"), where))),
        config=tuple(_claim_config(c, f"{where}: config #{i}") for i, c in enumerate(_list(devices.get("config"), where))),
        allocation=parse_allocation(status.get("allocation"), f"{where}: status.allocation"),
        reserved_for=tuple(dict(_obj(r, f"{where}: reservedFor")) for r in _list(status.get("reservedFor"), where)),
        resource_version=str(meta.get("resourceVersion") or ""),
        extended_for=_extended_for(meta),
    )


#: the annotation on the claim a scheduler makes for a pod's extended resources
EXTENDED_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def _extended_for(meta: Mapping[str, Any]) -> str:
    """The UID of the pod a claim made for extended resources belongs to (its controlling
    owner), or ""."""
    notes = meta.get("annotations")
    if not isinstance(notes, Mapping) or notes.get(EXTENDED_ANNOTATION) != "true":
        return ""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and ref.get("controller") is True:
            return str(ref.get("uid") or "")
    return ""


def _request(raw: Any, in_claim: str, index: int) -> Request:
    r = _obj(raw, f"{in_claim}: request #{index}")
    name = _str(r.get("name"), f"{in_claim}: request #{index}: name")
    where = f"{in_claim}: request {name}"
    exactly, first = r.get("exactly"), _list(r.get("firstAvailable"), f"{where}: firstAvailable")
    if (exactly is None) == (not first):
        raise DraError(f"{where}: exactly one of exactly and firstAvailable must be set")
    if exactly is not None:
        return Request(name, (_choice(exactly, name, where, admin=True),), first_available=False)
    choices = []
    for i, s in enumerate(first):
        sub = _str(_obj(s, f"{where}: subrequest #{i}").get("name"), f"{where}: subrequest #{i}.name")
        choices.append(_choice(s, f"{name}/{sub}", f"{where}/{sub}", admin=False))
    return Request(name, tuple(choices), first_available=True)


def _choice(raw: Any, name: str, where: str, *, admin: bool) -> Choice:
    e = _obj(raw, where)
    if e.get("derivedAttributes"):
        raise DraError(f"{where}: derivedAttributes is not supported")
    if not admin and e.get("adminAccess") is not None:
        raise DraError(f"{where}: adminAccess is not allowed in a subrequest")
    mode = e.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise DraError(f"{where}: allocationMode {mode!r} is not ExactCount or All")
    count = 1 if e.get("count") is None else _int(e.get("count"), f"{where}: count")
    if mode == "ExactCount" and not 1 <= count <= MAX_RESULTS_PER_CLAIM:
        raise DraError(f"{where}: count {count} is not between 1 and {MAX_RESULTS_PER_CLAIM}")
    capacity = None
    if e.get("capacity") is not None:
        reqs = _obj(_obj(e.get("capacity"), f"{where}: capacity").get("requests"), f"{where}: capacity.requests")
        capacity = {str(k): Qty.of(v, f"{where}: capacity.requests {k}") for k, v in reqs.items()}
    return Choice(
        name=name,
        class_name=_str(e.get("deviceClassName"), f"{where}: deviceClassName"),
        selectors=_selectors(e.get("selectors"), where),
        all_devices=mode == "All", count=count,
        admin_access=_bool(e.get("adminAccess"), f"{where}: adminAccess"),
        tolerations=tuple(_toleration(t, f"{where}: toleration #{i}") for i, t in enumerate(_list(e.get("tolerations"), where))),
        capacity=capacity,
    )


def _toleration(raw: Any, where: str) -> Toleration:
    t = _obj(raw, where)
    op = _str(t.get("operator"), f"{where}.operator", required=False) or "Equal"
    if op not in ("Equal", "Exists"):
        raise DraError(f"{where}: operator {op!r} is not Equal or Exists")
    return Toleration(
        key=_str(t.get("key"), f"{where}.key", required=False), operator=op,
        value=_str(t.get("value"), f"{where}.value", required=False),
        effect=_str(t.get("effect"), f"{where}.effect", required=False), raw=dict(t),
    )


def _constraint(raw: Any, requests: Sequence[Request], where: str) -> Constraint:
    c = _obj(raw, where)
    names = _strs(c.get("requests"), f"{where}: requests")
    known = {r.name for r in requests} | {ch.name for r in requests for ch in r.choices}
    for n in names:
        if n not in known:
            raise DraError(f"{where}: names request {n!r}, which the claim does not have")
    match, distinct = c.get("matchAttribute"), c.get("distinctAttribute")
    if (match is None) == (distinct is None):
        raise DraError(f"{where}: exactly one of matchAttribute and distinctAttribute must be set")
    attribute = _str(match if match is not None else distinct, f"{where}: attribute")
    if "/" not in attribute:
        raise DraError(f"{where}: attribute {attribute!r} must be fully qualified (domain/name)")
    return Constraint(names, attribute, distinct=distinct is not None)


def _claim_config(raw: Any, where: str) -> ClaimConfig:
    c = _obj(raw, where)
    return ClaimConfig(_strs(c.get("requests"), f"{where}: requests"), _device_config(c, where))


def parse_allocation(raw: Any, where: str = "status.allocation") -> Allocation | None:
    """A claim's ``status.allocation`` (None when absent); raises :class:`DraError`."""
    if raw is None:
        return None
    a = _obj(raw, where)
    devs = _obj(a.get("devices"), f"{where}.devices")
    results = []
    for i, r in enumerate(_list(devs.get("results"), f"{where}.devices.results")):
        r = _obj(r, f"{where}: result #{i}")
        w = f"{where}: result #{i}"
        consumed = {str(k): Qty.of(v, f"{w}.consumedCapacity {k}")
                    for k, v in _obj(r.get("consumedCapacity"), f"{w}.consumedCapacity").items()}
        share = r.get("shareID")
        results.append(AllocatedDevice(
            request=_str(r.get("request"), f"{w}.request"),
            id=DeviceId(_str(r.get("driver"), f"{w}.driver"), _str(r.get("pool"), f"{w}.pool"),
                        _str(r.get("device"), f"{w}.device")),
            admin_access=_bool(r.get("adminAccess"), f"{w}.adminAccess"),
            share_id=None if share is None else _str(share, f"{w}.shareID"),
            consumed=consumed,
        ))
    return Allocation(tuple(results), _node_selector(a.get("nodeSelector"), where, one_term=False), dict(a))


# ---------------------------------------------------------------- pools


@dataclass(frozen=True)
class Pool:
    """The newest generation of one (driver, pool) the slices show."""

    driver: str
    name: str
    generation: int
    slices: tuple[ResourceSlice, ...]  # sorted by name
    slice_count: int
    counter_sets: Mapping[str, Mapping[str, Decimal]]
    problem: str = ""  # why no device of this pool is offered, "" when usable

    @property
    def label(self) -> str:
        return f"{self.driver}/{self.name}"


@dataclass(frozen=True)
class NodeDevices:
    """What a node may use: its devices in a deterministic order (pools by driver and
    name, slices by name, devices in slice order), the counter sets of their pools,
    and the pools that would offer devices here but cannot (incomplete or invalid)."""

    node: str
    labels: Mapping[str, str]
    devices: tuple[Device, ...]
    slices: Mapping[tuple[str, str, str], ResourceSlice]  # (driver, pool, slice name)
    counter_sets: Mapping[tuple[str, str], Mapping[str, Mapping[str, Decimal]]]
    unusable: tuple[Pool, ...] = ()


class Pools:
    """The slices of a cluster grouped into pools, newest generation only, their devices
    carrying the taints of the DeviceTaintRules that match them."""

    def __init__(self, slices: Iterable[ResourceSlice], taint_rules: Iterable[DeviceTaintRule] = ()) -> None:
        rules = sorted(taint_rules, key=lambda r: r.name)
        self._rules = rules
        grouped: dict[tuple[str, str], list[ResourceSlice]] = {}
        for s in slices:
            s = tainted_by_rules(s, rules) if rules else s
            grouped.setdefault((s.driver, s.pool), []).append(s)
        self.pools: dict[tuple[str, str], Pool] = {k: _build_pool(k, v) for k, v in sorted(grouped.items())}
        self._devices: dict[DeviceId, Device] = {
            d.id: d for p in self.pools.values() if not p.problem for s in p.slices for d in s.devices
        }
        # which pools a node need look at: a cluster publishes a pool or more per node, and
        # looking at every pool for every node made a node's devices cost O(pools)
        self._pinned: dict[str, set[tuple[str, str]]] = {}
        self._unpinned: set[tuple[str, str]] = set()
        for key, pool in self.pools.items():
            for name in _pinned_to(pool):
                if name is None:
                    self._unpinned.add(key)
                else:
                    self._pinned.setdefault(name, set()).add(key)

    def update(self, key: tuple[str, str], slices: Sequence[ResourceSlice]) -> None:
        """Pool ``key`` (driver, pool) made anew from its ``slices`` (none: it is gone),
        the others kept: a slice event costs the devices of its pool, not of the cluster."""
        old = self.pools.pop(key, None)
        if old is not None:
            if not old.problem:
                for s in old.slices:
                    for d in s.devices:
                        self._devices.pop(d.id, None)
            for name in _pinned_to(old):
                if name is None:
                    self._unpinned.discard(key)
                else:
                    self._pinned.get(name, set()).discard(key)
        if not slices:
            return
        pool = _build_pool(key, [tainted_by_rules(s, self._rules) if self._rules else s for s in slices])
        self.pools[key] = pool
        if not pool.problem:
            self._devices.update((d.id, d) for s in pool.slices for d in s.devices)
        for name in _pinned_to(pool):
            if name is None:
                self._unpinned.add(key)
            else:
                self._pinned.setdefault(name, set()).add(key)

    def device(self, device: DeviceId) -> Device | None:
        """A device of a usable pool, wherever it is available."""
        return self._devices.get(device)

    def node_of(self, device: DeviceId) -> str | None:
        """The node a device is local to (its slice's, or its own ``nodeName``); None for
        a device several nodes may use, or one no usable pool offers."""
        d = self._devices.get(device)
        if d is None:
            return None
        if d.node_name:
            return d.node_name
        pool = self.pools.get((d.driver, d.pool))
        rs = next((s for s in pool.slices if s.name == d.slice_name), None) if pool is not None else None
        return rs.node_name if rs is not None and rs.node_name else None

    def for_node(self, node: str, labels: Mapping[str, str]) -> NodeDevices:
        devices: list[Device] = []
        slices: dict[tuple[str, str, str], ResourceSlice] = {}
        counters: dict[tuple[str, str], Mapping[str, Mapping[str, Decimal]]] = {}
        unusable: list[Pool] = []
        for key in sorted(self._pinned.get(node, set()) | self._unpinned):
            pool = self.pools[key]
            here = [s for s in pool.slices if s.devices and s.serves(node, labels)]
            if not here:
                continue
            if pool.problem:
                unusable.append(pool)
                continue
            counters[key] = pool.counter_sets
            for s in here:
                slices[(s.driver, s.pool, s.name)] = s
                devices.extend(d for d in s.devices
                               if not s.per_device_node_selection or _device_serves(d, node, labels))
        return NodeDevices(node, labels, tuple(devices), slices, counters, tuple(unusable))


def _pinned_to(pool: Pool) -> set[str | None]:
    """The node names the devices of ``pool`` are pinned to; None for any device a node
    selector or ``allNodes`` offers (those are matched against each node's labels)."""
    out: set[str | None] = set()
    for s in pool.slices:
        if not s.devices:
            continue
        if s.per_device_node_selection:
            out.update(d.node_name for d in s.devices)
        else:
            out.add(s.node_name)
    return out


def _build_pool(key: tuple[str, str], slices: list[ResourceSlice]) -> Pool:
    newest = max(s.generation for s in slices)
    current = tuple(sorted((s for s in slices if s.generation == newest), key=lambda s: s.name))
    count = current[0].slice_count
    counter_sets: dict[str, Mapping[str, Decimal]] = {}
    problem = ""
    if len(current) != count:
        problem = f"pool {key[0]}/{key[1]} is incomplete ({len(current)} of {count} slices of generation {newest})"
    for s in current:
        for name, cs in s.shared_counters.items():
            if name in counter_sets and not problem:
                problem = f"pool {key[0]}/{key[1]} is invalid: counter set {name} is declared twice"
            counter_sets[name] = cs
    seen: set[str] = set()
    for s in current:
        for d in s.devices:
            if d.name in seen and not problem:
                problem = f"pool {key[0]}/{key[1]} is invalid: device {d.name} is listed twice"
            seen.add(d.name)
            for use in d.consumes:
                declared = counter_sets.get(use.counter_set)
                missing = [c for c in use.counters if declared is not None and c not in declared]
                if problem or (declared is not None and not missing):
                    continue
                what = f"counter set {use.counter_set}" if declared is None else f"counter {use.counter_set}/{missing[0]}"
                problem = f"pool {key[0]}/{key[1]} is invalid: device {d.name} consumes {what}, which the pool does not declare"
    return Pool(key[0], key[1], newest, current, count, counter_sets, problem)
