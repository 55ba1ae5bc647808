"""GPU cards as devices on the real control plane: shares of a card, whole cards, the
assignment written on the pod, and a restarted scheduler that must not hand a card out twice.

Nodes are shaped as the elastic-gpu device plugin and GPU feature discovery publish them:
``elasticgpu.io/gpu-core: 400`` and ``elasticgpu.io/gpu-memory: 65536`` allocatable (four
cards of 16 GiB), or ``nvidia.com/gpu`` with the ``nvidia.com/gpu.memory`` label. Every
check reads what a user (or the node agent) reads: ``spec.nodeName``, the
``elasticgpu.io/container-<name>`` / ``batchsched.io/gpu-cards`` annotations, the
``elasticgpu.io/assumed`` label, FailedScheduling Events and conditions. Card usage is
summed from the annotations alone, so a card given out twice shows as over 100 %.

Each test's nodes are named after its namespace and its pods select them: the sandbox is
shared by the session, and pods an earlier test left pending (its namespace still being
deleted) would otherwise reserve or take this test's cards.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from decimal import Decimal
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.sandbox.nodes import SANDBOX_LABEL
from tests.integration.helpers import (
    XK8S,
    assert_no_overcommit,
    bound,
    condition,
    create_group,
    create_pods,
    events_for,
    get_group,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

CORE = "elasticgpu.io/gpu-core"
MEMORY = "elasticgpu.io/gpu-memory"
CONTAINER = "elasticgpu.io/container-"
ASSUMED = "elasticgpu.io/assumed"
CARDS = "batchsched.io/gpu-cards"
CARD_MIB = 16384
#: four cards of 16 GiB, as the elastic-gpu device plugin publishes them
ELASTIC = {"gpus": 0, "extended": {CORE: "400", MEMORY: str(4 * CARD_MIB)}}
BINPACK = {"gpuSharing": {"policy": "binpack"}}


def pool_pod(pool: str, name: str, **kw: Any) -> dict[str, Any]:
    """:func:`pod_body` held to the nodes of ``pool``: pods left pending by an earlier test
    (their namespace still terminating) can then never reserve or take this test's cards."""
    return pod_body(name, spec={"nodeSelector": {SANDBOX_LABEL: pool}}, **kw)


