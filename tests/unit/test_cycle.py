"""The cycle over a mirror built from pod and node objects: placement, packing, explanations."""

from __future__ import annotations

import numpy as np
import pytest

from batchsched.core.cycle import Cycle
from batchsched.core.mirror import ClusterState, StateError
from batchsched.core.model import PodUID
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import single_unit
from tests.builders import make_node, make_pod


def mirror(*objs: object) -> ClusterState:
    from batchsched.core.model import Node, Pod

    state = ClusterState()
    for o in objs:
        if isinstance(o, Node):
            state.node_event("ADDED", o)
        elif isinstance(o, Pod):
            state.pod_event("ADDED", o)
    return state


def run(state: ClusterState, *, use_jit: bool = True, scoring: ScoringConfig | None = None):  # type: ignore[no-untyped-def]
    cycle = Cycle(scoring or ScoringConfig(), use_jit=use_jit)
    units = [single_unit(p) for p in state.pending.values() if not p.gated]
    return cycle.run(state.snapshot(), units)


@pytest.mark.parametrize("use_jit", [True, False])
def test_gpu_packing_fills_the_busiest_node_first(use_jit: bool) -> None:
    state = mirror(
        make_node("a").cap(cpu="64", memory="256Gi", gpu=8).build(),
        make_node("b").cap(cpu="64", memory="256Gi", gpu=8).build(),
        make_pod("running").req(gpu=3).running("b").build(),
        make_pod("new").req(gpu=1).uid("u-new").build(),
    )
    plan = run(state, use_jit=use_jit)
    assert [(b.name, b.node) for b in plan.bindings] == [("new", "b")]


def test_whole_node_job_still_fits_after_packing_small_ones() -> None:
    nodes = [make_node(f"n{i}").cap(cpu="64", memory="256Gi", gpu=8).build() for i in range(2)]
    small = [make_pod(f"s{i}").req(gpu=1).uid(f"s{i}").created(i).build() for i in range(8)]
    state = mirror(*nodes, *small)
    plan = run(state)
    assert len({b.node for b in plan.bindings}) == 1  # all eight on one node
    for b in plan.bindings:
        state.assume(PodUID(b.uid), b.node)
    state.pod_event("ADDED", make_pod("whole").req(gpu=8).uid("whole").build())
    plan = run(state)
    assert [b.name for b in plan.bindings] == ["whole"]


def test_priority_order_then_age() -> None:
    state = mirror(
        make_node("n").cap(cpu="4", memory="8Gi").build(),
        make_pod("old-low").req(cpu="3").priority(0).created(1).uid("a").build(),
        make_pod("new-high").req(cpu="3").priority(100).created(5).uid("b").build(),
    )
    plan = run(state)
    assert [b.name for b in plan.bindings] == ["new-high"]
    [u] = plan.unschedulable
    assert u.pod.name == "old-low"
    # at the head of its queue, it holds the node for when new-high (no declared end) ends
    assert u.message == ("0/1 nodes fit: 1 insufficient cpu; holds a reservation on node(s) n; "
                         "start time unknown (running work on those nodes declares no end)")


def test_unschedulable_message_counts_reasons() -> None:
    nodes = [make_node(f"gpu{i}").cap(cpu="8", memory="32Gi", gpu=8).build() for i in range(3)]
    nodes += [make_node("broken").cap(cpu="8", memory="32Gi", gpu=8).taint("gpu", "broken").build()]
    pods = [make_pod(f"busy{i}").req(gpu=8).running(f"gpu{i}").build() for i in range(3)]
    state = mirror(*nodes, *pods, make_pod("p").req(gpu=2).build())
    plan = run(state)
    [u] = plan.unschedulable
    assert u.message == "0/4 nodes fit: 3 insufficient nvidia.com/gpu, 1 untolerated taint gpu=broken."


def test_resource_no_node_has_is_reported() -> None:
    state = mirror(make_node("n").cap(cpu="8", memory="8Gi").build(), make_pod("p").req({"example.com/fpga": 1}).build())
    [u] = run(state).unschedulable
    assert "example.com/fpga" in u.message


def test_pods_of_other_schedulers_are_not_pending_but_count_as_used() -> None:
    state = mirror(
        make_node("n").cap(cpu="4", memory="8Gi").build(),
        make_pod("theirs").scheduler("default-scheduler").req(cpu="1").build(),
        make_pod("theirs-bound").scheduler("default-scheduler").req(cpu="3").running("n").build(),
        make_pod("ours").req(cpu="2").build(),
    )
    assert [p.name for p in state.pending.values()] == ["ours"]
    plan = run(state)
    assert plan.bindings == []


