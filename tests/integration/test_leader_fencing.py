"""Fencing by the lease's renew deadline, on the real control plane with replicas run as
processes: a leader that is paused, or cut off from the apiserver, while it binds a burst
sends nothing after its renew deadline, and another replica binds the rest.

Who bound a pod is read from the pod (each Binding carries ``batchsched.io/bound-by``,
which the apiserver copies onto the pod) and when from its ``PodScheduled=True``
condition, which the apiserver writes at the Binding; the deadline is the leader's last
``renewTime`` on the Lease plus its ``renewDeadlineSeconds`` (3 s; the lease lasts 4 s).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from batchsched.kube.leader import parse_time
from perf.chaos.checks import Verdict
from perf.chaos.faults_scheduler import (
    _records,
    bound_by,
    lease,
    partition_leader,
    pause_leader,
    scheduled_at,
)
from perf.chaos.world import Job, World, open_world
from tests.integration.helpers import scheduler_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

#: a burst the leader is caught in the middle of: single pods and two gangs
SINGLES = 300
GANGS = 2
GANG_MEMBERS = 8
#: a small Binding budget, so the burst lasts longer than the harness takes to see its first bind
BINDER = {"binder": {"concurrency": 8}}
#: how long after a write passes the fence the proxy may record it (loopback)
RECORD_SLACK = 0.25


async def burst(world: World) -> list[Job]:
    singles = await asyncio.gather(*(world.submit(members=1, gpu=0) for _ in range(SINGLES)))
    gangs = [await world.submit(members=GANG_MEMBERS, gpu=1) for _ in range(GANGS)]
    return [*singles, *gangs]


async def all_bound(world: World, pods: list[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        missing = [p for p in pods if p not in world.recorder.bound_now()]
        if not missing:
            return
        assert time.monotonic() < deadline, f"{len(missing)} pods not bound, e.g. {missing[:3]}"
        await asyncio.sleep(0.2)


def who_bound(world: World, pods: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, rec in _records(world, pods).items():
        out.setdefault(bound_by(rec), []).append(name)
    return {k: sorted(v) for k, v in out.items()}


def bound_late(world: World, pods: list[str], identity: str, deadline: float) -> list[tuple[str, Any]]:
    """Pods bound by ``identity`` whose Binding the apiserver stored after ``deadline``."""
    late = []
    for name, rec in _records(world, pods).items():
        at = scheduled_at(rec)
        if bound_by(rec) == identity and (at is None or at > deadline):
            late.append((name, at))
    return late


def clean(v: Verdict) -> None:
    for kind in ("partial_gangs", "bound_twice", "bound_to_deleted_node", "overcommitted", "quota_exceeded"):
        assert v.count(kind) == 0, f"{kind}: {v.examples(kind)}"


async def test_a_leader_paused_past_its_lease_binds_nothing_after_its_renew_deadline(
    sandbox: Any, tmp_path: Path,
) -> None:
    async with open_world(sandbox, workdir=tmp_path, nodes=4, kubeconfig=scheduler_kubeconfig(sandbox),
                          scheduler_config=BINDER) as world:
        jobs = await burst(world)  # waiting for a scheduler
        pods = [p for job in jobs for p in job.pods]
        paused = await pause_leader(world, name="a", jobs=jobs, start=lambda: world.schedulers.start("a"))
        print(f"\n{paused.injected.detail}; deadline {paused.deadline - paused.injected.at:+.2f} s from the stop")
        assert 0 < len(paused.bound_at_cut) < len(pods), "the stop did not land in the middle of the burst"

        # on waking it sees its deadline passed: it sends nothing and exits
        proc = world.schedulers.replicas["a"].proc
        assert proc is not None
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 60)
        print(f"a exited with code {code} {time.time() - paused.resumed_at:.2f} s after SIGCONT")
        await asyncio.sleep(1.0)  # anything it sent has landed and been seen
        assert who_bound(world, pods).get(paused.identity) == paused.bound_before_return
        assert bound_late(world, pods, paused.identity, paused.deadline) == []
        spec = await lease(world)  # nor did it write the Lease again (renewed, or gave it up)
        assert spec["holderIdentity"] == paused.identity
        assert parse_time(spec["renewTime"]) == paused.renewed

        world.schedulers.start("b")
        await all_bound(world, pods)
        by = who_bound(world, pods)
        mine, theirs = by.get(paused.identity, []), by.get(world.schedulers.identity("b"), [])
        print(f"bound by a: {len(mine)}, by b: {len(theirs)}")
        assert bound_late(world, pods, paused.identity, paused.deadline) == []
        assert mine == paused.bound_before_return  # nothing it had queued landed after it woke
        assert len(mine) + len(theirs) == len(pods)
        clean(await world.verdict())


async def test_a_partitioned_leader_stops_writing_at_its_renew_deadline_before_the_standby_leads(
    sandbox: Any, tmp_path: Path,
) -> None:
    async with open_world(sandbox, workdir=tmp_path, nodes=4, kubeconfig=scheduler_kubeconfig(sandbox),
                          scheduler_config=BINDER) as world:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: world.schedulers.start("a", via_proxy=True))
        while await loop.run_in_executor(None, world.schedulers.leader) != "a":
            await asyncio.sleep(0.1)
        await loop.run_in_executor(None, world.schedulers.start, "b")
        jobs = await burst(world)
        pods = [p for job in jobs for p in job.pods]
        cut = await partition_leader(world, jobs=jobs, heal_after=10.0)
        last_write = max((t for t, _, _ in cut.writes_after_cut), default=cut.injected.at)
        print(f"\n{cut.injected.detail}; exited {cut.exit_code} at "
              f"{(cut.exited_at or 0) - cut.deadline:+.2f} s from its deadline")
        assert 0 < len(cut.bound_at_cut) < len(pods), "the cut did not land in the middle of the burst"
        # it stopped writing at its deadline, and stopped altogether before the heal
        assert last_write <= cut.deadline + RECORD_SLACK, [w for w in cut.writes_after_cut if w[0] > cut.deadline]
        assert cut.exit_code is not None and cut.exited_at is not None
        assert cut.exited_at < cut.injected.healed_at  # type: ignore[operator]

        await all_bound(world, pods)
        spec = await lease(world)
        standby = world.schedulers.identity("b")
        assert spec["holderIdentity"] == standby
        took_over = parse_time(spec["acquireTime"])
        assert took_over is not None and took_over > cut.deadline and took_over > last_write
        by = who_bound(world, pods)
        mine = by.get(cut.identity, [])
        print(f"bound by a: {len(mine)}, by b: {len(by.get(standby, []))}; b took over "
              f"{took_over - cut.deadline:+.2f} s from a's deadline")
        # nothing it sent landed after the cut, the heal included
        assert mine == cut.bound_at_cut == cut.bound_before_return
        assert bound_late(world, pods, cut.identity, cut.deadline) == []
        assert sorted(mine + by.get(standby, [])) == sorted(pods)
        clean(await world.verdict())
