"""batchsched's DRA allocation against the real kube-scheduler, on many small random worlds.

Each world (:mod:`tests.dra_worlds`) is one or two GPU nodes published as NVIDIA's driver
publishes them and ONE pod with one or two claims of random shape. It is built twice in
the sandbox, as two copies that differ only in names: copy ``k`` for the sandbox's
kube-scheduler (v1.37.2), copy ``b`` for batchsched. Copies instead of deleting and
recreating one world: nothing has to wait for claims to be deallocated, and the slices
each scheduler reads are the same bodies under another node name. The pod is kept to its
copy's nodes by a nodeSelector, so worlds never meet.

Both schedulers see their pods only once every claim exists (kube-controller-manager made
the template ones), each in a phase of its own: the scheduler started, then waited for
until each of its pods is bound or told why not.

What is compared is order-free: with one pod per world, whether the pod was bound (its
claims can be allocated together on one node of the world) must be the same for both.
Every allocation, kube-scheduler's too (which validates the checker), is then judged by
:mod:`tests.dra_check`, which does not use batchsched's allocator.

``DRA_WORLDS`` (default 200) and ``DRA_SEED`` (default: drawn, printed) repeat a run; the
worlds of :data:`KNOWN` are added to every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, NotFoundError
from batchsched.sandbox import gpudra
from batchsched.sandbox.nodes import (
    SANDBOX_LABEL,
    NodeShape,
    create_nodes,
    delete_nodes,
    wait_nodes_ready,
)
from tests.dra_check import problems
from tests.dra_worlds import World, draw
from tests.integration.helpers import running_kube_scheduler, running_scheduler, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

RESOURCE = "/apis/resource.k8s.io/v1"
WORLDS = int(os.environ.get("DRA_WORLDS", "200"))
KUBE, OURS = "k", "b"
KUBE_SCHEDULER = "dra-differential"


#: worlds a drawn run found the schedulers disagreeing on, (seed, world), added to every
#: run: seed 300602's world 65 is a pod asking seven partitions of one A100 (three, then
#: two and two), which batchsched's device search gave up on while kube-scheduler bound
#: it; seed 301's world 13 is another of that shape, the longest search of 6,000 drawn
KNOWN = ((300602, 65), (301, 13))

#: the DeviceClasses this test made (and deletes when it ends)
MADE_CLASSES: list[str] = []


async def _gather(calls: list[Any], limit: int = 24) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(call: Any) -> Any:
        async with sem:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def _build(kube: KubeClient, namespace: str, worlds: list[World]) -> dict[str, list[dict[str, Any]]]:
    """Both copies of every world in the sandbox; returns each copy's slices by world prefix."""
    for c in gpudra.device_classes(extended_resource=False):
        with contextlib.suppress(ConflictError):
            await kube.create(f"{RESOURCE}/deviceclasses", c)
            MADE_CLASSES.append(c["metadata"]["name"])
    shapes = [NodeShape(count=len(w.nodes), prefix=w.prefix(copy), gpus=0) for w in worlds for copy in (KUBE, OURS)]
    names = await create_nodes(kube, shapes)
    await wait_nodes_ready(kube, names, timeout=120)
    nodes, _ = await kube.list("/api/v1/nodes", labelSelector=SANDBOX_LABEL)
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in nodes}
    slices: dict[str, list[dict[str, Any]]] = {}
    calls = []
    for w in worlds:
        for copy in (KUBE, OURS):
            made = w.slices(copy)
            for s in made:  # owned by the node: the garbage collector deletes them with it
                node = s["spec"]["nodeName"]
                s["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node,
                                                     "uid": uids[node], "controller": True}]
                calls.append(kube.create(f"{RESOURCE}/resourceslices", s))
            slices[w.prefix(copy)] = made
            for collection, body in w.claim_objects(copy):
                calls.append(kube.create(f"{RESOURCE}/namespaces/{namespace}/{collection}", body))
    await _gather(calls)
    return slices


def _known(first: int) -> list[World]:
    """The :data:`KNOWN` worlds, numbered from ``first`` on."""
    out = []
    for n, (seed, index) in enumerate(KNOWN):
        rng = random.Random(seed)
        world = [draw(rng, i) for i in range(index + 1)][index]
        out.append(dataclasses.replace(world, index=first + n))
    return out


def _world_of(worlds: list[World], pod: dict[str, Any]) -> World:
    return worlds[int(pod["metadata"]["name"][1:4])]


def _decision(pod: dict[str, Any]) -> str | None:
    """``bound``, the reason and message it was told, or None while undecided."""
    if pod["spec"].get("nodeName"):
        return "bound"
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('reason')}: {c.get('message')}"
    return None


