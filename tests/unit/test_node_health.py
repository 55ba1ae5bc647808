"""GPU node health (IBM Autopilot's label): unhealthy nodes take no new GPU work (CPU work
still goes there), WARN nodes are chosen last, and GPU work on an EVICT node is evicted whole."""

from __future__ import annotations

from typing import Any

import pytest

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


# -- capacity lost to unhealthy nodes -----------------------------------------------------------


def _cohort(w: World, **nominal: int) -> None:
    objs: list[dict[str, Any]] = [{"metadata": {"name": "org", "uid": "q-org", "resourceVersion": "1"}, "spec": {}}]
    for name, gpus in nominal.items():
        objs.append({"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"},
                     "spec": {"parent": "org", "resources": [{"name": GPU, "nominal": str(gpus)}]}})
    w.session.on_queues_listed(objs)


def _queued_pod(w: World, name: str, gpus: int, queue: str) -> str:
    obj: dict[str, Any] = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(w.now).label(
        {"batchsched.io/queue": queue}).obj()
    w.pods[obj["metadata"]["uid"]] = obj
    w.session.on_pod("ADDED", parse_pod(obj))
    return str(obj["metadata"]["uid"])


def _statuses(w: World) -> dict[str, dict[str, Any]]:
    d = w.step(after=60)
    return dict(d.queue_statuses)


def test_the_gpus_an_unhealthy_node_cannot_give_are_withheld_from_the_cohort() -> None:
    w = World()
    for name in ("n0", "n1", "n2"):
        node(w, name)
    _cohort(w, a=8, b=16)  # the quotas promise all 24 GPUs
    running = _queued_pod(w, "a-job", 4, "a")
    w.step()
    where = node_of(w, running)
    assert "unavailable" not in _statuses(w)["org"]

    sick = next(n for n in ("n0", "n1", "n2") if n != where)
    node(w, sick, "ERR")
    org = _statuses(w)["org"]
    assert org["nominal"] == {GPU: "24"}  # the nominal as given
    assert org["unavailable"] == {GPU: "8"}
    [cond] = [c for c in org["conditions"] if c["type"] == "CapacityReduced"]
    assert cond["reason"] == "UnhealthyNodes"
    assert cond["message"].startswith("8 nvidia.com/gpu of its nominal is withheld")

    # what runs on an unhealthy node stays charged where it is: only its free GPUs are lost
    node(w, where, "ERR")
    assert _statuses(w)["org"]["unavailable"] == {GPU: "12"}  # 8 + (8 - 4)

    node(w, sick, "PASS")
    node(w, where, "PASS")
    org = _statuses(w)["org"]
    assert "unavailable" not in org and not [c for c in org["conditions"] if c["type"] == "CapacityReduced"]


def test_a_cohort_lends_no_more_than_healthy_nodes_can_back() -> None:
    w = World()
    for name in ("n0", "n1", "n2", "n3"):
        node(w, name)
    _cohort(w, a=8, b=16)  # 24 promised of 32 GPUs
    node(w, "n3", "ERR")  # 24 healthy: nothing withheld
    assert "unavailable" not in _statuses(w)["org"]
    node(w, "n2", "TESTING")  # 16 healthy of 24 promised
    assert _statuses(w)["org"]["unavailable"] == {GPU: "8"}
    # a borrows b's idle quota only as far as the healthy capacity goes: 16, not 24
    first = _queued_pod(w, "a-1", 8, "a")
    second = _queued_pod(w, "a-2", 8, "a")
    w.step(after=1)
    assert w.bound(first) and w.bound(second)
    third = _queued_pod(w, "a-3", 1, "a")
    d = w.step(after=1)
    assert not w.bound(third)
    [why] = [c.message for c in d.unschedulable if c.ref.name == "a-3"]
    assert why == (
        "queue a: needs 1 nvidia.com/gpu; nominal 8, in use 16, may borrow 0 (cohort org lends none); "
        "8 nvidia.com/gpu of org's nominal is withheld for nodes that failed GPU health checks"
    ), why


