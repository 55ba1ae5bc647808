"""The chaos run: a workload, faults on a schedule, recovery timed, checks all along.

``python -m perf chaos [--nodes N] [--faults a,b] [--out DIR]``, in order:

1. a fresh sandbox (the pod watch cache off, so a watch resumed after a compaction gets its
   410 from etcd) and a world of ``N`` 8-GPU nodes (:func:`perf.chaos.world.open_world`);
2. two batchsched replicas behind the fault proxy (one leads, one stands by), and the
   harness's job controller (a member pod that is gone is created again);
3. the workload: gangs of 8 to 64 single-GPU pods, gangs of card shares, whole-GPU pods and
   shares, in two teams' queues with borrowing, three priorities; about 60% of the pool
   asked for, so faults have room and preemption has work; every second gang (of the
   workload and of the faults) is a Kubernetes ``scheduling.k8s.io/v1beta1`` PodGroup when
   the cluster serves that API, the others scheduler-plugins' PodGroups;
4. for each fault, in turn: inject it (:mod:`perf.chaos.faults_cluster`, and the faults of
   :mod:`perf.chaos.faults_scheduler` when that module is present); wait until the cluster
   has recovered (:meth:`World.recovered`), timed from when the fault was undone (or
   injected, for faults that are not undone); take the checks' findings since the
   injection; undo what the fault left (nodes, objects) and settle again;
5. the table, JSON and markdown under ``--out`` (default ``perf/results/chaos/``).

The checks are sampled by the recorder every second and on each change during the whole
run, not only at the end; a final sample closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf.chaos.checks import KINDS, Verdict
from perf.chaos.faults_cluster import FAULTS as CLUSTER_FAULTS
from perf.chaos.faults_cluster import WATCH_CACHE_OFF
from perf.chaos.world import Fault, World, WorldError, open_world

RESULTS = Path(__file__).resolve().parent.parent / "results" / "chaos"
COLUMNS = ("partial gangs", "bound twice", "bound to deleted node", "lost", "quota exceeded", "over-committed")


def all_faults() -> dict[str, Fault]:
    """Every fault by its short name: ours, then the scheduler-process faults if present."""
    faults = dict(CLUSTER_FAULTS)
    try:
        from perf.chaos import faults_scheduler  # optional: the scheduler-process faults
    except ImportError:
        return faults
    theirs = getattr(faults_scheduler, "FAULTS", {})
    items = theirs.items() if isinstance(theirs, dict) else ((slug(f.name), f) for f in theirs)
    faults.update(items)
    return faults


def slug(name: str) -> str:
    """A fault's short name from its table name: "leader paused past its lease" -> "leader-paused-past-its-lease"."""
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


@dataclass(slots=True)
class Row:
    key: str
    fault: str
    injected: str
    detail: str
    recovered_s: float | None
    counts: dict[str, int]
    examples: dict[str, list[str]] = field(default_factory=dict)
    error: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "fault": self.fault, "injected": self.injected, "detail": self.detail,
                "recovered_s": None if self.recovered_s is None else round(self.recovered_s, 1),
                "counts": self.counts, "examples": self.examples, "error": self.error,
                "facts": {k: v for k, v in self.facts.items() if isinstance(v, int | float | str | bool | list)}}