async def _decided(kube: KubeClient, namespace: str, copy: str) -> dict[str, dict[str, Any]]:
    """The copy's pods, once each is bound or told why not, and 2 s later (a pod told
    something first and bound after shows in the later read)."""

    async def all_decided() -> bool:
        pods, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
        return all(_decision(p) for p in pods if p["metadata"]["name"][4] == copy)

    await wait_for(all_decided, timeout=180, interval=0.5)
    await asyncio.sleep(2)
    pods, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
    return {p["metadata"]["name"][:4]: p for p in pods if p["metadata"]["name"][4] == copy}


async def _claims(kube: KubeClient, namespace: str, world: World, copy: str,
                  pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    made = {s["name"]: s["resourceClaimName"] for s in pod["status"].get("resourceClaimStatuses") or []}
    out = {}
    for c in world.claims:
        name = world.claim_name(copy, c) if c.named else made[c.key]
        out[c.key] = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
    return out


async def test_batchsched_and_kube_scheduler_agree_on_random_dra_worlds(
        sandbox: Any, kube: KubeClient, namespace: str, tmp_path: Path) -> None:
    """On every world, batchsched binds the pod exactly when kube-scheduler does, and every
    allocation of either keeps the rules of ``resource.k8s.io/v1``."""
    seed = int(os.environ.get("DRA_SEED") or random.SystemRandom().randrange(10**6))
    print(f"\nseed {seed} (DRA_SEED={seed} DRA_WORLDS={WORLDS} repeats this run)")
    rng = random.Random(seed)
    worlds = [draw(rng, i) for i in range(WORLDS)] + _known(WORLDS)
    node_names = [n for w in worlds for copy in (KUBE, OURS) for n in w.node_names(copy)]
    try:
        started = time.monotonic()
        slices = await _build(kube, namespace, worlds)
        await _create_pods_by_copy(kube, namespace, worlds)
        built = time.monotonic() - started

        started = time.monotonic()
        with running_kube_scheduler(sandbox, tmp_path, name="kube-scheduler-differential",
                                    scheduler_name=KUBE_SCHEDULER):
            theirs = await _decided(kube, namespace, KUBE)
        kube_time = time.monotonic() - started
        started = time.monotonic()
        async with running_scheduler(sandbox, namespace):
            ours = await _decided(kube, namespace, OURS)
        our_time = time.monotonic() - started

        disagree, broken = [], []
        for w in worlds:
            pk, pb = theirs[w.prefix("")[:4]], ours[w.prefix("")[:4]]
            if (_decision(pk) == "bound") != (_decision(pb) == "bound"):
                disagree.append(f"{w.describe()}\n  kube-scheduler: {_decision(pk)}\n  batchsched: {_decision(pb)}")
            for copy, pod in ((KUBE, pk), (OURS, pb)):
                found = problems(w, copy, slices[w.prefix(copy)], pod, await _claims(kube, namespace, w, copy, pod))
                broken += [f"world {w.index} copy {copy}: {p}" for p in found]
        bound = sum(_decision(p) == "bound" for p in theirs.values())
        print(f"{len(worlds)} worlds ({len(node_names)} nodes, {2 * len(worlds)} pods) built in {built:.1f} s; "
              f"kube-scheduler decided in {kube_time:.1f} s, batchsched in {our_time:.1f} s; "
              f"kube-scheduler bound {bound}/{len(worlds)}; agreed on {len(worlds) - len(disagree)}/{len(worlds)}; "
              f"checker findings: {len(broken)}")
        for line in disagree[:10] + broken[:20]:
            print(line)
        assert not disagree and not broken
    finally:
        await delete_nodes(kube, node_names)
        while MADE_CLASSES:  # other tests make the classes as they need them
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"{RESOURCE}/deviceclasses/{MADE_CLASSES.pop()}")


async def _create_pods_by_copy(kube: KubeClient, namespace: str, worlds: list[World]) -> None:
    """Every world's two pods (``k`` for kube-scheduler, ``b`` for batchsched), their claims made."""
    await _gather([kube.create(f"/api/v1/namespaces/{namespace}/pods",
                               w.pod(copy, KUBE_SCHEDULER if copy == KUBE else "batchsched", SANDBOX_LABEL))
                   for w in worlds for copy in (KUBE, OURS)])

    async def claims_made() -> bool:
        pods, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
        return len(pods) == 2 * len(worlds) and all(
            len([s for s in (p.get("status") or {}).get("resourceClaimStatuses") or [] if s.get("resourceClaimName")])
            == sum(1 for c in _world_of(worlds, p).claims if not c.named) for p in pods)

    await wait_for(claims_made, timeout=120, interval=0.5)

