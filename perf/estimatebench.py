"""What ``batchsched explain`` costs: the views and a start-estimate run on a large backlog.

Run::

    python -m perf.estimatebench [--nodes 1000] [--pods 10000] [--budget 10] [--exact] [--max-steps 400]
    python -m perf.estimatebench --nodes 200 --pods 2000 --compare [--exact-budget 1800]

The cluster and backlog of :mod:`perf.backlog` (queues in cohorts, 85% of the GPUs busy, a
third of the running pods declaring a runtime, far more waiting than fits), after its first
step; by default every pod declares a runtime (running ones 3-8 h from their start, waiting
ones 10 min-2 h), so estimates reach far. Measured: the job view over every unit (what ``/debug/jobs`` builds, in the event
loop), making the session's copy (in the event loop), and running the copy forward (in a
worker thread), with the estimates it found; plus the process's RSS before and after. The
model over classes of work by default; ``--exact`` steps the copy of the session instead.

``--compare`` runs both on the same backlog, the exact one with ``--exact-budget`` seconds
and no step limit, and reports the error of the model over classes against it, over the
jobs both estimated: the median and 90th percentile of the difference in minutes, the share
of jobs within 10% of their horizon (the exact estimate's distance from now, at least a
minute), the share whose order against the job estimated next is kept, and the jobs only
one of them estimated. Both run on the same backlog in one process: the victim search of
its first steps is bounded by time, so two processes may build different backlogs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
from dataclasses import replace
from typing import Any

from batchsched.core.model import Pod
from batchsched.core.reservation import RUNTIME_ANNOTATION
from batchsched.core.session import Session
from batchsched.insight.estimate import Estimate, Forward, estimate_starts
from batchsched.insight.views import Job, jobs
from perf import procstat
from perf.backlog import Backlog


def _declare(pods: list[Pod], rng: random.Random, low: int, high: int) -> list[Pod]:
    return [replace(p, annotations={**p.annotations, RUNTIME_ANNOTATION: f"{rng.randint(low, high)}m"}) for p in pods]


def _world(nodes: int, pods: int, declared: bool) -> Backlog:
    world = Backlog(nodes, pods)
    if declared:
        # every pod says how long it runs: the running ones end over the next hours
        rng = random.Random(5)
        world.running = _declare(world.running, rng, 180, 480)
        world.pending = _declare(world.pending, rng, 10, 120)
    world.list_all()
    world.step()
    world.step(dt=2.0)
    return world


def _run(session: Session, view: list[Job], now: float, *, budget: float | None, max_steps: int,
         exact: bool) -> tuple[dict[str, Estimate], float]:
    deadline = time.monotonic() + budget if budget else None
    t = time.perf_counter()
    est = estimate_starts(session, view, now, max_steps=max_steps, exact=exact,
                          keep_going=(lambda: time.monotonic() < deadline) if deadline else None)
    return est, time.perf_counter() - t


def compare(nodes: int, pods: int, *, declared: bool, budget: float | None, exact_budget: float) -> dict[str, Any]:
    """The model over classes against the exact one (see the module docstring)."""
    world = _world(nodes, pods, declared)
    session, now = world.session, world.now
    view = jobs(session, now)
    fast, t_fast = _run(session, view, now, budget=budget, max_steps=400, exact=False)
    exact, t_exact = _run(session, view, now, budget=exact_budget, max_steps=10**9, exact=True)
    both = sorted((k for k in exact if exact[k]["start"] is not None and fast.get(k, {}).get("start") is not None),
                  key=lambda k: (exact[k]["start"], k))
    diff = [abs(fast[k]["start"] - exact[k]["start"]) / 60 for k in both]
    within = [abs(fast[k]["start"] - exact[k]["start"]) <= 0.1 * max(60.0, exact[k]["inSeconds"]) for k in both]
    kept = [fast[a]["start"] <= fast[b]["start"] for a, b in itertools.pairwise(both)
            if exact[a]["start"] < exact[b]["start"]]
    signed = [(fast[k]["start"] - exact[k]["start"]) / 60 for k in both]

    def known(est: dict[str, Estimate]) -> set[str]:
        return {k for k, e in est.items() if e["start"] is not None}

    return {
        "nodes": nodes, "pending pods": len(session.state.pending), "waiting jobs": sum(1 for j in view if j.waiting),
        "classes: s, jobs estimated, latest h": (round(t_fast, 2), len(known(fast)), _latest(fast)),
        "exact: s, jobs estimated, latest h": (round(t_exact, 1), len(known(exact)), _latest(exact)),
        "jobs both estimated": len(both),
        "|difference| min: median, p90, max": (_pct(diff, 50), _pct(diff, 90), round(max(diff, default=0), 1)),
        "difference min (classes - exact): median": _pct(signed, 50),
        "share within 10% of horizon": round(sum(within) / max(1, len(within)), 3),
        "share of successive pairs in the same order": round(sum(kept) / max(1, len(kept)), 3),
        "estimated by classes only": len(known(fast) - known(exact)),
        "estimated by exact only": len(known(exact) - known(fast)),
    }


def _pct(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 1)


def _latest(est: dict[str, Estimate]) -> float:
    return round(max((e["inSeconds"] for e in est.values() if e["start"] is not None), default=0) / 3600, 2)


def measure(nodes: int, pods: int, *, max_steps: int, declared: bool, budget: float | None,
            exact: bool = False) -> dict[str, Any]:
    world = _world(nodes, pods, declared)
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
    est = estimate_starts(session, view, now, max_steps=max_steps, prepared=fwd, exact=exact,
                          keep_going=(lambda: time.monotonic() < deadline) if deadline else None)
    t_run = time.perf_counter() - t
    known = [e for e in est.values() if e["start"] is not None]
    return {
        "nodes": nodes, "pending pods": len(session.state.pending), "jobs": len(view),
        "waiting jobs": sum(1 for j in view if j.waiting),
        "job view s": round(t_view, 3), "copy s": round(t_copy, 3), "forward run s": round(t_run, 3),
        "model": "exact" if exact else "classes", "max steps": max_steps, "budget s": budget,
        "jobs estimated": len(known),
        "latest estimate in h": _latest(est),
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
    ap.add_argument("--exact", action="store_true", help="step the copy of the session (the exact model)")
    ap.add_argument("--compare", action="store_true", help="the model over classes against the exact one")
    ap.add_argument("--exact-budget", type=float, default=1800.0,
                    help="seconds the exact model may take with --compare")
    args = ap.parse_args(argv)
    if args.compare:
        out = compare(args.nodes, args.pods, declared=not args.as_generated, budget=args.budget,
                      exact_budget=args.exact_budget)
    else:
        out = measure(args.nodes, args.pods, max_steps=args.max_steps, declared=not args.as_generated,
                      budget=args.budget, exact=args.exact)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