def share_pod(pool: str, name: str, core: int = 0, memory: int = 0, *, group: str = "",
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod whose one container ``main`` asks elasticgpu.io resources (limits = requests,
    as the apiserver wants for extended resources)."""
    meta: dict[str, Any] = {"annotations": dict(annotations or {})}
    if group:
        meta["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    body = pool_pod(pool, name, metadata=meta)
    res = body["spec"]["containers"][0]["resources"]
    gpu = {k: str(v) for k, v in ((CORE, core), (MEMORY, memory)) if v}
    res["requests"].update(gpu)
    res["limits"] = dict(gpu)
    return body


def _asks(pod: dict[str, Any]) -> list[tuple[str, int, int]]:
    """``(container, core %, memory MiB)`` per container that asks elasticgpu.io resources."""
    out = []
    for c in pod["spec"]["containers"]:
        res = c.get("resources") or {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        core, mem = int(req.get(CORE, 0)), int(req.get(MEMORY, 0))
        if core or mem:
            out.append((c["name"], core, mem))
    return out


Use = dict[tuple[str, int], list[tuple[str, int, int, bool]]]


def card_use(pods: list[dict[str, Any]], card_memory: dict[str, int]) -> Use:
    """Who holds each card, from the annotations of bound, unfinished pods:
    ``(node, card) -> [(pod, core %, memory MiB, whole)]``. A bound pod that asks for cards
    must say which (a missing or malformed annotation fails here)."""
    use: Use = defaultdict(list)
    for p in pods:
        node, name = p["spec"].get("nodeName"), p["metadata"]["name"]
        if not node or p["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        notes = p["metadata"].get("annotations") or {}
        for container, core, mem in _asks(p):
            value = notes.get(CONTAINER + container)
            assert value is not None, f"{name} is bound to {node} without {CONTAINER}{container}"
            cards = [int(i) for i in value.split(",")]
            assert (p["metadata"].get("labels") or {}).get(ASSUMED) == "true", f"{name} lacks {ASSUMED}"
            if core >= 100:
                assert len(cards) == core // 100 == len(set(cards)), f"{name}: {core} core on cards {value!r}"
                for i in cards:
                    use[(node, i)].append((name, 100, card_memory[node], True))
            else:
                assert len(cards) == 1, f"{name}: a share on cards {value!r}"
                use[(node, cards[0])].append((name, core, mem, False))
        if "gpu-fraction" in notes or "gpu-memory" in notes:
            container, _, index = notes[CARDS].partition("=")
            assert container == p["spec"]["containers"][0]["name"], notes[CARDS]
            core = int(Decimal(notes.get("gpu-fraction", "0")) * 100)
            use[(node, int(index))].append((name, core, int(notes.get("gpu-memory", "0")), False))
    return use


def assert_cards_within(use: Use, card_memory: dict[str, int]) -> None:
    """No card over 100 % compute or over its memory; a whole card has one holder only."""
    for (node, card), holders in use.items():
        assert sum(h[1] for h in holders) <= 100, f"card {card} of {node} over 100 %: {holders}"
        assert sum(h[2] for h in holders) <= card_memory[node], f"card {card} of {node} over its memory: {holders}"
        if any(h[3] for h in holders):
            assert len(holders) == 1, f"whole card {card} of {node} shared: {holders}"


async def _pods(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}


async def _all_bound(kube: KubeClient, namespace: str, names: list[str]) -> dict[str, dict[str, Any]] | None:
    pods = await _pods(kube, namespace)
    return pods if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names) else None


def _notes(pod: dict[str, Any]) -> dict[str, str]:
    """The card assignment a pod carries (annotations of ours and the agent's)."""
    return {k: v for k, v in (pod["metadata"].get("annotations") or {}).items()
            if k.startswith(CONTAINER) or k == CARDS}


async def test_binpack_packs_shares_onto_the_fewest_cards_within_compute_and_memory(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    nodes = await make_nodes(count=2, prefix=namespace, **ELASTIC)
    mem = dict.fromkeys(nodes, CARD_MIB)
    async with running_scheduler(sandbox, namespace, **BINPACK):
        halves = [f"half-{i}" for i in range(4)]
        await create_pods(kube, namespace, [share_pod(namespace, n, 50, 2048) for n in halves])
        pods = await wait_for(lambda: _all_bound(kube, namespace, halves), timeout=30)
        # four halves fill exactly two cards of one node: "0", "0", "1", "1"
        [node] = {pods[n]["spec"]["nodeName"] for n in halves}
        assert sorted(_notes(pods[n]).get(CONTAINER + "main") for n in halves) == ["0", "0", "1", "1"]
        for n in halves:
            assert set(_notes(pods[n])) == {CONTAINER + "main"}  # the agent's, not ours
            assert pods[n]["metadata"]["labels"][ASSUMED] == "true"

        # uneven shares, and memory that keeps two small shares off one card
        mixed = {"m30": (30, 4096), "m20": (20, 4096), "m60": (60, 2048), "m40": (40, 2048),
                 "big-mem-a": (10, 10240), "big-mem-b": (10, 10240)}
        await create_pods(kube, namespace, [share_pod(namespace, n, c, m) for n, (c, m) in mixed.items()])
        pods = await wait_for(lambda: _all_bound(kube, namespace, list(mixed)), timeout=30)
        use = card_use(list(pods.values()), mem)
        assert_cards_within(use, mem)
        # the halves' two cards are full: nothing joined them
        for n in halves:
            assert {h[0] for h in use[(node, int(_notes(pods[n])[CONTAINER + "main"]))]} <= set(halves)
        card_of = {h[0]: where for where, holders in use.items() for h in holders}
        assert card_of["big-mem-a"] != card_of["big-mem-b"], dict(use)  # 2 x 10 GiB > one 16 GiB card
        await assert_no_overcommit(kube)


async def test_whole_cards_are_two_distinct_cards_never_shared(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    [node] = await make_nodes(count=1, prefix=namespace, **ELASTIC)
    mem = {node: CARD_MIB}
    async with running_scheduler(sandbox, namespace, **BINPACK):
        shares = ["s50a", "s50b", "s30"]
        await create_pods(kube, namespace, [share_pod(namespace, n, c) for n, c in (("s50a", 50), ("s50b", 50), ("s30", 30))])
        await wait_for(lambda: _all_bound(kube, namespace, shares), timeout=30)
        await create_pods(kube, namespace, [share_pod(namespace, "whole", 200)])
        pods = await wait_for(lambda: _all_bound(kube, namespace, ["whole"]), timeout=30)
        a, b = (int(i) for i in _notes(pods["whole"])[CONTAINER + "main"].split(","))
        assert a != b
        use = card_use(list(pods.values()), mem)
        assert_cards_within(use, mem)
        assert {h[0] for h in use[(node, a)] + use[(node, b)]} == {"whole"}
        assert (a, b) == (2, 3)  # the shares took 0 (full) and 1 (30 %), binpacked

        # another share goes onto the fullest shared card with room, never onto a whole card
        load = {card: sum(h[1] for h in holders) for (_, card), holders in use.items() if card not in (a, b)}
        fullest = max((c for c in sorted(load) if load[c] + 20 <= 100), key=lambda c: load[c])
        await create_pods(kube, namespace, [share_pod(namespace, "s20", 20)])
        pods = await wait_for(lambda: _all_bound(kube, namespace, ["s20"]), timeout=30)
        assert _notes(pods["s20"]) == {CONTAINER + "main": str(fullest)}, (load, _notes(pods["s20"]))
        assert_cards_within(card_use(list(pods.values()), mem), mem)


async def test_shares_spread_by_their_own_annotation_leave_too_few_whole_cards(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    [node] = await make_nodes(count=1, prefix=namespace, **ELASTIC)
    mem = {node: CARD_MIB}
    async with running_scheduler(sandbox, namespace, **BINPACK):
        # configured binpack; these ask for spread: one card each, three cards in use
        spread = {"batchsched.io/gpu-placement": "spread"}
        names = [f"spread-{i}" for i in range(3)]
        await create_pods(kube, namespace, [share_pod(namespace, n, 10, annotations=spread) for n in names])
        pods = await wait_for(lambda: _all_bound(kube, namespace, names), timeout=30)
        assert sorted(_notes(pods[n])[CONTAINER + "main"] for n in names) == ["0", "1", "2"]
        # two whole cards: the node's gpu-core total has room (230/400), its cards do not
        await create_pods(kube, namespace, [share_pod(namespace, "pair", 200)])
        [ev] = await wait_for(lambda: events_for(kube, namespace, "pair", "FailedScheduling"), timeout=30)
        assert "too few whole cards free" in ev["message"], ev["message"]
        # one whole card still fits: the one no share touched
        await create_pods(kube, namespace, [share_pod(namespace, "single", 100)])
        pods = await wait_for(lambda: _all_bound(kube, namespace, ["single"]), timeout=30)
        assert _notes(pods["single"]) == {CONTAINER + "main": "3"}
        assert not pods["pair"]["spec"].get("nodeName")
        assert_cards_within(card_use(list(pods.values()), mem), mem)


async def test_a_restarted_scheduler_rebuilds_card_usage_from_the_pods(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    [node] = await make_nodes(count=1, prefix=namespace, **ELASTIC)
    mem = {node: CARD_MIB}
    first = [f"first-{i}" for i in range(4)]
    async with running_scheduler(sandbox, namespace, **BINPACK):
        await create_pods(kube, namespace, [share_pod(namespace, n, 60) for n in first])
        pods = await wait_for(lambda: _all_bound(kube, namespace, first), timeout=30)
    # one 60 % share per card
    before = {n: _notes(pods[n]) for n in first}
    assert sorted(v[CONTAINER + "main"] for v in before.values()) == ["0", "1", "2", "3"]

    async def checked(names: list[str]) -> dict[str, dict[str, Any]] | None:
        pods = await _pods(kube, namespace)
        assert_cards_within(card_use(list(pods.values()), mem), mem)  # on every poll, not only at the end
        return pods if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names) else None

    # the second scheduler knows the cards only from the annotations of the bound pods: four
    # 30 % shares fill each card to 90 %; 10 % more fits, on any card; then another 30 %
    # fits the node's gpu-core total (400/400) but no card
    second = [f"second-{i}" for i in range(4)]
    async with running_scheduler(sandbox, namespace, **BINPACK):
        await create_pods(kube, namespace, [share_pod(namespace, n, 30) for n in second])
        await wait_for(lambda: checked(second), timeout=30)
        await create_pods(kube, namespace, [share_pod(namespace, "tail", 10)])
        await wait_for(lambda: checked(["tail"]), timeout=30)
        await create_pods(kube, namespace, [share_pod(namespace, "too-much", 30)])
        [ev] = await wait_for(lambda: events_for(kube, namespace, "too-much", "FailedScheduling"), timeout=30)
        assert "no card with 30% free" in ev["message"], ev["message"]
        cond = next(c for c in (await kube.get(f"/api/v1/namespaces/{namespace}/pods/too-much"))["status"]["conditions"]
                    if c["type"] == "PodScheduled")
        assert (cond["status"], cond["message"]) == ("False", ev["message"])
        for _ in range(10):  # it stays pending while the scheduler keeps cycling
            pods = await checked([]) or {}
            assert not pods["too-much"]["spec"].get("nodeName")
            await asyncio.sleep(0.3)
    use = card_use(list(pods.values()), mem)
    assert sorted(sum(h[1] for h in holders) for holders in use.values()) == [90, 90, 90, 100]
    assert {n: _notes(pods[n]) for n in first} == before  # the bound pods' records untouched


async def test_an_invalid_gpu_request_is_refused_visibly_and_scheduling_goes_on(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    await make_nodes(count=1, prefix=namespace, **ELASTIC)
    async with running_scheduler(sandbox, namespace, **BINPACK) as sched:
        await create_pods(kube, namespace, [
            share_pod(namespace, "odd-cores", 150),
            share_pod(namespace, "bad-policy", 50, annotations={"batchsched.io/gpu-placement": "tightest"}),
            share_pod(namespace, "ok", 50),
        ])
        await wait_for(lambda: _all_bound(kube, namespace, ["ok"]), timeout=30)
        [ev] = await wait_for(lambda: events_for(kube, namespace, "odd-cores", "FailedScheduling"), timeout=20)
        assert ev["type"] == "Warning"
        assert ev["message"].startswith(
            f"pod {namespace}/odd-cores cannot be scheduled: GPU request refused: "
            "container main asks for elasticgpu.io/gpu-core 150"), ev["message"]
        assert "multiple of 100" in ev["message"]
        [pev] = await wait_for(lambda: events_for(kube, namespace, "bad-policy", "FailedScheduling"), timeout=20)
        assert "GPU request refused" in pev["message"] and "'tightest'" in pev["message"], pev["message"]
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/odd-cores")
        [cond] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", ev["message"])
        # the scheduler keeps scheduling, and never binds the refused pods
        await create_pods(kube, namespace, [share_pod(namespace, "after", 100)])
        pods = await wait_for(lambda: _all_bound(kube, namespace, ["after"]), timeout=20)
        assert sched.ready
        for name in ("odd-cores", "bad-policy"):
            assert not pods[name]["spec"].get("nodeName")
            assert not _notes(pods[name])


async def test_a_gang_of_shares_binds_whole_or_not_at_all(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    [node] = await make_nodes(count=1, prefix=namespace, **ELASTIC)
    mem = {node: CARD_MIB}
    async with running_scheduler(sandbox, namespace, **BINPACK):
        # one whole card taken, then a gang of 3 x 30 % that fits on one card binds whole
        await create_pods(kube, namespace, [share_pod(namespace, "holder", 100)])
        pods = await wait_for(lambda: _all_bound(kube, namespace, ["holder"]), timeout=30)
        assert _notes(pods["holder"]) == {CONTAINER + "main": "0"}
        for name in ("narrow", "wide"):
            await create_group(kube, XK8S, namespace, name, {"minMember": 3})
        narrow = [f"narrow-{i}" for i in range(3)]
        await create_pods(kube, namespace, [share_pod(namespace, n, 30, group="narrow") for n in narrow])
        pods = await wait_for(lambda: _all_bound(kube, namespace, narrow), timeout=30)
        use = card_use(list(pods.values()), mem)
        assert_cards_within(use, mem)
        assert {_notes(pods[n])[CONTAINER + "main"] for n in narrow} == {"1"}, dict(use)  # binpack: one card
        # "wide": 3 x 60 % fits the node's gpu-core total (370/400), not its cards (two free)
        await create_pods(kube, namespace, [share_pod(namespace, f"wide-{i}", 60, group="wide") for i in range(3)])

        async def explained() -> dict[str, Any] | None:
            assert bound(await list_pods(kube, namespace), "wide") == []  # never a part of it
            g = await get_group(kube, XK8S, namespace, "wide")
            return g if "no card with 60% free" in condition(g).get("message", "") else None

        group = await wait_for(explained, timeout=30)
        cond = condition(group)
        assert cond["status"] == "False" and cond["message"].startswith("gang needs 3 pods"), cond
        [ev] = await wait_for(lambda: events_for(kube, namespace, "wide-0", "FailedScheduling"), timeout=10)
        assert "no card with 60% free" in ev["message"], ev["message"]
        await asyncio.sleep(1)
        pods = await _pods(kube, namespace)
        assert bound(list(pods.values()), "wide") == []
        assert_cards_within(card_use(list(pods.values()), mem), mem)


async def test_kai_fractions_on_nvidia_nodes_are_recorded_and_counted_against_whole_cards(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    [node] = await make_nodes(count=1, prefix=namespace, gpus=4, labels={"nvidia.com/gpu.memory": "81920"})
    mem = {node: 81920}
    # configured spread; the two halves ask for binpack themselves and share a card
    async with running_scheduler(sandbox, namespace, gpuSharing={"policy": "spread"}):
        pack = {"gpu-fraction": "0.5", "batchsched.io/gpu-placement": "binpack"}
        await create_pods(kube, namespace, [pool_pod(namespace, n, metadata={"annotations": pack}) for n in ("kai-a", "kai-b")])
        pods = await wait_for(lambda: _all_bound(kube, namespace, ["kai-a", "kai-b"]), timeout=30)
        assert _notes(pods["kai-a"]) == _notes(pods["kai-b"]) == {CARDS: "main=0"}
        for n in ("kai-a", "kai-b"):
            assert ASSUMED not in (pods[n]["metadata"].get("labels") or {})
        # memory only: it takes a card of its own (card 0 has no compute left)
        await create_pods(kube, namespace, [pool_pod(namespace, "kai-mem", metadata={"annotations": {"gpu-memory": "50000"}})])
        pods = await wait_for(lambda: _all_bound(kube, namespace, ["kai-mem"]), timeout=30)
        [(container, index)] = [_notes(pods["kai-mem"])[CARDS].split("=")]
        assert container == "main" and index != "0"
        # whole nvidia.com/gpu cards: no annotation, the device plugin picks; only two are
        # free, so a third whole card waits though nvidia.com/gpu allocatable has room (3/4)
        await create_pods(kube, namespace, [pool_pod(namespace, "whole-2", gpu=2)])
        pods = await wait_for(lambda: _all_bound(kube, namespace, ["whole-2"]), timeout=30)
        assert not _notes(pods["whole-2"]) and ASSUMED not in (pods["whole-2"]["metadata"].get("labels") or {})
        await create_pods(kube, namespace, [pool_pod(namespace, "whole-1", gpu=1)])
        [ev] = await wait_for(lambda: events_for(kube, namespace, "whole-1", "FailedScheduling"), timeout=30)
        assert "too few whole cards free" in ev["message"], ev["message"]
        pods = await _pods(kube, namespace)
        assert not pods["whole-1"]["spec"].get("nodeName")
        assert_cards_within(card_use(list(pods.values()), mem), mem)
