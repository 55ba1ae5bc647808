"""DeviceTaintRules: an administrator's taint on the devices a rule selects, as if the
driver had published it in their ResourceSlice. A device tainted ``NoSchedule`` or
``NoExecute`` goes to no new claim that does not tolerate the taint; the rule deleted,
the device is handed out again. A rule that cannot be read says which field, and why."""

from __future__ import annotations

from typing import Any

import pytest

from batchsched.core.dra.objects import (
    DeviceId,
    DraError,
    Pools,
    parse_device_taint_rule,
    parse_resource_slice,
)
from batchsched.kube.snapshot import COLLECTIONS
from batchsched.sandbox import gpudra
from batchsched.simulate import snapshot
from tests.unit.test_dra_scheduling import DRIVER, DraWorld, gpu_slice
from tests.unit.test_simulate_dra import named, node, pod


def rule(name: str, *, effect: str = "NoSchedule", key: str = "example.com/broken", value: str = "",
         selector: dict[str, Any] | None = None, **select: str) -> dict[str, Any]:
    """A DeviceTaintRule selecting the devices ``select`` names (driver, pool, device);
    ``selector``: the deviceSelector as written (overrides ``select``)."""
    taint = {"key": key, "effect": effect, **({"value": value} if value else {})}
    spec: dict[str, Any] = {"taint": taint}
    if selector is not None or select:
        spec["deviceSelector"] = selector if selector is not None else dict(select)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": name, "uid": f"rule-{name}"}, "spec": spec}


def taints(pools: Pools, node: str, device: str) -> list[str]:
    d = pools.device(DeviceId(DRIVER, node, device))
    assert d is not None
    return [f"{t.key}={t.value}:{t.effect}" for t in d.taints]


# -- reading a rule -----------------------------------------------------------------------


def test_a_rule_is_read_with_its_selector_and_taint() -> None:
    r = parse_device_taint_rule(rule("bad-gpu", effect="NoExecute", value="xid-79", driver=DRIVER, pool="n0",
                                     device="gpu-3"))
    assert (r.name, r.driver, r.pool, r.device) == ("bad-gpu", DRIVER, "n0", "gpu-3")
    assert (r.taint.key, r.taint.value, r.taint.effect) == ("example.com/broken", "xid-79", "NoExecute")


@pytest.mark.parametrize(("spec", "reason"), [
    ({"taint": {"effect": "NoSchedule"}, "deviceSelector": {}},
     "DeviceTaintRule r: spec.taint.key is missing"),
    ({"taint": {"key": "k"}, "deviceSelector": {}},
     "DeviceTaintRule r: spec.taint.effect is missing"),
    ({"deviceSelector": {}},
     "DeviceTaintRule r: spec.taint.key is missing"),
    ({"taint": {"key": "k", "effect": "NoSchedule"}, "deviceSelector": {"driver": 7}},
     "DeviceTaintRule r: spec.deviceSelector.driver is not a string"),
    ({"taint": {"key": "k", "effect": "NoSchedule"}, "deviceSelector": {"deviceClassName": "gpu.nvidia.com"}},
     "DeviceTaintRule r: spec.deviceSelector.deviceClassName is not supported"),
    ({"taint": {"key": "k", "effect": "NoSchedule"},
      "deviceSelector": {"selectors": [{"cel": {"expression": "true"}}]}},
     "DeviceTaintRule r: spec.deviceSelector.selectors is not supported"),
])
def test_a_rule_that_cannot_be_read_says_which_field(spec: dict[str, Any], reason: str) -> None:
    with pytest.raises(DraError) as exc:
        parse_device_taint_rule({"metadata": {"name": "r"}, "spec": spec})
    assert str(exc.value).startswith(reason), str(exc.value)


# -- which devices a rule taints ------------------------------------------------------------


def test_a_rule_taints_exactly_the_devices_its_selector_matches() -> None:
    slices = [parse_resource_slice(gpu_slice(n, 2)) for n in ("n0", "n1")]
    one = parse_device_taint_rule(rule("one", value="v", driver=DRIVER, pool="n0", device="gpu-1"))
    pool = parse_device_taint_rule(rule("pool", key="example.com/drain", effect="NoExecute", pool="n1"))
    other = parse_device_taint_rule(rule("other", key="example.com/other", driver="other.example.com"))
    pools = Pools(slices, [one, pool, other])
    assert taints(pools, "n0", "gpu-0") == []
    assert taints(pools, "n0", "gpu-1") == ["example.com/broken=v:NoSchedule"]
    assert taints(pools, "n1", "gpu-0") == taints(pools, "n1", "gpu-1") == ["example.com/drain=:NoExecute"]
    # the slices as read are not changed: a rule deleted, the devices are as published
    assert taints(Pools(slices), "n0", "gpu-1") == []


