"""The structured allocator: devices for all of one pod's ResourceClaims on one node.

:func:`allocate` finds devices for every claim the pod still needs allocated, or for
none, with the semantics of upstream's allocator (k8s.io/dynamic-resource-allocation
/structured, the v1.37 "incubating" one):

- claims in pod order, requests in claim order; a request is ``exactly`` one choice or
  ``firstAvailable`` subrequests tried in order (the first that leads to a complete
  allocation wins; its result request name is ``req/sub``);
- ``ExactCount``: ``count`` devices, tried as combinations in device order (depth
  first, backtracking into earlier requests and claims); ``All``: every device that
  matches the selectors and capacity requests, at least one, each must be allocatable;
- a device matches when every selector of the class and then of the request accepts
  it (a CEL error stops the allocation with that error, as upstream);
- a device is allocatable when it is free (not allocated to another claim, not taken
  earlier in this search), its untolerated ``NoSchedule``/``NoExecute`` taints are
  none, its pool's shared counters still cover what it consumes, and the claim's
  constraints (``matchAttribute``, ``distinctAttribute``) still hold;
- a device with ``allowMultipleAllocations`` is never "taken": it serves several
  requests while its capacity lasts; its counters are charged once, by its first share;
  each share gets a ``shareID`` and records ``consumedCapacity`` (every capacity of the
  device, rounded up by its ``requestPolicy``);
- admin access (``exactly.adminAccess``): the device need not be free, is never handed
  twice to the same claim, and its allocation marks nothing in use. As upstream, it
  still charges the shared counters it consumes while the search runs, so a partition
  whose counters are used up is not given for admin access either. Upstream's
  condition for it, the namespace label ``resource.kubernetes.io/admin-access=true``,
  is enforced by the apiserver when the claim is created, so it is not checked here.
- devices with ``bindingConditions`` are never allocated (batchsched does not wait
  for binding conditions), and the failure reason says when one would have matched.

A claim that is already allocated (a shared claim) allocates nothing: its allocation
must be usable on the node (its ``nodeSelector``) and its ``reservedFor`` must have
room for the pod, else the pod does not fit there.

The work is bounded (``max_steps`` device checks); past it the allocation fails with a
reason saying so. A search still going after a few hundred checks prunes ways that cannot
be completed (see ``_Search.careful``), which finds the same allocation sooner. The result
is deterministic: devices are tried in the order of
:class:`~batchsched.core.dra.objects.NodeDevices`; share ids come from ``new_share_id``.

In-use state (:class:`InUse`) is rebuilt from claims alone by
:func:`in_use_from_claims`; an :class:`Allocated` carries the ``delta`` its new
allocations add, which is exactly what the rebuild adds once they are written.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any, Protocol

from batchsched.core.dra.objects import (
    MAX_RESULTS_PER_CLAIM,
    AllocatedDevice,
    Capacity,
    Choice,
    CounterId,
    Device,
    DeviceClass,
    DeviceId,
    NodeDevices,
    Pools,
    Qty,
    ResourceClaim,
)

#: device checks before the search gives up (upstream bounds it by a timeout instead);
#: about half a second of work, reached only by requests that cannot be met and whose
#: impossibility shows late (constraints across requests)
DEFAULT_MAX_STEPS = 50_000
#: device checks a search makes before it starts pruning (see ``_Search.careful``)
PLAIN_STEPS = 500
#: the most consumers ``status.reservedFor`` may list (ResourceClaimReservedForMaxSize)
MAX_RESERVATIONS = 256
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
_ZERO = Decimal(0)


class Selector(Protocol):
    def matches(self, env: Any) -> bool: ...


SelectorCompiler = Callable[[str], Selector]


# ---------------------------------------------------------------- in-use state


@dataclass(frozen=True)
class InUse:
    """What allocated claims hold: devices held whole, devices holding shares, the
    shared counters consumed, and the capacity consumed of shared devices."""

    devices: frozenset[DeviceId] = frozenset()
    shared: frozenset[DeviceId] = frozenset()
    counters: Mapping[CounterId, Decimal] = field(default_factory=dict)
    capacity: Mapping[DeviceId, Mapping[str, Decimal]] = field(default_factory=dict)

    def plus(self, other: InUse) -> InUse:
        """This state with ``other`` (a delta) added."""
        counters = dict(self.counters)
        for k, v in other.counters.items():
            counters[k] = counters.get(k, Decimal(0)) + v
        capacity = {d: dict(c) for d, c in self.capacity.items()}
        for d, c in other.capacity.items():
            mine = capacity.setdefault(d, {})
            for name, v in c.items():
                mine[name] = mine.get(name, Decimal(0)) + v
        return InUse(self.devices | other.devices, self.shared | other.shared, counters, capacity)


def in_use_from_claims(claims: Iterable[ResourceClaim], pools: Pools) -> InUse:
    """Every device's use, rebuilt from the claims' ``status.allocation`` alone.

    A result naming a device no usable pool offers any more (its slice gone, or its
    pool incomplete) still holds the device, but its counters cannot be known and
    are not charged."""
    results = [r for c in claims if c.allocation is not None for r in c.allocation.results]
    return _charge(results, pools.device, InUse())


def _charge(results: Sequence[AllocatedDevice], lookup: Callable[[DeviceId], Device | None], base: InUse) -> InUse:
    """What ``results`` add to ``base``: admin-access results hold nothing (upstream);
    a result with a share id holds a share and its consumed capacity; others hold the
    device. A device newly held (whole or by a first share) charges its counters once."""
    devices: set[DeviceId] = set()
    shared: set[DeviceId] = set()
    capacity: dict[DeviceId, dict[str, Decimal]] = {}
    for r in results:
        if r.admin_access:
            continue
        if r.share_id is None:
            devices.add(r.id)
            continue
        shared.add(r.id)
        mine = capacity.setdefault(r.id, {})
        for name, q in r.consumed.items():
            mine[name] = mine.get(name, Decimal(0)) + q.value
    counters: dict[CounterId, Decimal] = {}
    for d in sorted(devices | shared, key=str):
        device = lookup(d)
        if device is None or d in base.devices or d in base.shared:
            continue
        for use in device.consumes:
            for name, v in use.counters.items():
                key = CounterId(d.driver, d.pool, use.counter_set, name)
                counters[key] = counters.get(key, Decimal(0)) + v
    return InUse(frozenset(devices), frozenset(shared), counters, capacity)


# ---------------------------------------------------------------- outcome


@dataclass(frozen=True)
class ClaimResult:
    claim: str  # namespace/name
    allocation: Mapping[str, Any]  # status.allocation: new, or the claim's own
    new: bool


@dataclass(frozen=True)
class Allocated:
    claims: tuple[ClaimResult, ...]  # in the order the claims were given
    delta: InUse  # what the new allocations add to the ``in_use`` they were found against


@dataclass(frozen=True)
class Unallocatable:
    reason: str  # for a user: which claim and request failed, and why
    claim: str = ""
    request: str = ""
    #: the claim cannot be allocated as written, wherever it is tried (kube-scheduler fails
    #: the pod's whole attempt on it, not only the node): a request of ``allocationMode:
    #: All`` one of whose matching devices a constraint of the claim excludes, or a claim
    #: whose requests match more devices on a node than one claim may hold
    fatal: bool = False


class _Stop(Exception):
    def __init__(self, failure: Unallocatable) -> None:
        super().__init__(failure.reason)
        self.failure = failure


# ---------------------------------------------------------------- capacity


def consumed_capacity(device: Device, requests: Mapping[str, Qty] | None) -> dict[str, Qty] | None:
    """What one allocation of ``device`` consumes of each capacity, or None when the
    request names a capacity the device lacks or its ``requestPolicy`` refuses the
    amount. Unrequested: the policy's default, else the whole capacity; requested:
    rounded up to the policy's ``validRange`` (min, then min + n*step) or the next of
    its ``validValues``."""
    if requests and any(name not in device.capacity for name in requests):
        return None
    out: dict[str, Qty] = {}
    for name, cap in device.capacity.items():
        asked = requests.get(name) if requests else None
        q = _rounded(asked, cap)
        if q.value < 0 or _violates(q, cap) or q.value > cap.value.value:
            return None
        out[name] = q
    return out


def _rounded(asked: Qty | None, cap: Capacity) -> Qty:
    p = cap.policy
    if asked is None:
        return p.default if p is not None and p.default is not None else cap.value
    if p is None:
        return asked
    if p.has_range and p.min is not None:
        if asked.value < p.min.value:
            return p.min
        if p.step is None:
            return asked
        steps = ((asked.value - p.min.value) / p.step.value).to_integral_value(rounding=ROUND_CEILING)
        value = p.min.value + steps * p.step.value
        return asked if value == asked.value else Qty(value, _format(value, p.step.text))
    for v in p.valid_values:
        if asked.value <= v.value:
            return v
    return asked


def _violates(q: Qty, cap: Capacity) -> bool:
    p = cap.policy
    if p is None or (p.default is not None and q.value == p.default.value):
        return False
    if p.has_range:
        if p.max is not None and q.value > p.max.value:
            return True
        low = p.min.value if p.min is not None else Decimal(0)
        return p.step is not None and (q.value - low) % p.step.value != 0
    if p.valid_values:
        return all(q.value != v.value for v in p.valid_values)
    return False


_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))


def _format(value: Decimal, like: str) -> str:
    """A computed quantity, in binary suffixes when ``like`` uses one, else decimal."""
    if value != value.to_integral_value():
        return f"{int(value * 1000)}m"
    n = int(value)
    for suffix, base in _BINARY if like.endswith("i") else _DECIMAL:
        if n and n % base == 0:
            return f"{n // base}{suffix}"
    return str(n)


# ---------------------------------------------------------------- the search


@dataclass
class _Option:
    """One choice of one request, with the devices that match it on this node."""

    choice: Choice
    device_class: DeviceClass
    candidates: list[tuple[Device, dict[str, Qty]]]  # matching, with what each consumes
    waiting: int = 0  # matching devices skipped for their binding conditions
    room: _Room | None = None  # what bounds the devices this choice and the requests after it can take


@dataclass(frozen=True)
class _Room:
    """The devices a choice and every request after it could take, grouped by what
    bounds them: devices of one counter set cannot be taken more often than the
    counter that every one of them consumes has room for at the least consumption
    among them. With ``later`` (how many devices the requests after the choice take
    at the least), this tells early that a partial allocation cannot be completed:
    three large partitions of a GPU leave too little memory for the four small ones
    the rest of the pod asks, whichever four are tried."""

    loose: tuple[DeviceId, ...]  # devices no shared counter bounds
    groups: tuple[tuple[tuple[DeviceId, ...], tuple[tuple[CounterId, Decimal, Decimal], ...]], ...]
    #: each request after the choice (claim, request) with the devices it and those
    #: between take at the least; the last is what all of them take
    after: tuple[tuple[tuple[int, int], int], ...]

    @property
    def later(self) -> int:
        return self.after[-1][1] if self.after else 0


@dataclass
class _Search:
    claims: list[ResourceClaim]
    options: list[list[list[_Option]]]  # claim -> request -> choices
    devices: NodeDevices
    in_use: InUse
    max_steps: int
    steps: int = 0
    taken: dict[DeviceId, set[int]] = field(default_factory=dict)
    counters: dict[CounterId, Decimal] = field(default_factory=dict)
    capacity: dict[DeviceId, dict[str, Decimal]] = field(default_factory=dict)
    shares: dict[DeviceId, int] = field(default_factory=dict)
    values: list[list[list[tuple[str, Any]]]] = field(default_factory=list)  # claim -> constraint -> values
    picked: list[list[tuple[Choice, Device, dict[str, Qty] | None]]] = field(default_factory=list)
    chosen: dict[tuple[int, int], _Option] = field(default_factory=dict)  # the choice each request took
    deepest: tuple[int, int] = (0, 0)
    failed: set[tuple[Any, ...]] = field(default_factory=set)  # states from which nothing can be completed
    admin: list[bool] = field(default_factory=list)  # claim -> whether any of its choices is admin access

    looks_ahead: bool = True  # whether requests not reached yet are checked on their own
    measured: bool = False  # whether the choices have their rooms

    def __post_init__(self) -> None:
        self.admin = [any(o.choice.admin_access for r in c for o in r) for c in self.options]

    @property
    def careful(self) -> bool:
        """Whether the search prunes: once it has taken more than a few device checks,
        it remembers states that failed (a request reached again holding the same
        devices, taken by other requests), bounds what the shared counters leave room
        for, and checks that the requests ahead can each still be met. None of these
        changes the answer (each cuts only ways that cannot be completed); they cost
        more than they save in the searches most pods make, which end sooner."""
        return self.steps > PLAIN_STEPS

    def each_still_met(self, ci: int, ri: int) -> bool:
        """Whether every request from ``ri`` of claim ``ci`` on can still be met on its
        own, with what is held now. More is held deeper in the search, never less, so a
        request that cannot be met now will not be later: stop before trying every way
        of meeting the requests in front of it."""
        for cj in range(ci, len(self.claims)):
            for rj in range(ri if cj == ci else 0, len(self.options[cj])):
                if not any(self.could_meet(cj, o) for o in self.options[cj][rj]):
                    self.deepest = max(self.deepest, (cj, rj))  # where the search could not get past
                    return False
        return True

    def could_meet(self, ci: int, option: _Option) -> bool:
        c = option.choice
        need = len(option.candidates) if c.all_devices else c.count
        if need == 0 or len(self.picked[ci]) + need > MAX_RESULTS_PER_CLAIM:
            return False
        if c.all_devices:
            return all(self.allocatable(ci, c, d, consumed) for d, consumed in option.candidates)
        return not self.hopeless(ci, c, option.candidates, need)

    def claim(self, ci: int, ri: int) -> bool:
        """Allocate request ``ri`` of claim ``ci`` and everything after it."""
        self.deepest = max(self.deepest, (ci, ri))
        if ci == len(self.claims):
            return True
        if ri == len(self.options[ci]):
            return self.claim(ci + 1, 0)
        if self.careful and self.state(ci, ri) in self.failed:
            return False
        if self.requests(ci, ri):
            return True
        if self.careful:  # all undone by now: the state is the one met on the way in
            self.failed.add(self.state(ci, ri))
        return False

    def state(self, ci: int, ri: int) -> tuple[Any, ...]:
        """What decides whether the requests from ``ri`` of claim ``ci`` on can still be
        met: what is held (whichever earlier requests took it), what this claim's
        constraints have seen, and how many devices this claim holds."""
        held = frozenset(d for d, cis in self.taken.items() if cis)
        # admin access asks only whether this claim holds the device already
        mine = frozenset(d for d, cis in self.taken.items() if ci in cis) if self.admin[ci] else None
        shared = frozenset((d, tuple(sorted(c.items()))) for d, c in self.capacity.items() if self.shares.get(d))
        seen = tuple(tuple(sorted(set(v), key=repr)) for v in self.values[ci])
        return (ci, ri, held, mine, shared, seen, len(self.picked[ci]))

    def requests(self, ci: int, ri: int) -> bool:
        for option in self.options[ci][ri]:
            c = option.choice
            need = len(option.candidates) if c.all_devices else c.count
            if c.all_devices and need == 0:
                continue
            if len(self.picked[ci]) + need > MAX_RESULTS_PER_CLAIM:
                continue
            self.chosen[(ci, ri)] = option
            if self.pick(ci, ri, option, 0, 0):
                return True
        return False

    def pick(self, ci: int, ri: int, option: _Option, done: int, start: int) -> bool:
        """Pick device number ``done`` of ``option`` from candidates ``start`` on."""
        c = option.choice
        need = len(option.candidates) if c.all_devices else c.count
        if done == need:
            return self.claim(ci, ri + 1)
        if not c.all_devices and ((self.careful and self.short(option, need - done))
                                  or self.hopeless(ci, c, option.candidates[start:], need - done)):
            return False
        stop = start + 1 if c.all_devices else len(option.candidates) - (need - done) + 1
        for i in range(start, stop):
            device, consumed = option.candidates[i]
            undo = self.take(ci, c, device, consumed)
            if undo is None:
                if c.all_devices and self.usable(ci, c, device, consumed):  # the constraint refused it
                    # every matching device must be allocated, and a constraint excludes
                    # this one: upstream calls such a claim an error, not a miss
                    claim = self.claims[ci]
                    raise _Stop(Unallocatable(
                        f"claim {claim.key}, request {c.name}: device {device.id} matches but a constraint "
                        f"of the claim excludes it, and allocationMode All needs every matching device",
                        claim.key, c.name, fatal=True))
                continue
            ahead = self.looks_ahead and self.careful
            if (not ahead or self.each_still_met(ci, ri + 1)) and self.pick(ci, ri, option, done + 1, i + 1):
                return True
            undo()
        return False

    def hopeless(self, ci: int, c: Choice, rest: Sequence[tuple[Device, dict[str, Qty]]], wanted: int) -> bool:
        """Whether fewer than ``wanted`` of ``rest`` can be taken now. Deeper in the
        search more is held, never less, so what cannot be taken now cannot be later:
        without this a ``matchAttribute`` over more devices than share a value would
        try every subset of those that do. Under a ``distinctAttribute`` devices sharing
        a value count once: four from two GPUs' partitions never have four bus ids."""
        request = c.name.split("/", 1)[0]
        distinct = [k for k, con in enumerate(self.claims[ci].constraints) if con.distinct and con.applies(request, c.name)]
        left, values = 0, [set[tuple[str, Any] | None]() for _ in distinct]
        for device, consumed in rest:
            if self.allocatable(ci, c, device, consumed):
                left += 1
                for seen, k in zip(values, distinct, strict=True):  # devices sharing a value count once
                    value = _attribute_value(device, self.claims[ci].constraints[k].attribute)
                    seen.add(value)
                if left >= wanted and all(len(seen) >= wanted for seen in values):
                    return False
        return True

    def short(self, option: _Option, wanted: int) -> bool:
        """Whether the shared counters have too little left for ``wanted`` more devices
        of ``option`` and the least the requests after it need (see :class:`_Room`)."""
        if not self.measured:
            _measure_rooms(self.options, self.devices)
            self.measured = True
        room = option.room
        if room is None:
            return False
        demand = wanted + room.later
        held, taken = self.in_use.devices, self.taken
        have = sum(1 for d in room.loose if d not in held and not taken.get(d))
        if have >= demand:
            return False
        used, mine = self.in_use.counters, self.counters
        for devices, counters in room.groups:
            n = sum(1 for d in devices if d not in held and not taken.get(d))
            for key, total, least in counters:
                left = total - used.get(key, _ZERO) - mine.get(key, _ZERO)
                n = min(n, int(left // least)) if left > 0 else 0
            have += n
            if have >= demand:
                return False
        # the search could not get past the first request the room falls short for
        short_at = next((at for at, least in room.after if wanted + least > have), None)
        if short_at is not None:
            self.deepest = max(self.deepest, short_at)
        return True

    def allocatable(self, ci: int, c: Choice, device: Device, consumed: dict[str, Qty]) -> bool:
        """Whether ``device`` may be taken for ``c`` now: free (or admin access, never
        twice for one claim), no untolerated taint, its counters and capacity left, and
        the claim's constraints still holding with it."""
        return self.usable(ci, c, device, consumed) and self.constraints_allow(ci, c, device)

    def usable(self, ci: int, c: Choice, device: Device, consumed: dict[str, Qty]) -> bool:
        """:meth:`allocatable` but for the claim's constraints."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise _Stop(Unallocatable(
                f"gave up after {self.max_steps} device checks on node {self.devices.node}"))
        d, multiple = device.id, device.allow_multiple
        if c.admin_access:
            if not multiple and ci in self.taken.get(d, ()):
                return False
        elif d in self.in_use.devices or self.taken.get(d) or (not multiple and d in self.in_use.shared):
            return False
        if _blocking_taint(device, c) is not None:
            return False
        if self.charges(device) and not self.counters_fit(device):
            return False
        return not (multiple and not self.capacity_fits(d, device, consumed))

    def charges(self, device: Device) -> bool:
        """Whether taking ``device`` consumes its counters: a shared device's first share
        does, later shares do not (upstream)."""
        d = device.id
        return not (device.allow_multiple and (d in self.in_use.shared or self.shares.get(d)))

    def take(self, ci: int, c: Choice, device: Device, consumed: dict[str, Qty]) -> Callable[[], None] | None:
        """Mark ``device`` allocated to claim ``ci`` for ``c`` if it is allocatable now;
        the function returned undoes it."""
        if not self.allocatable(ci, c, device, consumed):
            return None
        return self._commit(ci, c, device, consumed, self.charges(device), self._constrain(ci, c, device))

    def _commit(
        self, ci: int, c: Choice, device: Device, consumed: dict[str, Qty], charge: bool, pushed: list[int]
    ) -> Callable[[], None]:
        d, multiple = device.id, device.allow_multiple
        uses = [(CounterId(d.driver, d.pool, u.counter_set, n), v) for u in device.consumes
                for n, v in u.counters.items()] if charge else []
        for key, v in uses:
            self.counters[key] = self.counters.get(key, Decimal(0)) + v
        if multiple:
            self.shares[d] = self.shares.get(d, 0) + 1
            mine = self.capacity.setdefault(d, {})
            for name, q in consumed.items():
                mine[name] = mine.get(name, Decimal(0)) + q.value
        else:
            self.taken.setdefault(d, set()).add(ci)
        self.picked[ci].append((c, device, consumed if multiple else None))

        def undo() -> None:
            self.picked[ci].pop()
            if multiple:
                self.shares[d] -= 1
                for name, q in consumed.items():
                    self.capacity[d][name] -= q.value
            else:
                self.taken[d].discard(ci)
            for key, v in uses:
                self.counters[key] -= v
            for k in reversed(pushed):
                self.values[ci][k].pop()

        return undo

    def counters_fit(self, device: Device) -> bool:
        sets = self.devices.counter_sets.get((device.driver, device.pool), {})
        for use in device.consumes:
            for name, v in use.counters.items():
                key = CounterId(device.driver, device.pool, use.counter_set, name)
                total = sets.get(use.counter_set, {}).get(name, Decimal(0))
                left = total - self.in_use.counters.get(key, Decimal(0)) - self.counters.get(key, Decimal(0))
                if v > left:
                    return False
        return True

    def capacity_fits(self, d: DeviceId, device: Device, consumed: dict[str, Qty]) -> bool:
        held, mine = self.in_use.capacity.get(d, {}), self.capacity.get(d, {})
        for name, q in consumed.items():
            total = held.get(name, Decimal(0)) + mine.get(name, Decimal(0)) + q.value
            if total > device.capacity[name].value.value:
                return False
        return True

    def constraints_allow(self, ci: int, c: Choice, device: Device) -> bool:
        request = c.name.split("/", 1)[0]
        for k, con in enumerate(self.claims[ci].constraints):
            if not con.applies(request, c.name):
                continue
            value, seen = _attribute_value(device, con.attribute), self.values[ci][k]
            if value is None or (con.distinct and value in seen) or (not con.distinct and seen and seen[0] != value):
                return False
        return True

    def _constrain(self, ci: int, c: Choice, device: Device) -> list[int]:
        """Add the device's attributes to the claim's constraints it falls under (which
        :meth:`constraints_allow` checked); the indexes pushed."""
        request = c.name.split("/", 1)[0]
        pushed: list[int] = []
        for k, con in enumerate(self.claims[ci].constraints):
            if con.applies(request, c.name):
                value = _attribute_value(device, con.attribute)
                assert value is not None
                self.values[ci][k].append(value)
                pushed.append(k)
        return pushed


def _attribute_value(device: Device, name: str) -> tuple[str, Any] | None:
    attr = device.attributes.get(name)
    if attr is None:
        return None
    kind, value = next(iter(attr.items()))
    return (kind, value)


def _blocking_taint(device: Device, c: Choice) -> str | None:
    for t in device.taints:
        if t.effect in _BLOCKING_EFFECTS and not any(tol.tolerates(t) for tol in c.tolerations):
            return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
    return None


# ---------------------------------------------------------------- entry point


def allocate(
    claims: Sequence[ResourceClaim],
    *,
    devices: NodeDevices,
    classes: Mapping[str, DeviceClass],
    in_use: InUse,
    compile_selector: SelectorCompiler | None = None,
    device_env: Callable[[Device], Any] | None = None,
    new_share_id: Callable[[], str] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    pod_uid: str = "",
    selector_cache: SelectorCache | None = None,
) -> Allocated | Unallocatable:
    """Devices for all of ``claims`` (one pod's, in pod order) on ``devices.node``, or why not.

    ``devices`` is what the node may use (:meth:`Pools.for_node`), ``in_use`` what
    other claims hold (:func:`in_use_from_claims`, plus tentative deltas).
    ``compile_selector`` and ``device_env`` default to :mod:`batchsched.core.dra.cel`
    (the compiler, and ``Device.env`` as the expressions' input); tests may pass others.
    ``pod_uid`` lets an allocated claim whose ``reservedFor`` is full serve the pod
    already in it. ``selector_cache`` keeps selector outcomes from one call to the next.
    """
    share_id = new_share_id or (lambda: str(uuid.uuid4()))
    for c in claims:
        refused = _unusable_allocation(c, devices, pod_uid)
        if refused:
            return Unallocatable(refused, c.key)
    pending = [c for c in claims if c.allocation is None]
    try:
        options = _Matcher(devices, classes, compile_selector, device_env, selector_cache).options(pending)
        _check_sizes(pending, options, devices.node)
        search = _Search(pending, options, devices, in_use, max_steps, looks_ahead=not _may_stop_the_pod(pending),
                         values=[[[] for _ in c.constraints] for c in pending], picked=[[] for _ in pending])
        if not search.claim(0, 0):
            return _explain(search)
    except _Stop as stop:
        return stop.failure
    new: dict[str, ClaimResult] = {}
    added: list[AllocatedDevice] = []
    for ci, claim in enumerate(pending):
        results = [_result(c, d, consumed, share_id) for c, d, consumed in search.picked[ci]]
        added.extend(_allocated(c, d, r) for (c, d, _), r in zip(search.picked[ci], results, strict=True))
        new[claim.key] = ClaimResult(claim.key, _status_allocation(search, ci, results), new=True)
    out = tuple(new.get(c.key) or ClaimResult(c.key, c.allocation.raw if c.allocation else {}, new=False)
                for c in claims)
    lookup = {d.id: d for d in devices.devices}
    return Allocated(out, _charge(added, lookup.get, in_use))


def _check_sizes(claims: Sequence[ResourceClaim], options: Sequence[Sequence[Sequence[_Option]]], node: str) -> None:
    """Stop before searching when a claim needs more devices than one claim may hold
    even with its smallest choices. As upstream, this is an error of the claim, not a
    miss of the node: kube-scheduler fails the pod's whole attempt when any node it
    tries has more matching devices than an ``allocationMode: All`` request may take."""
    for claim, requests in zip(claims, options, strict=True):
        least = sum(min(len(o.candidates) if o.choice.all_devices else o.choice.count for o in choices)
                    for choices in requests)
        if least > MAX_RESULTS_PER_CLAIM:
            raise _Stop(Unallocatable(f"claim {claim.key} asks for {least} devices on node {node}, "
                                      f"more than the {MAX_RESULTS_PER_CLAIM} one claim may hold", claim.key,
                                      fatal=True))


def _measure_rooms(options: Sequence[Sequence[Sequence[_Option]]], devices: NodeDevices) -> None:
    """Give every choice its :class:`_Room`, from the last request back to the first.
    No room bounds a search where a device may serve several requests (shared devices,
    admin access): a count of devices says nothing there."""
    union_after: dict[DeviceId, Device] = {}
    least_after: list[tuple[tuple[int, int], int]] = []  # each later request and the least it takes
    bounded = True
    for ci in reversed(range(len(options))):
        for ri in reversed(range(len(options[ci]))):
            choices = options[ci][ri]
            cumulative = tuple(zip((at for at, _ in least_after),
                                   itertools.accumulate(n for _, n in least_after), strict=True))
            # a device taken once per request: what the room counts
            once = [not o.choice.admin_access and not any(d.allow_multiple for d, _ in o.candidates)
                    for o in choices]
            for option, counted in zip(choices, once, strict=True):
                if bounded and counted:
                    union = {d.id: d for d, _ in option.candidates} | union_after
                    option.room = _room(union.values(), devices, cumulative)
            bounded = bounded and all(once)
            for option in choices:
                union_after.update((d.id, d) for d, _ in option.candidates)
            least_after.insert(0, ((ci, ri), min(1 if o.choice.all_devices else o.choice.count for o in choices)))


def _room(union: Iterable[Device], devices: NodeDevices, after: tuple[tuple[tuple[int, int], int], ...]) -> _Room:
    loose: list[DeviceId] = []
    by_set: dict[tuple[str, str, str], list[Device]] = {}
    for d in union:
        if len(d.consumes) == 1:
            by_set.setdefault((d.driver, d.pool, d.consumes[0].counter_set), []).append(d)
        else:
            loose.append(d.id)
    groups = []
    for (driver, pool, counter_set), members in by_set.items():
        totals = devices.counter_sets.get((driver, pool), {}).get(counter_set, {})
        shared = set.intersection(*(set(m.consumes[0].counters) for m in members))
        counters = []
        for name in sorted(shared):
            least = min(m.consumes[0].counters[name] for m in members)
            if least > 0:
                counters.append((CounterId(driver, pool, counter_set, name), totals.get(name, _ZERO), least))
        groups.append((tuple(m.id for m in members), tuple(counters)))
    return _Room(tuple(loose), tuple(groups), after)


def _unusable_allocation(claim: ResourceClaim, devices: NodeDevices, pod_uid: str) -> str:
    """Why an allocated claim cannot serve the pod on this node, or "" (also for a
    claim not allocated yet)."""
    a = claim.allocation
    if a is None:
        return ""
    if a.node_selector is not None and not a.node_selector.matches(devices.node, devices.labels):
        return f"claim {claim.key} is allocated to devices not available on node {devices.node}"
    uids = {str(r.get("uid")) for r in claim.reserved_for}
    if len(uids) >= MAX_RESERVATIONS and pod_uid not in uids:
        return f"claim {claim.key} is already reserved for {MAX_RESERVATIONS} consumers, the most Kubernetes allows"
    return ""


def _status_allocation(search: _Search, ci: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``status.allocation`` to write for claim ``ci`` of the search."""
    claim = search.claims[ci]
    devices: dict[str, Any] = {"results": results}
    config = _config(claim, [search.chosen[(ci, ri)] for ri in range(len(claim.requests))])
    if config:
        devices["config"] = config
    body: dict[str, Any] = {"devices": devices}
    selector = _node_selector([d for _, d, _ in search.picked[ci]], search.devices, search.devices.node)
    if selector is not None:
        body["nodeSelector"] = selector
    return body


class SelectorCache:
    """Compiled selectors and their outcomes, kept across calls of :func:`allocate`
    (one node after another, one pod after another). An outcome is keyed by the
    device object, not its name, since a driver may republish a device with other
    attributes: keep one cache per :class:`Pools` value, and one per compiler."""

    def __init__(self) -> None:
        self.compiled: dict[str, Selector] = {}
        self._outcomes: dict[tuple[str, int], tuple[Device, bool]] = {}

    def outcome(self, expr: str, device: Device) -> bool | None:
        hit = self._outcomes.get((expr, id(device)))
        return None if hit is None else hit[1]

    def remember(self, expr: str, device: Device, outcome: bool) -> None:
        # the device is kept with its outcome so that its id is not reused by another
        self._outcomes[(expr, id(device))] = (device, outcome)


class _Matcher:
    """Which devices match each choice: class selectors, then the request's, then the
    static capacity check; selectors' outcomes cached (for the call, or in the
    caller's :class:`SelectorCache`)."""

    def __init__(self, devices: NodeDevices, classes: Mapping[str, DeviceClass],
                 compile_selector: SelectorCompiler | None, device_env: Callable[[Device], Any] | None,
                 cache: SelectorCache | None) -> None:
        if compile_selector is None:
            from batchsched.core.dra.cel import compile_selector as real  # type: ignore[import-not-found,unused-ignore]

            compile_selector = real
        self.devices, self.classes, self.compile = devices, classes, compile_selector
        self.env: Callable[[Device], Any] = device_env or (lambda d: d.env)
        self.cache = cache or SelectorCache()
        self.matched: dict[tuple[str, tuple[str, ...], tuple[tuple[str, Decimal], ...]], _Option] = {}

    def options(self, claims: Sequence[ResourceClaim]) -> list[list[list[_Option]]]:
        return [[[self.option(claim, c) for c in r.choices] for r in claim.requests] for claim in claims]

    def option(self, claim: ResourceClaim, c: Choice) -> _Option:
        where = f"claim {claim.key}: request {c.name}"
        device_class = self.classes.get(c.class_name)
        if device_class is None:
            raise _Stop(Unallocatable(f"{where}: device class {c.class_name} does not exist", claim.key, c.name))
        if c.all_devices and self.devices.unusable:
            raise _Stop(Unallocatable(
                f"{where}: asks for all devices, but {self.devices.unusable[0].problem}", claim.key, c.name))
        key = (c.class_name, c.selectors, tuple(sorted((k, q.value) for k, q in (c.capacity or {}).items())))
        known = self.matched.get(key)
        if known is not None:  # another claim of the pod asks the same: same devices
            return _Option(c, device_class, known.candidates, known.waiting)
        option = self.matched[key] = _Option(c, device_class, [])
        for device in self.devices.devices:
            if not (self.selected(device_class.selectors, device, f"{where}: class {c.class_name}", claim, c)
                    and self.selected(c.selectors, device, where, claim, c)):
                continue
            if device.binding_conditions:
                option.waiting += 1
                continue
            consumed = consumed_capacity(device, c.capacity)
            if consumed is not None:
                option.candidates.append((device, consumed))
        return option

    def selected(self, exprs: Sequence[str], device: Device, where: str, claim: ResourceClaim, c: Choice) -> bool:
        for i, expr in enumerate(exprs):
            outcome = self.cache.outcome(expr, device)
            if outcome is None:
                try:
                    selector = self.cache.compiled.get(expr) or self.compile(expr)
                    self.cache.compiled[expr] = selector
                    outcome = bool(selector.matches(self.env(device)))
                except ValueError as exc:  # CelError, from compiling or evaluating
                    raise _Stop(Unallocatable(f"{where}: selector #{i} on device {device.id}: {exc}",
                                              claim.key, c.name)) from None
                self.cache.remember(expr, device, outcome)
            if not outcome:
                return False
        return True


# ---------------------------------------------------------------- writing results


def _result(c: Choice, d: Device, consumed: dict[str, Qty] | None, share_id: Callable[[], str]) -> dict[str, Any]:
    """One entry of ``status.allocation.devices.results``, as upstream writes it."""
    r: dict[str, Any] = {"request": c.name, "driver": d.driver, "pool": d.pool, "device": d.name}
    if c.admin_access:
        r["adminAccess"] = True
    if c.tolerations:
        r["tolerations"] = [dict(t.raw) for t in c.tolerations]
    if consumed is not None:
        r["shareID"] = share_id()
        if consumed:
            r["consumedCapacity"] = {name: q.text for name, q in consumed.items()}
    return r


def _allocated(c: Choice, d: Device, r: Mapping[str, Any]) -> AllocatedDevice:
    consumed = {name: Qty.of(text, name) for name, text in (r.get("consumedCapacity") or {}).items()}
    return AllocatedDevice(c.name, d.id, c.admin_access, r.get("shareID"), consumed)


def _config(claim: ResourceClaim, chosen: Sequence[_Option]) -> list[dict[str, Any]]:
    """``devices.config``: each class's config once, naming the requests that use the
    class, in request order; then the claim's own, when it names no request or one
    that got allocated; a config that covers every request names none (upstream)."""
    out: list[dict[str, Any]] = []
    spans: dict[str, tuple[int, int]] = {}
    for option in chosen:
        name, cls = option.choice.name, option.device_class
        if cls.name in spans:
            for i in range(*spans[cls.name]):
                out[i]["requests"].append(name)
            continue
        start = len(out)
        out.extend({"source": "FromClass", "requests": [name], **cfg} for cfg in cls.config)
        spans[cls.name] = (start, len(out))
    used = [(r.name, o.choice.name) for r, o in zip(claim.requests, chosen, strict=True)]
    for cfg in claim.config:
        if not cfg.requests:
            out.append({"source": "FromClaim", **cfg.config})
        elif any(r in cfg.requests or c in cfg.requests for r, c in used):
            out.append({"source": "FromClaim", "requests": list(cfg.requests), **cfg.config})
    for entry in out:
        names = entry.get("requests")
        if names and all(r in names or c in names for r, c in used):
            del entry["requests"]
    return out


def _node_selector(picked: Sequence[Device], devices: NodeDevices, node: str) -> dict[str, Any] | None:
    """Where the allocation may be used: this node alone when any device is local to
    it (or binds to it), else the union of the slices' one-term selectors, else
    anywhere (None)."""
    fields: list[dict[str, Any]] = []
    exprs: list[dict[str, Any]] = []
    for d in picked:
        s = devices.slices[(d.driver, d.pool, d.slice_name)]
        name, selector = (d.node_name, d.node_selector) if s.per_device_node_selection else (s.node_name, s.node_selector)
        if name is not None or d.binds_to_node:
            return {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        if selector is None:
            continue
        term = selector.raw["nodeSelectorTerms"][0]
        for src, dst in ((term.get("matchFields"), fields), (term.get("matchExpressions"), exprs)):
            for req in src or ():
                if not any(_same_requirement(req, have) for have in dst):
                    dst.append(dict(req))
    if not fields and not exprs:
        return None
    out: dict[str, Any] = {}
    if fields:
        out["matchFields"] = fields
    if exprs:
        out["matchExpressions"] = exprs
    return {"nodeSelectorTerms": [out]}


def _same_requirement(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("key") == b.get("key") and a.get("operator") == b.get("operator")
            and set(a.get("values") or ()) == set(b.get("values") or ()))


# ---------------------------------------------------------------- failure reasons


def _may_stop_the_pod(claims: Sequence[ResourceClaim]) -> bool:
    """Whether the search itself may find the claims wrong as written (an ``All``
    request with a device a constraint excludes): then it must not look ahead, so that
    it reports that exactly where upstream's search would."""
    return any(c.constraints and any(ch.all_devices for r in c.requests for ch in r.choices) for c in claims)


def _explain(search: _Search) -> Unallocatable:
    """Why the search found nothing: the first request that cannot be met even alone
    (with what keeps its devices), else the request the search could not get past."""
    for ci, claim in enumerate(search.claims):
        for ri, request in enumerate(claim.requests):
            options = search.options[ci][ri]
            reasons = [_alone(search, o) for o in options]
            if all(reasons):
                text = reasons[0] if len(options) == 1 else "; ".join(
                    f"{o.choice.name}: {r}" for o, r in zip(options, reasons, strict=True))
                return Unallocatable(f"claim {claim.key}: request {request.name}: {text}", claim.key, request.name)
    ci, ri = search.deepest
    ci = min(ci, len(search.claims) - 1)
    claim = search.claims[ci]
    request = claim.requests[min(ri, len(claim.requests) - 1)]
    constraints = "; ".join(
        f"{'distinctAttribute' if c.distinct else 'matchAttribute'} {c.attribute}"
        + (f" over {', '.join(c.requests)}" if c.requests else "") for c in claim.constraints)
    return Unallocatable(
        f"claim {claim.key}: request {request.name}: the devices on node {search.devices.node} "
        f"cannot satisfy it together with the other requests"
        + (f" (constraints: {constraints})" if constraints else ""), claim.key, request.name)


def _alone(search: _Search, option: _Option) -> str:
    """Why ``option`` cannot be met on its own against what other claims hold, or ""."""
    c, node = option.choice, search.devices.node
    if not option.candidates:
        text = f"no device of class {c.class_name} matches on node {node}"
        if option.waiting:
            text += f" ({option.waiting} matching devices have binding conditions, which batchsched does not wait for)"
        for pool in search.devices.unusable:
            text += f"; {pool.problem}"
        return text
    blocked: dict[str, int] = {}
    for device, consumed in option.candidates:
        why = _blocked(search, c, device, consumed)
        if why:
            blocked[why] = blocked.get(why, 0) + 1
    free = len(option.candidates) - sum(blocked.values())
    need = len(option.candidates) if c.all_devices else c.count
    if free >= need and not (c.all_devices and blocked):
        return ""
    details = ", ".join(f"{n} {why}" for why, n in blocked.items())
    wanted = f"all {need}" if c.all_devices else f"{need}"
    return (f"needs {wanted} device{'s' if need > 1 else ''} of class {c.class_name}; "
            f"{len(option.candidates)} matching on node {node}, of which {details}")


def _blocked(search: _Search, c: Choice, device: Device, consumed: dict[str, Qty]) -> str:
    d, held = device.id, search.in_use
    if not c.admin_access and (d in held.devices or (not device.allow_multiple and d in held.shared)):
        return "in use"
    taint = _blocking_taint(device, c)
    if taint is not None:
        return f"tainted {taint} (not tolerated)"
    if search.charges(device) and not search.counters_fit(device):
        return "without the shared counters they consume (other devices of the same counter set are in use)"
    if device.allow_multiple and not search.capacity_fits(d, device, consumed):
        return "without enough capacity left"
    return ""
