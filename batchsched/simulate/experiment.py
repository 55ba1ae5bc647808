"""Configurations side by side on a trace: runs (in parallel processes), the table, the reference.

A run is a name and the session's settings: the default configuration with a card policy
and scope (``fragmentation/sharing``), or a configuration file read as the scheduler reads
it (``config:batchsched.yaml (fragmentation/sharing)``), its policy and scope replaced if asked.

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

from batchsched.config import load_config
from batchsched.core.settings import SessionSettings
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
class Run:
    """One configuration under test: its name in the tables, and the settings the
    session gets (as the scheduler would apply them: the method's changes come on top,
    see :func:`fragmentation.method_settings`)."""

    name: str
    settings: SessionSettings


def policy_run(policy: str, scope: str, base: SessionSettings | None = None, source: str = "") -> Run:
    """``base`` (default: the default configuration) with this card policy and scope,
    named ``policy/scope`` (after ``source``, the file ``base`` came from, if any)."""
    settings = fragmentation.with_policy(base or SessionSettings(), policy, scope)
    return Run(f"{source} ({policy}/{scope})" if source else f"{policy}/{scope}", settings)


def config_runs(path: str, policies: Sequence[str] = (), scopes: Sequence[str] = ()) -> list[Run]:
    """The configuration file ``path`` read as ``batchsched run --config`` reads it (a bad
    file raises its :class:`ConfigError`): alone, or once per policy and scope given (each
    replacing the file's gpuSharing policy or scope, every other setting kept)."""
    settings = load_config(path).session_settings()
    source = f"config:{Path(path).name}"
    cards = settings.cards
    return [policy_run(p, s, settings, source)
            for p in (policies or [cards.policy]) for s in (scopes or [cards.scope])]


@dataclass(slots=True, frozen=True)
class Job:
    """One seed of one run, as a worker process gets it (pickled)."""

    trace_dir: str
    trace: str
    run: Run
    seed: int
    load: float


def _one(job: Job) -> dict[str, Any]:
    d = Path(job.trace_dir)
    nodes = openb.read_nodes(d / "openb_node_list_gpu_node.csv")
    tasks = openb.read_tasks(d / f"openb_pod_list_{job.trace}.csv")
    curve = fragmentation.run(nodes, tasks, settings=job.run.settings, seed=job.seed, load=job.load)
    cards = job.run.settings.cards
    return {"run": job.run.name, "policy": cards.policy, "scope": cards.scope, "seed": job.seed,
            "failed": curve.failed, "tasks": len(curve.arrived),
            "points": {p: curve.at(p) for p in POINTS if p <= round(100 * job.load)}}


def run_fragmentation(trace_dir_: Path, trace: str, runs: Sequence[Run], seeds: Sequence[int],
                      load: float, workers: int | None = None,
                      progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Every run x seed; results in that order."""
    jobs = [Job(str(trace_dir_), trace, r, seed, load) for r in runs for seed in seeds]
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
    """Per run, per arrived %: (mean, min, max) over seeds."""
    by: dict[str, dict[int, list[float]]] = {}
    for r in results:
        key = r["run"]
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
    width = max([28, *(len("batchsched " + n) + 2 for n in ours), *(len(n) + 2 for n in ref)])
    head = f"{'run':<{width}}" + "".join(f"{p:>16}" for p in points)
    lines = ["GPU allocation % of cluster cards (mean, min-max over seeds) at arrived % of cards", head]

    def row(name: str, pts: dict[int, tuple[float, float, float]]) -> str:
        cells = []
        for p in points:
            v = pts.get(p)
            cells.append(f"{v[0]:6.2f} ({v[1]:.1f}-{v[2]:.1f})" if v else f"{'-':>16}")
        return f"{name:<{width}}" + "".join(f"{c:>16}" for c in cells)

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