def test_an_empty_selector_taints_every_device_and_no_selector_none() -> None:
    slices = [parse_resource_slice(gpu_slice("n0", 2))]
    every = Pools(slices, [parse_device_taint_rule(rule("all", selector={}))])
    none = Pools(slices, [parse_device_taint_rule(rule("none"))])
    assert taints(every, "n0", "gpu-0") == taints(every, "n0", "gpu-1") == ["example.com/broken=:NoSchedule"]
    assert taints(none, "n0", "gpu-0") == taints(none, "n0", "gpu-1") == []


# -- scheduling around tainted devices ------------------------------------------------------


def taint_rule(w: DraWorld, kind: str, obj: dict[str, Any]) -> None:
    w.session.on_device_taint_rule(kind, parse_device_taint_rule(obj))


def test_a_new_claim_does_not_get_a_device_a_rule_taints_and_waits_told_why_when_none_is_left() -> None:
    w = DraWorld()
    w.node("n0", 2)
    taint_rule(w, "ADDED", rule("bad", driver=DRIVER, pool="n0", device="gpu-0"))
    for name in ("a", "b"):
        w.claim(name)
    a = w.pod("a", "a")
    w.step()
    assert w.node_of(a) == "n0" and w.devices_of("a") == ["gpu-1"]
    b = w.pod("b", "b")
    d = w.step()
    assert not w.node_of(b) and not w.devices_of("b")
    assert "deviceclass.resource.kubernetes.io/gpu.nvidia.com" in w.told(d, b), w.told(d, b)
    # the rule deleted: the device is handed out again
    taint_rule(w, "DELETED", rule("bad", driver=DRIVER, pool="n0", device="gpu-0"))
    w.step(after=30)
    assert w.node_of(b) == "n0" and w.devices_of("b") == ["gpu-0"]


def test_a_claim_no_untainted_device_can_serve_is_told_the_taint() -> None:
    w = DraWorld()
    w.node("n0", 1)
    taint_rule(w, "ADDED", rule("bad", effect="NoExecute", value="xid-79", selector={}))
    w.claim("a")
    a = w.pod("a", "a")
    d = w.step()
    assert not w.node_of(a)
    assert "example.com/broken=xid-79:NoExecute" in w.told(d, a), w.told(d, a)


def test_a_request_tolerating_the_taint_may_get_the_tainted_device() -> None:
    w = DraWorld()
    w.node("n0", 2)
    taint_rule(w, "ADDED", rule("bad", driver=DRIVER, pool="n0", device="gpu-0"))
    w.claim("plain")
    plain = w.pod("plain", "plain")
    w.step()
    assert w.devices_of("plain") == ["gpu-1"]
    w.claim("tolerant", tolerations=[{"key": "example.com/broken", "operator": "Exists", "effect": "NoSchedule"}])
    tolerant = w.pod("tolerant", "tolerant")
    w.step()
    assert w.node_of(plain) == w.node_of(tolerant) == "n0"
    assert w.devices_of("tolerant") == ["gpu-0"]


def test_a_rule_of_effect_none_or_an_unknown_effect_keeps_no_claim_off_the_device() -> None:
    w = DraWorld()
    w.node("n0", 1)
    taint_rule(w, "ADDED", rule("note", effect="None", selector={}))
    taint_rule(w, "ADDED", rule("later", effect="NoExecuteWithPodDisruptionBudget", key="example.com/k", selector={}))
    w.claim("a")
    a = w.pod("a", "a")
    w.step()
    assert w.node_of(a) == "n0" and w.devices_of("a") == ["gpu-0"]


def test_rules_listed_anew_replace_those_known() -> None:
    w = DraWorld()
    w.node("n0", 1)
    w.session.on_device_taint_rules_listed([parse_device_taint_rule(rule("bad", selector={}))])
    w.claim("a")
    a = w.pod("a", "a")
    w.step()
    assert not w.node_of(a)
    w.session.on_device_taint_rules_listed([])
    w.step(after=30)
    assert w.node_of(a) == "n0"



def test_a_snapshot_replays_the_rules_taints() -> None:
    """``batchsched snapshot`` lists the rules, and a replay does not hand out a GPU one taints."""
    assert COLLECTIONS["devicetaintrules"] == "/apis/resource.k8s.io/v1/devicetaintrules"
    bad = rule("bad", driver=gpudra.DRIVER, pool="n0", device="gpu-0")
    snap = {"kind": snapshot.KIND, "config": {}, "objects": {
        "nodes": [node("n0")], "pods": [pod("p", claim="c")],
        "resourceslices": gpudra.gpu_node_slices("n0", gpus=2, node_uid="uid-n0"),
        "deviceclasses": gpudra.device_classes(extended_resource=False), "devicetaintrules": [bad],
        "resourceclaims": [named(gpudra.resource_claim("c", "gpu.nvidia.com"))],
    }}
    sim = snapshot.load(snap, now=1e9, use_jit=False)
    sim.step(1e9)
    assert sim.placed["uid-p"].devices == ("n0/gpu-1",)