async def workload(world: World, *, fraction: float = 0.6) -> int:
    """Gangs, single pods and shares asking about ``fraction`` of the pool's cards."""
    total = len(world.nodes) * world.gpus_per_node
    budget = int(total * fraction)
    queues = world.team_queues
    priorities = [None, "low-priority", "high-priority"]
    sizes = [s for s in (8, 16, 32, 64) if s <= max(8, total // 4)]
    i = asked = 0
    while asked < budget:
        q = queues[i % 2]
        prio = priorities[i % 3] if i % 5 else None
        kind = i % 5
        if kind in (0, 1):
            size = sizes[(i // 5) % len(sizes)]
            await world.submit(members=size, gpu=1, queue=q, priority=prio)
            asked += size
        elif kind == 2:
            await world.submit(members=4, share=0.5, queue=q, priority=prio)
            asked += 2
        elif kind == 3:
            await world.submit(members=1, gpu=2, queue=q, priority=prio)
            asked += 2
        else:
            await world.submit(members=1, share=0.25, queue=q, priority=prio)
            asked += 1
        i += 1
    return i


async def inject(world: World, key: str, fault: Fault, *, recover_timeout: float) -> Row:
    """One fault: inject, wait for recovery, judge, undo what it left."""
    started = time.time()
    try:
        injected = await fault.run(world)
    except Exception as exc:  # a fault that could not be injected is a row that says so
        return Row(key=key, fault=fault.name, injected=time.strftime("%H:%M:%S", time.localtime(started)),
                   detail="", recovered_s=None, counts=dict.fromkeys(KINDS, 0), error=f"{type(exc).__name__}: {exc}")
    error = ""
    recovered: float | None = None
    try:
        await world.recovered(recover_timeout)
        recovered = time.time() - (injected.healed_at or injected.at)
    except WorldError as exc:
        error = str(exc)
    verdict: Verdict = (await world.verdict()).since(injected.at)
    row = Row(key=key, fault=fault.name, injected=time.strftime("%H:%M:%S", time.localtime(injected.at)),
              detail=injected.detail, recovered_s=recovered, counts=verdict.counts,
              examples={k: verdict.examples(k, 3) for k in KINDS if verdict.count(k)}, error=error,
              facts=dict(injected.facts))
    while world.after_recovery:
        undo = world.after_recovery.pop()
        with contextlib.suppress(Exception):
            await undo()
    with contextlib.suppress(WorldError):
        await world.recovered(recover_timeout)
    return row


def table(rows: list[Row]) -> str:
    head = ["fault", "injected", "detail", "recovered in (s)", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        rec = f"{r.recovered_s:.1f}" if r.recovered_s is not None else f"not recovered ({r.error[:80]})"
        detail = r.detail.replace("|", "/") or r.error
        lines.append("| " + " | ".join([r.fault, r.injected, detail, rec, *(str(r.counts[k]) for k in KINDS)]) + " |")
    return "\n".join(lines)


@dataclass(slots=True)
class ChaosConfig:
    nodes: int = 200
    faults: list[str] | None = None
    out: Path = RESULTS
    recover_timeout: float = 180.0
    gang_timeout: float = 20.0


async def run_world(world: World, cfg: ChaosConfig) -> dict[str, Any]:
    faults = all_faults()
    chosen = cfg.faults or list(faults)
    unknown = [k for k in chosen if k not in faults]
    if unknown:
        raise SystemExit(f"unknown faults: {', '.join(unknown)} (known: {', '.join(faults)})")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: world.schedulers.start("a", via_proxy=True))
    await loop.run_in_executor(None, lambda: world.schedulers.start("b", via_proxy=True))
    world.start_job_controller()
    t0 = time.time()
    jobs = await workload(world)
    await world.recovered(cfg.recover_timeout)
    baseline = time.time() - t0
    rows = []
    for key in chosen:
        print(f"[chaos] {key}: {faults[key].name}", file=sys.stderr, flush=True)
        row = await inject(world, key, faults[key], recover_timeout=cfg.recover_timeout)
        print(f"[chaos]   {row.detail or row.error}; recovered in {row.recovered_s}; {row.counts}", file=sys.stderr, flush=True)
        rows.append(row)
    final = await world.verdict()
    return {
        "nodes": len(world.nodes), "gpus_per_node": world.gpus_per_node, "jobs_at_start": jobs,
        "workload_settled_s": round(baseline, 1), "rows": [r.to_json() for r in rows],
        "gangs_by_api": dict(world.gangs_by_api),
        "whole_run": final.to_json(), "pods_recreated_by_job_controller": world.replaced,
        "replica_restarts": {n: r.restarts for n, r in world.schedulers.replicas.items()},
        "faults_scheduler_present": any(k not in CLUSTER_FAULTS for k in faults),
        "table": table(rows),
    }


def run(cfg: ChaosConfig) -> dict[str, Any]:
    """The whole run on a fresh sandbox; writes ``chaos.json`` and ``chaos.md`` under ``cfg.out``."""
    from batchsched.sandbox.cluster import Sandbox

    cfg.out.mkdir(parents=True, exist_ok=True)
    box = Sandbox("perf-chaos")
    state = box.up([], apiserver_args=[WATCH_CACHE_OFF], ready_timeout=max(120.0, cfg.nodes * 0.1))
    try:
        async def main() -> dict[str, Any]:
            async with open_world(state, workdir=cfg.out / "work", nodes=cfg.nodes,
                                  gang_timeout=cfg.gang_timeout) as world:
                return await run_world(world, cfg)

        result = asyncio.run(main())
    finally:
        box.down()
    result["command"] = "python -m perf " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    (cfg.out / "chaos.json").write_text(json.dumps(result, indent=2))
    (cfg.out / "chaos.md").write_text(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    return "\n".join([
        "# Chaos run",
        "",
        f"{result['date']}: {result['nodes']} nodes x {result['gpus_per_node']} GPUs, "
        f"{result['jobs_at_start']} jobs at the start (settled in {result['workload_settled_s']} s).",
        "",
        f"Command: `{result.get('command') or 'python -m perf chaos'}`",
        "",
        result["table"],
        "",
        f"Whole run: {result['whole_run']['counts']} over {result['whole_run']['samples']} samples; "
        f"longest partial gang {result['whole_run']['longest_partial_s']} s (binding included); "
        f"{result['pods_recreated_by_job_controller']} member pods created again by the harness's job controller; "
        f"replicas started again after exiting: {result['replica_restarts']}.",
        "",
        "Gangs submitted per PodGroup API: " + ", ".join(f"{api} {n}" for api, n in sorted(result["gangs_by_api"].items())) + ".",
        "",
    ])
