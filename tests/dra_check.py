"""An allocation judged against the rules of ``resource.k8s.io/v1``, without batchsched's allocator.

:func:`problems` reads one copy of a :class:`tests.dra_worlds.World` (its slices, as
published) and the claims' status as a scheduler wrote them, and lists every rule broken:
a device that is not on the pod's node, one its class or selectors refuse (judged by the
Python predicates drawn with each CEL expression), a wrong count (ExactCount, All), a
constraint not held, a device held whole twice, shared counters or a shared device's
capacity overspent. It imports nothing of ``batchsched.core.dra``: it is the second
opinion on both kube-scheduler's allocations and batchsched's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.dra_worlds import Claim, Constraint, Request, Shape, World, device_view, parse_quantity


@dataclass(slots=True)
class _Device:
    node: str
    body: dict[str, Any]
    attrs: dict[str, Any]
    caps: dict[str, int]
    counter_set: dict[str, dict[str, int]]  # counter set -> counter -> amount consumed

    @property
    def shared(self) -> bool:
        return bool(self.body.get("allowMultipleAllocations"))


def _published(slices: Sequence[Mapping[str, Any]]) -> tuple[dict[tuple[str, str], _Device], dict[str, dict[str, int]]]:
    """Devices by (pool, name), and every pool's counters by ``pool/counter set``."""
    devices: dict[tuple[str, str], _Device] = {}
    counters: dict[str, dict[str, int]] = {}
    for s in slices:
        spec = s["spec"]
        pool = spec["pool"]["name"]
        for cs in spec.get("sharedCounters") or []:
            counters[f"{pool}/{cs['name']}"] = {k: parse_quantity(v["value"]) for k, v in cs["counters"].items()}
        for d in spec.get("devices") or []:
            attrs, caps = device_view(d)
            consumes = {f"{pool}/{c['counterSet']}": {k: parse_quantity(v["value"]) for k, v in c["counters"].items()}
                        for c in d.get("consumesCounters") or []}
            devices[(pool, d["name"])] = _Device(spec["nodeName"], d, attrs, caps, consumes)
    return devices, counters


def _capacity_ok(device: _Device, asked: Mapping[str, str], consumed: Mapping[str, str] | None) -> str:
    """What is wrong with the capacity a request asked of a device (and what it consumed)."""
    for name, value in asked.items():
        want = parse_quantity(value)
        if name not in device.caps:
            return f"asks capacity {name} the device lacks"
        if want > device.caps[name]:
            return f"asks {value} of {name}, the device has {device.caps[name]}"
        if device.shared:
            got = parse_quantity((consumed or {}).get(name, "0"))
            if got < want:
                return f"consumed {got} of {name}, asked {value}"
    return ""


def _constraint_ok(c: Constraint, results: Sequence[tuple[str, _Device]], claim: Claim) -> str:
    names = c.requests or [r.name for r in claim.requests]
    values = []
    for request, device in results:
        if request.partition("/")[0] not in names:
            continue
        if c.attribute not in device.attrs:
            return f"{c.attribute} missing on a device of a constraint"
        values.append(device.attrs[c.attribute])
    if c.distinct and len(set(values)) != len(values):
        return f"distinctAttribute {c.attribute}: {values}"
    if not c.distinct and len(set(values)) > 1:
        return f"matchAttribute {c.attribute}: {values}"
    return ""


def _request_ok(req: Request, results: Sequence[tuple[str, _Device]], node_devices: Sequence[_Device]) -> str:
    """The results of one request: one subrequest chosen, count right (All: every matching
    device of the node)."""
    mine = [(r, d) for r, d in results if r.partition("/")[0] == req.name]
    chosen = {r for r, _ in mine}
    if len(chosen) != 1:
        return f"request {req.name}: results for {sorted(chosen) or 'nothing'}"
    [name] = chosen
    shape = req.shape_of(name)
    if shape is None:
        return f"request {req.name}: result names {name}"
    want = shape.count or sum(1 for d in node_devices if shape.matches(d.attrs, d.caps) and _fits(shape, d))
    if len(mine) != want:
        return f"request {name}: {len(mine)} devices, {'all' if not shape.count else 'count'} is {want}"
    if not shape.count and want == 0:
        return f"request {name}: All of no device"
    return ""


def _fits(shape: Shape, d: _Device) -> bool:
    return not _capacity_ok(d, shape.capacity, None if not d.shared else dict(shape.capacity))


def problems(world: World, copy: str, slices: Sequence[Mapping[str, Any]], pod: Mapping[str, Any],
             claims: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every rule the claims of ``pod`` (by pod claim name, as read back) break; [] when the
    pod is not bound and no claim is allocated."""
    devices, counters = _published(slices)
    node = pod["spec"].get("nodeName")
    out: list[str] = []
    whole: dict[tuple[str, str], int] = defaultdict(int)
    spent: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    consumed: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for claim in world.claims:
        got = claims[claim.key]
        status = got.get("status") or {}
        alloc = status.get("allocation")
        if not node:
            if alloc:
                out.append(f"{claim.key}: allocated, pod not bound")
            continue
        if not alloc:
            out.append(f"{claim.key}: not allocated, pod bound to {node}")
            continue
        if pod["metadata"]["uid"] not in [r["uid"] for r in status.get("reservedFor") or []]:
            out.append(f"{claim.key}: not reserved for the pod")
        terms = alloc.get("nodeSelector", {}).get("nodeSelectorTerms") or []
        if [f["values"] for t in terms for f in t.get("matchFields", [])] != [[node]]:
            out.append(f"{claim.key}: nodeSelector {terms}")
        results: list[tuple[str, _Device]] = []
        for r in alloc["devices"]["results"]:
            d = devices.get((r["pool"], r["device"]))
            if d is None or d.node != node:
                out.append(f"{claim.key}: {r['pool']}/{r['device']} is not a device of {node}")
                continue
            shape = next((s for q in claim.requests if (s := q.shape_of(r["request"])) is not None), None)
            if shape is None or not shape.matches(d.attrs, d.caps):
                out.append(f"{claim.key}: {r['device']} does not match request {r['request']}")
            elif why := _capacity_ok(d, shape.capacity, r.get("consumedCapacity")):
                out.append(f"{claim.key}: {r['device']}: {why}")
            results.append((r["request"], d))
            key = (r["pool"], r["device"])
            if d.shared:
                for k, v in (r.get("consumedCapacity") or {}).items():
                    consumed[key][k] += parse_quantity(v)
            else:
                whole[key] += 1
            for cs, amounts in d.counter_set.items():
                for k, v in amounts.items():
                    spent[cs][k] += v
        node_devices = [d for d in devices.values() if d.node == node]
        out += [f"{claim.key}: {why}" for req in claim.requests if (why := _request_ok(req, results, node_devices))]
        out += [f"{claim.key}: {why}" for c in claim.constraints if (why := _constraint_ok(c, results, claim))]
    out += [f"{pool}/{name} allocated whole {n} times" for (pool, name), n in whole.items() if n > 1]
    for cs, amounts in spent.items():
        out += [f"counter {cs}/{k}: {v} spent of {counters.get(cs, {}).get(k, 0)}"
                for k, v in amounts.items() if v > counters.get(cs, {}).get(k, 0)]
    for key, amounts in consumed.items():
        out += [f"{key[1]}: {v} of {k} consumed, capacity {devices[key].caps.get(k, 0)}"
                for k, v in amounts.items() if v > devices[key].caps.get(k, 0)]
    return out


__all__ = ["problems"]
