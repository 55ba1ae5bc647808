"""The demo's trace act, without a cluster: every task becomes a pod batchsched reads as the
card ask the trace meant, the nodes offer the same GPUs both ways, and the card report reads
what pods hold from their annotations."""

from __future__ import annotations

from typing import Any

from batchsched import demo
from batchsched.core import devices
from batchsched.core.quantity import to_units

CORE = devices.ELASTIC_CORE


def test_every_task_asks_for_the_cards_the_trace_gave_it() -> None:
    tasks = demo.load_tasks()
    assert len(tasks) == 214
    assert sum(1 for t in tasks if t.shared) == 80
    for t in tasks:
        body = t.pod()
        asks = devices.card_asks(body["spec"], body["metadata"]["annotations"])
        if not t.gpus:
            assert asks == ()
            continue
        (ask,) = asks
        assert ask.elastic and ask.recorded
        if t.shared:
            assert ask.whole == 0 and 0 < ask.share < devices.MILLI
            assert abs(ask.share - t.gpu_milli) <= 5
        else:
            assert ask.whole == t.gpus and ask.share == 0


def test_pods_that_never_end_carry_no_duration() -> None:
    t = demo.load_tasks()[0]
    assert "batchsched.io/sim-duration" in t.pod()["metadata"]["annotations"]
    assert t.pod(finite=False)["metadata"]["annotations"] == {}


def test_a_share_is_at_least_one_percent_and_never_a_whole_card() -> None:
    tiny = demo.Task("t", 1000, 1024, 1, 3, "BE", 10)
    almost = demo.Task("a", 1000, 1024, 1, 996, "BE", 10)
    assert (tiny.core, almost.core) == (1, 99)


def test_nodes_offer_their_gpus_whole_and_as_elastic_cards() -> None:
    for shape in demo.SHAPES:
        alloc = shape.manifest(0)["status"]["allocatable"]
        units = {r: to_units(r, v) for r, v in alloc.items()}
        assert devices.node_cards(units, {}) == (shape.gpus, demo.CARD_MIB)
        assert units[CORE] == 100 * units[devices.NVIDIA_GPU]


def _node(name: str, cards: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {devices.MODEL_LABEL: "T4"}},
            "status": {"allocatable": {"cpu": "32", CORE: str(100 * cards)}}}


def _pod(name: str, node: str, core: int, cards: str | None, phase: str = "Running") -> dict[str, Any]:
    notes = {devices.ELASTIC_CONTAINER_PREFIX + "task": cards} if cards is not None else {}
    return {
        "metadata": {"name": name, "annotations": notes,
                     "labels": {devices.ELASTIC_ASSUMED: "true"} if cards is not None else {}},
        "spec": {"nodeName": node, "containers": [
            {"name": "task", "resources": {"requests": {"cpu": "2", CORE: str(core)}}}]},
        "status": {"phase": phase},
    }


def test_the_card_report_counts_shares_by_their_fraction() -> None:
    nodes = [_node("t4-0", 2), _node("t4-1", 2)]
    pods = [
        _pod("whole", "t4-0", 100, "1"),
        _pod("half", "t4-0", 50, "0"),
        _pod("third", "t4-0", 30, "0"),
        _pod("done", "t4-1", 200, "0,1", phase="Succeeded"),
    ]
    report = demo.card_report(nodes, pods)
    assert report.nodes["t4-0"].held == [800, 1000]
    assert report.nodes["t4-0"].cpu_used == 6000
    assert report.nodes["t4-1"].held == [0, 0]
    assert report.cards == 4 and report.held == 1800
    assert report.ratio == 1800 / 4000
    assert report.free_cards == 2 and report.partial == [800]
    assert demo._healthy(report)


def test_the_card_report_flags_missing_annotations_and_overcommitted_cards() -> None:
    nodes = [_node("t4-0", 2)]
    report = demo.card_report(nodes, [_pod("a", "t4-0", 60, "0"), _pod("b", "t4-0", 60, "0"),
                                      _pod("c", "t4-0", 100, None), _pod("d", "t4-0", 200, "1")])
    assert report.overcommitted == ["t4-0 card 0"]
    assert sorted(set(report.unnamed)) == ["c", "d"]
    assert not demo._healthy(report)


def test_the_dra_act_tells_which_mig_partition_of_which_gpu_each_pod_got() -> None:
    from batchsched.sandbox import gpudra

    slices = gpudra.gpu_node_slices("a100-dra-0", gpus=2, mig="partitionable")
    pods = [demo._mig_pod(f"serve-a-{i}", "serve-a") for i in range(2)]
    claims = []
    for i, (pod, device) in enumerate(zip(pods, ["gpu-1-mig-3g20gb-9-4", ""], strict=True)):
        pod["status"] = {"resourceClaimStatuses": [{"name": "mig", "resourceClaimName": f"c{i}"}]}
        claim = gpudra.resource_claim(f"c{i}", "mig.nvidia.com")
        if device:
            pod["spec"]["nodeName"] = "a100-dra-0"
            claim["status"] = {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": gpudra.DRIVER, "pool": "a100-dra-0", "device": device}]}}}
        claims.append(claim)
    assert demo.mig_lines(pods, claims, slices) == [
        "serve-a-0 -> a100-dra-0, claim c0: gpu-1-mig-3g20gb-9-4 = 3g.20gb of gpu-1, memory slices 4-7",
        "serve-a-1 -> (not bound), claim c1: not allocated",
    ]
