"""GPU node health (IBM Autopilot's label): unhealthy nodes take no new GPU work (CPU work
still goes there), WARN nodes are chosen last, and GPU work on an EVICT node is evicted whole."""

from __future__ import annotations

from typing import Any

from batchsched.core.model import parse_node, parse_pod
from tests.builders import make_node, make_pod
from tests.unit.test_insight import GPU, World

LABEL = "autopilot.ibm.com/gpuhealth"


def node(w: World, name: str, health: str = "") -> None:
    b = make_node(name).cap(cpu="64", memory="512Gi", **{GPU: "8"})
    if health:
        b = b.label({LABEL: health})
    w.session.on_node("ADDED", parse_node(b.obj()))


def pod(w: World, name: str, gpus: int = 0, group: str = "") -> str:
    b = make_pod(name).req(cpu="1", **({GPU: str(gpus)} if gpus else {})).created(w.now)
    if group:
        b = b.group(group)
    obj: dict[str, Any] = b.obj()
    w.pods[obj["metadata"]["uid"]] = obj
    w.session.on_pod("ADDED", parse_pod(obj))
    return str(obj["metadata"]["uid"])


def node_of(w: World, uid: str) -> str:
    return str(w.pods[uid]["spec"].get("nodeName", ""))


def test_unhealthy_nodes_take_no_gpu_work_but_cpu_work() -> None:
    for health in ("ERR", "TESTING", "EVICT"):
        w = World()
        node(w, "sick", health)
        gpu = pod(w, "trainer", 1)
        cpu = pod(w, "etl")
        d = w.step()
        assert node_of(w, cpu) == "sick" and not node_of(w, gpu)
        [why] = [c.message for c in d.unschedulable if c.ref.name == "trainer"]
        assert why == f"0/1 nodes fit: 1 untolerated taint {LABEL}={health}.", why


def test_a_warned_node_is_chosen_last() -> None:
    w = World()
    node(w, "a-warn", "WARN")
    node(w, "b-ok", "PASS")
    first = pod(w, "one", 1)
    w.step()
    assert node_of(w, first) == "b-ok"  # packing alone would not tell them apart
    rest = [pod(w, f"more-{i}", 1) for i in range(8)]
    w.step(after=1)
    assert sorted(node_of(w, u) for u in rest) == ["a-warn"] + ["b-ok"] * 7  # still usable when needed


def test_gpu_work_on_an_evict_node_is_evicted_whole() -> None:
    w = World()
    node(w, "n0")
    node(w, "n1")
    w.group("train", 2)
    members = [pod(w, f"train-{i}", 8, group="train") for i in range(2)]
    cpu = pod(w, "etl")
    w.step()
    assert all(node_of(w, u) for u in members)
    bad = node_of(w, members[0])
    on_bad = node_of(w, cpu) == bad
    w.session.on_node("MODIFIED", parse_node(make_node(bad).cap(cpu="64", memory="512Gi", **{GPU: "8"})
                                             .label({LABEL: "EVICT"}).obj()))
    d = w.step(after=1)
    assert sorted(e.uid for e in d.evictions) == sorted(members)  # the whole gang, not the CPU pod
    assert {e.cause for e in d.evictions} == {"node-health"}
    assert all(e.reason == f"node {bad}'s GPUs are marked {LABEL}=EVICT: the job restarts elsewhere" for e in d.evictions)
    assert not on_bad or cpu not in {e.uid for e in d.evictions}
    assert w.step(after=1).evictions == []  # each once