def test_each_root_gives_up_its_share_of_what_is_lost() -> None:
    from batchsched.core.queues import QueueTree

    columns = ("cpu", GPU)
    tree = QueueTree.from_objects([
        {"metadata": {"name": "x"}, "spec": {"resources": [{"name": GPU, "nominal": "16"}]}},
        {"metadata": {"name": "y"}, "spec": {"resources": [{"name": GPU, "nominal": "8"}]}},
    ], columns)
    import numpy as np
    tree.withhold(np.array([0, 24]), np.array([0, 6]))  # 18 healthy of 24 promised
    assert tree.report("x").unavailable == {GPU: 4} and tree.report("y").unavailable == {GPU: 2}
    assert tree.report("x").nominal == {GPU: 16}
    assert tree.admissible("x", np.array([0, 12])) is None
    assert tree.admissible("x", np.array([0, 13])) is not None


def test_the_queue_views_show_what_is_withheld() -> None:
    from batchsched.insight.explain import Insight

    w = World()
    for name in ("n0", "n1"):
        node(w, name)
    _cohort(w, a=8, b=8)
    node(w, "n1", "ERR")
    _statuses(w)
    rows = {q["name"]: q for q in Insight(w.session, use_jit=False).queues(w.now)["queues"]}
    [gpu] = [r for r in rows["org"]["resources"] if r["name"] == GPU]
    assert (gpu["nominal"], gpu["unavailable"]) == (16, 8)
    assert [r["unavailable"] for r in rows["a"]["resources"]] == [0]


# -- every GPU resource a quota may name ----------------------------------------------------------

SHARES = "batchsched.io/gpu"
CORE = "elasticgpu.io/gpu-core"
#: per quota resource: (a quota of 8 cards, what an 8-card node offers, what a 1-card pod asks)
QUOTAS = {
    GPU: ("8", {GPU: "8"}, {GPU: "1"}),
    SHARES: ("8", {GPU: "8"}, {GPU: "1"}),
    CORE: ("800", {CORE: "800"}, {CORE: "100"}),
}


def _card_node(w: World, name: str, resource: str, health: str = "") -> None:
    b = make_node(name).cap(cpu="64", memory="512Gi", **QUOTAS[resource][1])
    if health:
        b = b.label({LABEL: health})
    w.session.on_node("MODIFIED" if name in w.session.state.nodes else "ADDED", parse_node(b.obj()))


def _teams(w: World, resource: str, *, cohort: bool = False, **nominal: str) -> None:
    """Queues with the given nominal of ``resource``: roots, or children of cohort org."""
    objs: list[dict[str, Any]] = []
    if cohort:
        objs.append({"metadata": {"name": "org", "uid": "q-org", "resourceVersion": "1"}, "spec": {}})
    for name, amount in nominal.items():
        spec: dict[str, Any] = {"resources": [{"name": resource, "nominal": amount}]}
        if cohort:
            spec["parent"] = "org"
        objs.append({"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"}, "spec": spec})
    w.session.on_queues_listed(objs)


def _card_pods(w: World, queue: str, count: int, resource: str) -> list[str]:
    out = []
    for i in range(count):
        obj: dict[str, Any] = make_pod(f"{queue}-{i}").req(cpu="1", **QUOTAS[resource][2]).created(w.now).label(
            {"batchsched.io/queue": queue}).obj()
        w.pods[obj["metadata"]["uid"]] = obj
        w.session.on_pod("ADDED", parse_pod(obj))
        out.append(str(obj["metadata"]["uid"]))
    return out


