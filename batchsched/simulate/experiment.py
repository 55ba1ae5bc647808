"""Policies side by side on a trace: runs (in parallel processes), the table, the reference.

The FGD reference (``fgd_reference.csv``) is the published expected results of the FGD
paper's simulator on openb (github.com/hkust-adsl/kubernetes-scheduler-simulator,
``experiments/analysis/expected_results/analysis_allo_discrete.csv``): GPU allocation %
by arrived %, mean and range over seeds 42-51, per policy, for the traces default,
gpushare100, multigpu50 and gpuspec33.
"""

from __future__ import annotations

import csv
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchsched.simulate import fragmentation, openb

REFERENCE = Path(__file__).with_name("fgd_reference.csv")
POINTS = tuple(range(10, 131, 10))
#: where the openb trace is looked for when no directory is given
TRACE_DIRS = (Path("traces/openb"), Path("../shared/traces/openb"), Path("../../shared/traces/openb"))


def trace_dir(given: str | None) -> Path:
    for d in ([Path(given)] if given else []) + [Path(os.environ.get("BATCHSCHED_OPENB", "")), *TRACE_DIRS]:
        if str(d) and (d / "openb_node_list_gpu_node.csv").exists():
            return d
    raise FileNotFoundError(
        "the openb trace was not found: pass --trace-dir (the folder of openb_node_list_gpu_node.csv)"
    )


@dataclass(slots=True, frozen=True)
class Job:
    trace_dir: str
    trace: str
    policy: str
    scope: str
    seed: int
    load: float


def _one(job: Job) -> dict[str, Any]:
    d = Path(job.trace_dir)
    nodes = openb.read_nodes(d / "openb_node_list_gpu_node.csv")
    tasks = openb.read_tasks(d / f"openb_pod_list_{job.trace}.csv")
    curve = fragmentation.run(nodes, tasks, policy=job.policy, scope=job.scope, seed=job.seed, load=job.load)
    return {"policy": job.policy, "scope": job.scope, "seed": job.seed, "failed": curve.failed,
            "tasks": len(curve.arrived),
            "points": {p: curve.at(p) for p in POINTS if p <= round(100 * job.load)}}


def run_fragmentation(trace_dir_: Path, trace: str, policies: Sequence[tuple[str, str]], seeds: Sequence[int],
                      load: float, workers: int | None = None,
                      progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Every (policy, scope) x seed; results in that order."""
    jobs = [Job(str(trace_dir_), trace, p, s, seed, load) for p, s in policies for seed in seeds]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    done = 0
    out: list[dict[str, Any]] = []
    if workers <= 1:
        for job in jobs:
            out.append(_one(job))
            done += 1
            if progress:
                progress(done, len(jobs))
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for result in pool.map(_one, jobs):
            out.append(result)
            done += 1
            if progress:
                progress(done, len(jobs))
    return out


def summarise(results: Sequence[dict[str, Any]]) -> dict[str, dict[int, tuple[float, float, float]]]:
    """Per ``policy/scope``, per arrived %: (mean, min, max) over seeds."""
    by: dict[str, dict[int, list[float]]] = {}
    for r in results:
        key = f"{r['policy']}/{r['scope']}"
        for p, v in r["points"].items():
            if v is not None:
                by.setdefault(key, {}).setdefault(int(p), []).append(float(v))
    return {k: {p: (statistics.fmean(v), min(v), max(v)) for p, v in pts.items()} for k, pts in by.items()}


def reference(trace: str) -> dict[str, dict[int, tuple[float, float, float]]]:
    out: dict[str, dict[int, tuple[float, float, float]]] = {}
    with REFERENCE.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["trace"] == trace:
                out.setdefault(f"FGD paper: {row['policy']}", {})[int(row["arrived_pct"])] = (
                    float(row["mean"]), float(row["min"]), float(row["max"]))
    return out


def table(ours: dict[str, dict[int, tuple[float, float, float]]],
          ref: dict[str, dict[int, tuple[float, float, float]]], points: Sequence[int] = (90, 100, 110, 120, 130)) -> str:
    """GPU allocation % at each arrived %: batchsched's policies, then the reference."""
    head = f"{'policy':<28}" + "".join(f"{p:>16}" for p in points)
    lines = ["GPU allocation % of cluster cards (mean, min-max over seeds) at arrived % of cards", head]

    def row(name: str, pts: dict[int, tuple[float, float, float]]) -> str:
        cells = []
        for p in points:
            v = pts.get(p)
            cells.append(f"{v[0]:6.2f} ({v[1]:.1f}-{v[2]:.1f})" if v else f"{'-':>16}")
        return f"{name:<28}" + "".join(f"{c:>16}" for c in cells)

    for name in sorted(ours, key=lambda k: -(ours[k].get(130, ours[k].get(100, (0, 0, 0)))[0])):
        lines.append(row("batchsched " + name, ours[name]))
    for name in sorted(ref, key=lambda k: -(ref[k].get(130, (0, 0, 0))[0])):
        lines.append(row(name, ref[name]))
    return "\n".join(lines)


def progress_bar(done: int, total: int) -> None:
    width = 30
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()
