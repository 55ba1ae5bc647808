"""Topology-aware gangs through the real :meth:`Cycle.run`: PodGroups (or their first pod)
annotated ``batchsched.io/topology`` / ``batchsched.io/topology-preferred`` land inside one
rack or block, wait with a readable message, fall back, or are blocked for a bad value; a
gang without the annotation takes the plain kernel path, untouched.

The cluster: 2 blocks x 2 racks x 4 nodes x 8 GPUs, node ``nXX`` in rack ``rack-(XX//4)``
and block ``block-(XX//8)``. Gang members ask for a whole node (8 GPUs) each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from batchsched.core import placer as placer_module
from batchsched.core.cycle import Cycle
from batchsched.core.gangs import GroupBook, free_capacity
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Node, Pod, PodUID
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.placement.topology import (
    BLOCK_LABEL,
    CLUSTER,
    RACK_LABEL,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
)
from batchsched.core.plan import Plan, Unit, single_unit
from tests.builders import make_group, make_node, make_pod
from tests.unit.queue_world import QueueWorld

RACK = {TOPOLOGY_ANNOTATION: "rack"}


def labelled_nodes() -> list[Node]:
    return [
        make_node(f"n{i:02}").cap(cpu="96", memory="1024Gi", gpu=8)
        .label({RACK_LABEL: f"rack-{i // 4}", BLOCK_LABEL: f"block-{i // 8}"}).build()
        for i in range(16)
    ]


def rack_of(node: str) -> str:
    return f"rack-{int(node[1:]) // 4}"


@dataclass
class World:
    state: ClusterState = field(default_factory=ClusterState)
    book: GroupBook = field(default_factory=GroupBook)
    cycle: Cycle = field(default_factory=lambda: Cycle(ScoringConfig()))

    def __post_init__(self) -> None:
        for node in labelled_nodes():
            self.state.node_event("ADDED", node)

    def pod(self, pod: Pod, kind: str = "MODIFIED") -> None:
        self.state.pod_event(kind, pod)
        self.book.pod_event(kind, pod)

    def busy(self, *nodes: int, gpus: int = 1) -> World:
        """A running single pod using ``gpus`` GPUs on each of ``nodes``."""
        for i in nodes:
            name = f"busy-{i:02}-{gpus}"
            self.pod(make_pod(name).uid(name).req(cpu="1", gpu=gpus).running(f"n{i:02}").build(), "ADDED")
        return self

    def gang(
        self,
        name: str,
        size: int,
        *,
        min_member: int | None = None,
        annotations: Mapping[str, str] | None = None,
        pod_annotations: Mapping[str, str] | None = None,
    ) -> str:
        group = make_group(name).min_member(min_member or size)
        if annotations:
            group.annotate(annotations)
        g = group.build()
        self.book.group_event("ADDED", g)
        for i in range(size):
            b = make_pod(f"{name}-{i}").uid(f"{name}-{i}").req(cpu="8", memory="64Gi", gpu=8).group(name)
            if pod_annotations:
                b.annotate(pod_annotations)
            self.pod(b.build(), "ADDED")
        return g.key

    def units(self) -> list[Unit]:
        singles = [single_unit(p) for uid, p in self.state.pending.items() if not self.book.in_group(uid)]
        return singles + self.book.units(self.state, 0.0, lambda: free_capacity(self.state.snapshot()))

    def run(self) -> Plan:
        plan = self.cycle.run(self.state.snapshot(), self.units())
        for b in plan.bindings:
            self.state.assume(PodUID(b.uid), b.node)
        return plan

    def confirm(self) -> None:
        """The watch shows every assumed pod bound and running."""
        for uid, node in list(self.state.assumed.items()):
            self.pod(replace(self.state.pods[uid], node_name=node, phase="Running"))


def nodes_of(plan: Plan, key: str) -> list[str]:
    return sorted(b.node for b in plan.bindings if b.unit == key)


def test_podgroup_annotations_are_kept() -> None:
    group = make_group("g").annotate({TOPOLOGY_ANNOTATION: "rack"}, note="x").build()
    assert group.annotations == {TOPOLOGY_ANNOTATION: "rack", "note": "x"}
    assert make_group("h").build().annotations == {}


def test_a_rack_gang_lands_in_the_one_rack_that_holds_it() -> None:
    # single pods scattered: whole free nodes per rack 3, 2, 4, 3
    w = World().busy(0, 4, 5, 12)
    key = w.gang("train", 4, annotations=RACK)
    plan = w.run()
    assert nodes_of(plan, key) == ["n08", "n09", "n10", "n11"]
    assert plan.placed_where == {key: "rack rack-2"}
    assert {b.where for b in plan.bindings} == {"rack rack-2"}
    assert plan.unschedulable == []


def test_the_topology_can_come_from_the_first_member_when_the_podgroup_has_none() -> None:
    w = World().busy(0, 4, 5, 12)
    key = w.gang("train", 4, pod_annotations=RACK)
    plan = w.run()
    assert nodes_of(plan, key) == ["n08", "n09", "n10", "n11"]
    # the PodGroup's own annotation wins over its pods'
    w = World().busy(0, 4, 8, 12)
    key = w.gang("other", 4, annotations={TOPOLOGY_PREFERRED_ANNOTATION: "block"},
                 pod_annotations={TOPOLOGY_ANNOTATION: "nonsense"})
    plan = w.run()
    assert plan.placed_where == {key: "block block-0"}


def test_a_required_rack_that_no_rack_can_hold_waits_and_says_why() -> None:
    w = World().busy(0, 4, 8, 12)  # every rack: 3 whole nodes free, 31 GPUs
    key = w.gang("train", 4, annotations=RACK)
    plan = w.run()
    assert plan.bindings == [] and plan.placed_units == {}
    message = (
        "no rack can hold the gang's 4 members together (they need 32 cpu, 256Gi memory, "
        "32 nvidia.com/gpu); largest free in one rack: 31 nvidia.com/gpu (rack rack-0)"
    )
    assert plan.failed_units == {key: message}
    assert sorted(u.pod.name for u in plan.unschedulable) == [f"train-{i}" for i in range(4)]
    assert {u.message for u in plan.unschedulable} == {message}
    # the same gang merely preferring a rack is placed across racks
    w = World().busy(0, 4, 8, 12)
    key = w.gang("train", 4, annotations={TOPOLOGY_PREFERRED_ANNOTATION: "rack"})
    plan = w.run()
    assert plan.placed_where == {key: "block block-0"}
    assert {rack_of(n) for n in nodes_of(plan, key)} == {"rack-0", "rack-1"}


def test_a_preferred_block_keeps_the_gang_in_a_block_else_falls_back_to_the_cluster() -> None:
    # every rack has 3 whole nodes free, every block 6: the gang fits a block, not a rack
    w = World().busy(0, 4, 8, 12)
    key = w.gang("train", 4, annotations={TOPOLOGY_PREFERRED_ANNOTATION: "block"})
    plan = w.run()
    assert plan.placed_where == {key: "block block-0"}
    assert all(int(n[1:]) < 8 for n in nodes_of(plan, key))
    assert {b.where for b in plan.bindings} == {"block block-0"}
    # 3 whole nodes free per block: no block holds the gang, the cluster does
    w = World().busy(0, 1, 4, 5, 6, 8, 9, 12, 13, 14)
    key = w.gang("train", 4, annotations={TOPOLOGY_PREFERRED_ANNOTATION: "block"})
    plan = w.run()
    assert plan.placed_where == {key: CLUSTER}
    assert len(nodes_of(plan, key)) == 4
    assert {b.where for b in plan.bindings} == {""}  # the pods are told no domain
    # ... where a required block waits
    w = World().busy(0, 1, 4, 5, 6, 8, 9, 12, 13, 14)
    key = w.gang("train", 4, annotations={TOPOLOGY_ANNOTATION: "block"})
    plan = w.run()
    assert plan.bindings == []
    assert plan.failed_units[key].endswith(
        "2 block(s) have enough free in total, but not on nodes where each member fits"
    )


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({TOPOLOGY_ANNOTATION: "rak"}, "annotation batchsched.io/topology: 'rak' is not rack or block"),
        ({TOPOLOGY_PREFERRED_ANNOTATION: "zone"},
         "annotation batchsched.io/topology-preferred: 'zone' is not rack or block"),
        ({TOPOLOGY_ANNOTATION: "rack", TOPOLOGY_PREFERRED_ANNOTATION: "block"},
         "set only one of the annotations batchsched.io/topology and batchsched.io/topology-preferred"),
    ],
)
def test_a_bad_topology_annotation_blocks_the_gang_with_a_clear_message(
    annotations: dict[str, str], message: str
) -> None:
    w = World()
    key = w.gang("train", 4, annotations=annotations)
    [unit] = [u for u in w.units() if u.key == key]
    assert unit.blocked == message
    assert unit.blocked_reason == "InvalidTopology"
    plan = w.run()
    assert plan.bindings == []
    assert plan.failed_units == {key: message}
    assert {u.message for u in plan.unschedulable} == {message}


def test_an_unannotated_gang_takes_the_plain_kernel_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("topology placement used for a gang that asked for none")

    monkeypatch.setattr(placer_module, "place_gang_topology", never)
    monkeypatch.setattr(placer_module, "topology_placer", never)
    monkeypatch.setattr(placer_module.DomainCache, "get", never)
    w = World().busy(0, 4, 5, 12)
    key = w.gang("train", 4)
    [unit] = w.units()
    assert (unit.topology_level, unit.topology_required, unit.placed_on) == (None, False, ())
    plan = w.run()
    # the packing kernel as before: the lowest free nodes, across racks
    assert nodes_of(plan, key) == ["n01", "n02", "n03", "n06"]
    assert plan.placed_where == {}
    assert {b.where for b in plan.bindings} == {""}


def test_the_extras_of_a_required_gang_stay_in_its_rack() -> None:
    # rack-3 is the tightest rack that holds the quorum (6 GPUs free on n12)
    w = World().busy(0, 4, 8).busy(12, gpus=2)
    key = w.gang("train", 4, min_member=3, annotations=RACK)
    plan = w.run()
    assert nodes_of(plan, key) == ["n13", "n14", "n15"]
    # the extra does not go to another rack, and is told why
    [extra] = plan.unschedulable
    assert extra.pod.name == "train-3"
    assert extra.message == (
        "elastic member beyond the gang's quorum: its gang is placed in rack rack-3 and must "
        "stay there: 0/16 nodes fit: 4 insufficient nvidia.com/gpu."
    )
    w.confirm()
    [unit] = w.units()
    assert (unit.min_count, unit.placed_on) == (0, ("n13", "n14", "n15"))
    plan = w.run()
    assert plan.bindings == []  # still no room in rack-3, though n01 is free
    assert plan.failed_units[key].startswith("elastic member beyond the gang's quorum: its gang is placed in rack rack-3")
    w.pod(w.state.pods[PodUID("busy-12-2")], "DELETED")
    plan = w.run()
    assert nodes_of(plan, key) == ["n12"]  # the plain kernel would have taken n01
    assert plan.placed_where == {key: "rack rack-3"}


def test_preemption_for_a_required_gang_frees_one_rack() -> None:
    w = QueueWorld()
    for node in labelled_nodes():
        w.state.node_event("ADDED", node)
    # every node runs a low-priority whole-node pod; the newest (cheapest to evict) are one
    # per rack: a plain search would evict those four
    cheap = [0, 4, 8, 12]
    for i in range(16):
        start = 1000.0 - cheap.index(i) if i in cheap else 100.0 + i
        w.unit(f"low{i:02}", [{"gpu": 8, "cpu": 1}], nodes=[f"n{i:02}"], start=start)
    group = make_group("train").min_member(4).annotate(RACK).build()
    w.groups.group_event("ADDED", group)
    w.names[group.key] = "train"
    for i in range(4):
        w.pod(make_pod(f"train-{i}").uid(f"train-{i}").priority(100).req(cpu="8", memory="64Gi", gpu=8)
              .group("train").obj(), "ADDED")
    plan = w.step(2000.0)
    assert plan.bindings == []
    [rec] = plan.preemptions
    victims = sorted(w.state.pods[PodUID(p.uid)].node_name for v in rec.victims for p in v.pods)
    assert victims == ["n12", "n13", "n14", "n15"]
    [nomination] = plan.nominations
    assert sorted(nomination.nodes) == ["n12", "n13", "n14", "n15"]
