"""The scheduler process killed (SIGKILL) in the middle of its own writes, at CI size, on
the real control plane: mid-gang, mid-preemption, mid-status-write (perf/chaos/faults_scheduler.py).
Judged from the apiserver's state as the harness's recorder watched it.

One world (4 nodes of 8 GPUs, one replica) runs the three in turn, to keep the suite
fast. The replica binds one pod at a time and writes one status at a time, so that the
harness, which strikes when its watch sees the first bind or the first condition, lands
in the middle of the burst. The leader paused or partitioned is tested in
test_leader_fencing.py; the nominated node held across a restart in
test_preemption_restart.py.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest

from perf.chaos.checks import Verdict
from perf.chaos.faults_scheduler import (
    _records,
    kill_mid_gang,
    kill_mid_preemption,
    kill_mid_status_write,
)
from perf.chaos.world import World, open_world
from tests.integration.helpers import scheduler_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SLOW_WRITES = {"binder": {"concurrency": 1}, "status": {"concurrency": 1}}


def clean(v: Verdict) -> None:
    for kind in ("partial_gangs", "bound_twice", "bound_to_deleted_node", "overcommitted", "quota_exceeded", "lost"):
        assert v.count(kind) == 0, f"{kind}: {v.examples(kind)}"


async def mid_gang(world: World) -> None:
    hit = await kill_mid_gang(world, members=16, gpu=1)
    print(f"\nmid-gang: {hit.injected.detail}")
    assert 0 < hit.bound_at_kill < hit.job.members, "the kill did not land in the middle of the gang"
    await world.wait_bound(hit.job, 60)
    v = await world.verdict()
    partial = v.partial_seconds.get(hit.job.name, 0.0)
    print(f"mid-gang: partial for {partial:.1f} s, whole {hit.job.members} members")
    clean(v)
    await world.retire(hit.job)


async def mid_preemption(world: World) -> None:
    hit = await kill_mid_preemption(world, gangs=2, members=2, gpu=8)
    print(f"mid-preemption: {hit.injected.detail}")
    assert hit.evicted_at_kill, "the kill did not land after the first eviction"
    recs = _records(world, [p for job in hit.low for p in job.pods])
    victims = {job.name for job in hit.low if any(p in hit.evicted for p in job.pods)}
    # one gang's room was enough: its two pods and nothing else, evicted whole
    assert len(victims) == 1 and len(hit.evicted) == 2, hit.evicted
    assert hit.evicted_before_release == hit.evicted  # nothing more once it was restarted
    [spared] = [job for job in hit.low if job.name not in victims]
    assert all(recs[p].live and recs[p].binds for p in spared.pods)
    v = await world.verdict()
    [victim] = victims
    print(f"mid-preemption: victims' gang partial for {v.partial_seconds.get(victim, 0.0):.1f} s; "
          f"preemptor {hit.preemptor.name} bound whole")
    clean(v)
    for job in (*hit.low, hit.preemptor):
        await world.retire(job)


async def mid_status_write(world: World) -> None:
    hit = await kill_mid_status_write(world, singles=120, gangs=6, members=3)
    print(f"mid-status-write: {hit.injected.detail}")
    assert 0 < hit.told_at_kill < len(hit.pods), "the kill did not land in the middle of the status writes"
    assert hit.untold == []
    repeated = {p: [m for m, n in collections.Counter(msgs).items() if n > 1] for p, msgs in hit.events.items()}
    repeated = {p: m for p, m in repeated.items() if m}
    written = sum(len(m) for m in hit.events.values())
    print(f"mid-status-write: {written} FailedScheduling Events for {len(hit.pods)} pods, "
          f"{len(repeated)} pods told the same twice, {len(hit.rewritten)} conditions rewritten unchanged")
    assert hit.rewritten == [], f"{len(hit.rewritten)} conditions written again unchanged after the restart"
    assert hit.groups_rewritten == [], f"PodGroup statuses written again unchanged: {hit.groups_rewritten}"
    assert repeated == {}, f"{len(repeated)} pods got the same FailedScheduling Event twice"
    clean(await world.verdict())


async def test_the_scheduler_killed_mid_gang_mid_preemption_and_mid_status_write(
    sandbox: Any, tmp_path: Path,
) -> None:
    async with open_world(sandbox, workdir=tmp_path, nodes=4, kubeconfig=scheduler_kubeconfig(sandbox),
                          scheduler_config=SLOW_WRITES) as world:
        await asyncio.get_running_loop().run_in_executor(None, world.schedulers.start, "a")
        await mid_gang(world)
        await mid_preemption(world)
        await mid_status_write(world)