@pytest.mark.parametrize("resource", list(QUOTAS))
def test_the_gpus_of_an_unhealthy_node_are_withheld_from_every_gpu_quota(resource: str) -> None:
    w = World()
    _card_node(w, "n0", resource)
    _card_node(w, "n1", resource, "ERR")
    _teams(w, resource, **{"team-a": QUOTAS[resource][0], "team-b": QUOTAS[resource][0]})
    first = _card_pods(w, "team-a", 8, resource)
    w.step()
    second = _card_pods(w, "team-b", 8, resource)
    w.step(after=1)
    # 8 healthy cards for 16 promised: each team is backed for half of its nominal
    assert (sum(map(w.bound, first)), sum(map(w.bound, second))) == (4, 4)
    statuses = _statuses(w)
    half = str(int(QUOTAS[resource][0]) // 2)
    for team in ("team-a", "team-b"):
        assert statuses[team]["nominal"] == {resource: QUOTAS[resource][0]}
        assert statuses[team]["unavailable"] == {resource: half}
        [cond] = [c for c in statuses[team]["conditions"] if c["type"] == "CapacityReduced"]
        assert cond["message"].startswith(f"{half} {resource} of its nominal is withheld"), cond


def test_an_exact_card_cohort_lends_no_more_than_healthy_nodes_can_back_and_lends_again_on_recovery() -> None:
    w = World()
    for name in ("n0", "n1", "n2"):
        _card_node(w, name, SHARES)
    _teams(w, SHARES, cohort=True, a="8", lender="16")  # all 24 cards promised
    _card_node(w, "n2", SHARES, "ERR")
    _card_node(w, "n1", SHARES, "TESTING")  # 8 healthy cards of 24 promised
    # a borrows the lender's idle quota only as far as healthy cards back it: none
    pods = _card_pods(w, "a", 12, SHARES)
    d = w.step(after=1)
    assert sum(map(w.bound, pods)) == 8
    waiting = next(u for u in pods if not w.bound(u))
    [why] = [c.message for c in d.unschedulable if c.ref.uid == waiting]
    assert why == (
        "queue a: needs 1 batchsched.io/gpu; nominal 8, in use 8, may borrow 0 (cohort org lends none); "
        "16 batchsched.io/gpu of org's nominal is withheld for nodes that failed GPU health checks"
    ), why
    assert _statuses(w)["org"]["unavailable"] == {SHARES: "16"}
    # one node passes again: 16 healthy of 24, and a borrows 4 of the lender's idle cards
    _card_node(w, "n1", SHARES, "PASS")
    for _ in range(5):  # (the waiting pods back off a little after failing twice)
        w.step(after=1)
    assert sum(map(w.bound, pods)) == 12
    org = _statuses(w)["org"]
    assert org["unavailable"] == {SHARES: "8"}
    assert org["used"] == {SHARES: "12"}
    # the lender's own work comes back within its backed nominal: it reclaims what a borrowed
    mine = _card_pods(w, "lender", 8, SHARES)
    evicted = [e for _ in range(5) for e in w.step(after=1).evictions]
    assert len(evicted) == 4 and {e.cause for e in evicted} == {"reclaimed"}
    assert {w.pods.get(e.uid) for e in evicted} == {None} and all(e.uid in pods for e in evicted)
    assert sum(map(w.bound, mine)) == 8
    assert sum(1 for u in pods if w.bound(u)) == 8


def test_lost_gpus_counts_every_gpu_column_and_no_ask_column() -> None:
    import numpy as np

    from batchsched.core.devices import ASK_WHOLE, CARDS_ANY, UNBOUNDED, card_compute, card_memory
    from batchsched.core.nodehealth import lost_gpus

    columns = ("cpu", GPU, SHARES, CORE, card_compute(0), card_memory(0), CARDS_ANY, ASK_WHOLE)
    alloc = np.array([[64000, 1, 1000, 100, 1000, 40960, 1, UNBOUNDED]] * 2, dtype=np.int64)
    used = np.array([[1000, 0, 0, 0, 0, 0, 0, 0], [1000, 1, 1000, 100, 1000, 0, 1, 1]], dtype=np.int64)
    capacity, lost = lost_gpus(columns=columns, sick=np.array([0, 1], dtype=np.intp), alloc=alloc, used=used)
    # the card that runs work stays charged where it is; the idle one is lost, in every GPU column
    assert dict(zip(columns, lost.tolist(), strict=True)) == {
        "cpu": 0, GPU: 1, SHARES: 1000, CORE: 100, card_compute(0): 1000, card_memory(0): 81920,
        CARDS_ANY: 1, ASK_WHOLE: 0,
    }
    assert capacity.tolist() == alloc.sum(axis=0).tolist()
