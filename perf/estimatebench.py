"""What ``batchsched explain`` costs: the views and a start-estimate run on a large backlog.

Run::

    python -m perf.estimatebench [--nodes 1000] [--pods 10000] [--max-steps 400]

The cluster and backlog of :mod:`perf.backlog` (queues in cohorts, 85% of the GPUs busy, a
third of the running pods declaring a runtime, far more waiting than fits), after its first
step; by default every pod declares a runtime (running ones 3-8 h from their start, waiting
ones 10 min-2 h), so estimates reach far. Measured: the job view over every unit (what ``/debug/jobs`` builds, in the event
loop), making the session's copy (in the event loop), and running the copy forward (in a
worker thread), with the estimates it found; plus the process's RSS before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import replace
from typing import Any

from batchsched.core.model import Pod
from batchsched.core.reservation import RUNTIME_ANNOTATION
from batchsched.insight.estimate import Forward, estimate_starts
from batchsched.insight.views import jobs
from perf import procstat
from perf.backlog import Backlog


def _declare(pods: list[Pod], rng: random.Random, low: int, high: int) -> list[Pod]:
    return [replace(p, annotations={**p.annotations, RUNTIME_ANNOTATION: f"{rng.randint(low, high)}m"}) for p in pods]


def measure(nodes: int, pods: int, *, max_steps: int, declared: bool, budget: float | None) -> dict[str, Any]:
    world = Backlog(nodes, pods)
    if declared:
        # every pod says how long it runs: the running ones end over the next hours
        rng = random.Random(5)
        world.running = _declare(world.running, rng, 180, 480)
        world.pending = _declare(world.pending, rng, 10, 120)
    world.list_all()
    world.step()
    world.step(dt=2.0)
    session, now = world.session, world.now
    rss0 = procstat.rss(os.getpid()) or 0
    t = time.perf_counter()
    view = jobs(session, now)
    t_view = time.perf_counter() - t
    t = time.perf_counter()
    fwd = Forward(session, now, True)
    t_copy = time.perf_counter() - t
    t = time.perf_counter()
    deadline = time.monotonic() + budget if budget else None
    est = estimate_starts(session, view, now, max_steps=max_steps, prepared=fwd,
                          keep_going=(lambda: time.monotonic() < deadline) if deadline else None)
    t_run = time.perf_counter() - t
    known = [e for e in est.values() if e["start"] is not None]
    return {
        "nodes": nodes, "pending pods": len(session.state.pending), "jobs": len(view),
        "waiting jobs": sum(1 for j in view if j.waiting),
        "job view s": round(t_view, 3), "copy s": round(t_copy, 3), "forward run s": round(t_run, 3),
        "max steps": max_steps, "budget s": budget, "jobs estimated": len(known),
        "latest estimate in h": round(max((e["inSeconds"] for e in known), default=0) / 3600, 2),
        "rss MiB before/after": (round(rss0 / 2**20), round((procstat.rss(os.getpid()) or 0) / 2**20)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.estimatebench", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--max-steps", type=int, default=400)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds the forward run may take (the scheduler's explain.estimateBudgetSeconds)")
    ap.add_argument("--as-generated", action="store_true",
                    help="keep perf.backlog's runtimes (a third of the running pods declare one); "
                         "by default every pod declares one")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.nodes, args.pods, max_steps=args.max_steps, declared=not args.as_generated,
                             budget=args.budget),
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
