"""Faults from outside the scheduler, at CI size, on the real control plane.

Each test opens a chaos world (:mod:`perf.chaos.world`: 4 nodes of 8 GPUs named after its
namespace, two teams' queues with borrowing, pods naming a scheduler of their own) in the
session's sandbox, runs one batchsched replica as a process behind the fault proxy, under
its own ServiceAccount, and injects faults with the same code as ``python -m perf chaos``
(:func:`perf.chaos.run.inject`). What is asserted comes from the harness's own watch of the
apiserver, never from batchsched: no gang partly bound beyond its grace, nothing bound twice
or to a node that is gone or closed, no pod left waiting untold, no queue above its quota,
no node over-committed, and the cluster settled again within a generous bound. Faults that
are honest to run together (the control plane killed twice; the network slowed, then cut)
share a world.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from perf.chaos import faults_cluster
from perf.chaos.checks import K8S_API, KINDS, XK8S_API
from perf.chaos.run import Row, inject
from perf.chaos.world import World, open_world
from tests.integration.helpers import scheduler_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

RECOVER = 120.0


@contextlib.asynccontextmanager
async def chaos_world(sandbox: Any, tmp_path: Path) -> AsyncIterator[World]:
    async with open_world(sandbox, workdir=tmp_path, nodes=4, kubeconfig=scheduler_kubeconfig(sandbox),
                          gang_timeout=10.0) as world:
        await asyncio.get_running_loop().run_in_executor(None, lambda: world.schedulers.start("a", via_proxy=True))
        world.start_job_controller()
        # a little work already running, in both queues
        await world.submit(members=4, gpu=1, queue=world.team_queues[0])
        await world.submit(members=2, share=0.5, queue=world.team_queues[1])
        # the 1.37 sandbox serves Kubernetes' own PodGroups: every second gang is one
        assert world.gangs_by_api == {XK8S_API: 1, K8S_API: 1}, world.gangs_by_api
        await world.recovered(RECOVER)
        yield world


def assert_clean(row: Row) -> None:
    """Every figure that must be 0 is 0, and the cluster recovered."""
    assert row.error == "", f"{row.fault}: {row.error} ({row.detail})"
    assert row.recovered_s is not None and row.recovered_s < RECOVER, row
    bad = {k: row.examples.get(k) for k in KINDS if row.counts[k]}
    assert not bad, f"{row.fault}: {bad} ({row.detail})"


async def test_control_plane_killed_mid_gang(sandbox: Any, tmp_path: Path) -> None:
    async with chaos_world(sandbox, tmp_path) as world:
        for key in ("apiserver-killed", "etcd-killed"):
            row = await inject(world, key, faults_cluster.FAULTS[key], recover_timeout=RECOVER)
            assert_clean(row)
            # the gang was being bound when the component died, and ends whole
            assert row.facts["sent_at_kill"] >= 1, row.detail
            gang = world.jobs[row.facts["gang"]]
            await world.wait_bound(gang, RECOVER)
        assert (await world.verdict()).clean


async def test_slow_apiserver_then_expired_watch(sandbox: Any, tmp_path: Path) -> None:
    box = None
    async with chaos_world(sandbox, tmp_path) as world:
        box = world.control_plane()
        row = await inject(world, "apiserver-slow", faults_cluster.FAULTS["apiserver-slow"], recover_timeout=RECOVER)
        assert_clean(row)
        assert world.schedulers.proxy.cut > 0, "the slow proxy cut no connection"
        try:
            row = await inject(world, "watch-expired", faults_cluster.FAULTS["watch-expired"], recover_timeout=RECOVER)
            assert_clean(row)
            # the 410 came from etcd's compaction, and the replica relisted (without restarting)
            assert row.facts["relisted"], row.detail
            assert row.facts["restarted"] == 0, row.detail
        finally:
            await _restore_watch_cache(box)
        assert (await world.verdict()).clean


async def _restore_watch_cache(box: Any) -> None:
    """Give the session's other tests their apiserver back as it was."""
    state = box.state()
    api = next(p for p in state.processes if p.name == "kube-apiserver")
    if faults_cluster.WATCH_CACHE_OFF in api.args:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, box.stop_component, "kube-apiserver")
        await loop.run_in_executor(None, lambda: box.start_component(
            "kube-apiserver", without=[faults_cluster.WATCH_CACHE_OFF]))


async def test_another_scheduler_binds_our_pods(sandbox: Any, tmp_path: Path) -> None:
    async with chaos_world(sandbox, tmp_path) as world:
        row = await inject(world, "rogue-binder", faults_cluster.FAULTS["rogue-binder"], recover_timeout=RECOVER)
        assert_clean(row)
        # both really raced: the harness won some, and batchsched was refused on them
        assert row.facts["won"] >= 1, row.detail
        assert row.facts["refused"] >= 1, row.detail


async def test_nodes_deleted_cordoned_tainted_under_gangs(sandbox: Any, tmp_path: Path) -> None:
    async with chaos_world(sandbox, tmp_path) as world:
        row = await inject(world, "nodes-changed", faults_cluster.FAULTS["nodes-changed"], recover_timeout=RECOVER)
        assert_clean(row)
        # the members lost with the deleted node and to the NoExecute taint were created
        # again (by the harness, as the job controller) and placed or told why; nothing
        # landed on the four nodes after the change (bound_to_deleted_node covers closed nodes)
        assert world.replaced >= 1, row.detail


async def test_podgroup_and_queue_recreated_while_pods_wait(sandbox: Any, tmp_path: Path) -> None:
    async with chaos_world(sandbox, tmp_path) as world:
        fault = faults_cluster.FAULTS["objects-recreated"]
        injected = await fault.run(world)
        await world.recovered(RECOVER)
        placed = await faults_cluster.placed(world, injected.facts)
        # batchsched followed the new PodGroup (its smaller minMember) and the new Queue
        assert placed["gang"] >= injected.facts["min_member"], (placed, injected.detail)
        assert placed["queue"] == 2, (placed, injected.detail)
        verdict = (await world.verdict()).since(injected.at)
        assert verdict.clean, verdict.summary()