def test_gated_and_deleting_pods_are_never_placed() -> None:
    state = mirror(
        make_node("n").cap(cpu="4", memory="8Gi").build(),
        make_pod("gated").gate().build(),
        make_pod("deleting").deleting().build(),
    )
    assert [p.name for p in state.pending.values()] == ["gated"]
    assert run(state).bindings == []


def test_max_pods_per_node() -> None:
    state = mirror(
        make_node("n").cap(cpu="64", memory="64Gi", pods=2).build(),
        *[make_pod(f"p{i}").req(cpu="100m").uid(f"p{i}").created(i).build() for i in range(3)],
    )
    plan = run(state)
    assert len(plan.bindings) == 2
    assert "insufficient pods" in plan.unschedulable[0].message


def test_pod_anti_affinity_is_honoured_not_ignored() -> None:
    state = mirror(
        make_node("n").cap(cpu="4", memory="8Gi").label({"kubernetes.io/hostname": "n"}).build(),
        make_pod("x").label(app="x").uid("x").running("n").build(),
        make_pod("p").pod_anti_affinity(app="x").build(),
    )
    plan = Cycle(ScoringConfig()).run(state.snapshot(), [single_unit(p) for p in state.pending.values()], state=state)
    assert plan.bindings == []
    assert "pod anti-affinity" in plan.unschedulable[0].message


def test_assume_forget_and_confirm_keep_usage_consistent() -> None:
    state = mirror(make_node("n").cap(cpu="4", memory="8Gi", gpu=4).build(), make_pod("p").req(gpu=2).uid("p").build())
    gpu = state.columns.index("nvidia.com/gpu")
    state.assume(PodUID("p"), "n")
    assert state.used[state.node_row["n"], gpu] == 2
    assert not state.pending
    state.forget(PodUID("p"))
    assert state.used[state.node_row["n"], gpu] == 0
    assert list(state.pending) == ["p"]
    state.assume(PodUID("p"), "n")
    state.pod_event("MODIFIED", make_pod("p").req(gpu=2).uid("p").running("n").build())
    assert not state.assumed and state.used[state.node_row["n"], gpu] == 2
    state.pod_event("MODIFIED", make_pod("p").req(gpu=2).uid("p").node("n").phase("Succeeded").build())
    assert state.used[state.node_row["n"], gpu] == 0
    state.check()
    with pytest.raises(StateError):
        state.assume(PodUID("missing"), "n")


def test_node_removed_and_readded_keeps_charges() -> None:
    node = make_node("n").cap(cpu="4", memory="8Gi").build()
    state = mirror(node, make_pod("p").req(cpu="1").uid("p").running("n").build())
    state.node_event("DELETED", node)
    assert "n" not in state.nodes
    state.node_event("ADDED", node)
    assert state.used[state.node_row["n"], state.columns.index("cpu")] == 1000
    state.check()


def test_new_resource_column_appears() -> None:
    state = mirror(make_node("n").cap({"example.com/fpga": 2}, cpu="4", memory="8Gi").build(),
                   make_pod("p").req({"example.com/fpga": 1}).uid("p").build())
    plan = run(state)
    assert [b.node for b in plan.bindings] == ["n"]
    assert np.all(state.snapshot().alloc >= 0)


def test_relist_drops_vanished_objects_and_keeps_assumed_pods() -> None:
    n1 = make_node("n1").cap(cpu="8", memory="8Gi").build()
    n2 = make_node("n2").cap(cpu="8", memory="8Gi").build()
    gone = make_pod("gone").req(cpu="1").uid("gone").running("n1").build()
    waiting = make_pod("waiting").req(cpu="2").uid("waiting").build()
    state = mirror(n1, n2, gone, waiting)
    state.assume(PodUID("waiting"), "n2")
    cpu = state.columns.index("cpu")
    # the relist no longer has "gone" nor node n1; "waiting" is still unbound (bind in flight)
    state.replace_nodes([n2])
    state.replace_pods([waiting])
    assert "gone" not in state.pods and "n1" not in state.nodes
    assert state.assumed == {"waiting": "n2"}
    assert state.used[state.node_row["n2"], cpu] == 2000
    assert not state.pending
    state.check()
    # replaying the same relist twice changes nothing
    state.replace_pods([waiting])
    assert state.used[state.node_row["n2"], cpu] == 2000
    state.check()
