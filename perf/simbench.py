"""``python -m perf sim``: the card policies (and any configuration files given) on the openb
trace by the FGD method, with the published FGD results drawn in. Writes
``sim/<variant>.json``, ``.md`` and ``.png`` per variant, and ``sim/summary.md`` and
``.json``: every run at 130% arrived (or the highest point the load reaches) on every
variant, beside the paper's policies."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchsched.simulate import experiment

VARIANTS = ("default", "gpushare100", "multigpu50", "gpuspec33")
#: every card policy in both scopes: the default is chosen from this table
POLICIES = tuple((p, s) for p in ("fragmentation", "binpack", "bestfit", "dotproduct", "spread", "random")
                 for s in ("all", "sharing"))
REF_COLORS = {"FGD": "tab:red", "BestFit": "tab:brown", "GpuPacking": "tab:olive",
              "GpuClustering": "tab:pink", "DotProd": "tab:cyan", "Random": "tab:gray"}
Summary = dict[str, dict[int, tuple[float, float, float]]]


def runs(configs: Sequence[str] = ()) -> list[experiment.Run]:
    """The policy rows (the default configuration per policy and scope), then each
    configuration file as it is; a bad file raises its ConfigError before anything runs."""
    out = [experiment.policy_run(p, s) for p, s in POLICIES]
    for path in configs:
        out += experiment.config_runs(path)
    return out


def run(out: Path, variants: list[str], seeds: int, load: float, trace_dir: str | None = None,
        log: Any = print, configs: Sequence[str] = ()) -> list[Path]:
    d = experiment.trace_dir(trace_dir)
    todo = runs(configs)
    written: list[Path] = []
    (out / "sim").mkdir(parents=True, exist_ok=True)
    per_variant: dict[str, tuple[Summary, Summary]] = {}
    for variant in variants:
        log(f"sim: openb {variant}, {len(todo)} runs x {seeds} seeds, load {load:.0%} ...")
        t = time.monotonic()
        results = experiment.run_fragmentation(d, variant, todo, list(range(42, 42 + seeds)), load,
                                               progress=experiment.progress_bar)
        seconds = time.monotonic() - t
        ours = experiment.summarise(results)
        ref = experiment.reference(variant)
        per_variant[variant] = (ours, ref)
        data = {"variant": variant, "seeds": seeds, "load": load, "seconds": round(seconds, 1),
                "configs": list(configs), "runs": results,
                "summary": {k: {str(p): v for p, v in pts.items()} for k, pts in ours.items()},
                "reference": {k: {str(p): v for p, v in pts.items()} for k, pts in ref.items()}}
        path = out / "sim" / f"{variant}.json"
        path.write_text(json.dumps(data, indent=1))
        md = out / "sim" / f"{variant}.md"
        md.write_text(f"# openb {variant}: GPU allocation by the FGD method ({seeds} seeds, {seconds:.0f} s)\n\n"
                      f"```\n{experiment.table(ours, ref)}\n```\n\n![allocation]({variant}.png)\n")
        png = out / "sim" / f"{variant}.png"
        plot(ours, ref, variant, png)
        written += [path, md, png]
        log(experiment.table(ours, ref))
    written += write_summary(out / "sim", per_variant, [r.name for r in todo], seeds, load)
    log((out / "sim" / "summary.md").read_text())
    return written


def summary_point(load: float) -> int:
    """The arrived % the summary reads: 130, or the highest point a lighter load reaches."""
    reached = [p for p in experiment.POINTS if p <= round(100 * load)]
    return 130 if 130 in reached else max(reached, default=experiment.POINTS[0])


def summary_rows(per_variant: dict[str, tuple[Summary, Summary]], names: Sequence[str],
                 point: int) -> list[tuple[str, dict[str, tuple[float, float, float] | None]]]:
    """One row per run (in ``names`` order, as ``batchsched <name>``), then one per policy of
    the paper's reference (FGD first); per variant the (mean, min, max) at ``point``, or
    None where that run or reference has no value there."""
    rows: list[tuple[str, dict[str, tuple[float, float, float] | None]]] = []
    for name in names:
        rows.append((f"batchsched {name}", {v: ours.get(name, {}).get(point) for v, (ours, _) in per_variant.items()}))
    refs = sorted({k for _, ref in per_variant.values() for k in ref},
                  key=lambda k: (not k.endswith(": FGD"), k))
    for name in refs:
        rows.append((name, {v: ref.get(name, {}).get(point) for v, (_, ref) in per_variant.items()}))
    return rows


def summary_table(rows: list[tuple[str, dict[str, tuple[float, float, float] | None]]],
                  variants: Sequence[str]) -> str:
    width = max([24, *(len(name) + 2 for name, _ in rows)])
    lines = [f"{'run':<{width}}" + "".join(f"{v:>20}" for v in variants)]
    for name, cells in rows:
        text = [f"{c[0]:6.2f} ({c[1]:.2f}-{c[2]:.2f})" if c else "-" for c in (cells.get(v) for v in variants)]
        lines.append(f"{name:<{width}}" + "".join(f"{t:>20}" for t in text))
    return "\n".join(lines)


def write_summary(folder: Path, per_variant: dict[str, tuple[Summary, Summary]], names: Sequence[str],
                  seeds: int, load: float) -> list[Path]:
    """``summary.md`` and ``summary.json``: every run on every variant at one arrived %."""
    point = summary_point(load)
    variants = list(per_variant)
    rows = summary_rows(per_variant, names, point)
    md = folder / "summary.md"
    md.write_text(f"# openb: GPU allocation % at {point}% arrived, every variant ({seeds} seeds, load {load:.0%})\n\n"
                  "Mean (min-max) over seeds; the rows after batchsched's are the FGD paper's published figures.\n\n"
                  f"```\n{summary_table(rows, variants)}\n```\n")
    js = folder / "summary.json"
    js.write_text(json.dumps({"arrived_pct": point, "seeds": seeds, "load": load, "variants": variants,
                              "rows": [{"run": name, "cells": cells} for name, cells in rows]}, indent=1))
    return [md, js]


def run_waits(out: Path, trace_dir: str | None, speedup: float, limit: int | None, log: Any = print) -> list[Path]:
    """The trace at its own times, arrivals ``speedup`` times sooner: wait-time CDF per policy."""
    from batchsched.simulate import openb, replay

    d = experiment.trace_dir(trace_dir)
    nodes = openb.read_nodes(d / "openb_node_list_gpu_node.csv")
    tasks = openb.read_tasks(d / "openb_pod_list_default.csv")
    waits: dict[str, list[float]] = {}
    summary: dict[str, Any] = {}
    for policy, scope in (("fragmentation", "sharing"), ("binpack", "sharing"), ("spread", "sharing")):
        log(f"sim: replay of openb default, arrivals x{speedup:g}, {policy}/{scope} ...")
        r = replay.run(nodes, tasks, policy=policy, scope=scope, arrival_speedup=speedup, limit=limit)
        name = f"{policy}/{scope}"
        waits[name] = sorted(w for ws in r.waits.values() for w in ws)
        summary[name] = {"peak_allocation": r.peak_allocation(), "mean_allocation": r.mean_allocation(),
                         "never_placed": r.never_placed, "wait_s": r.percentiles("waits")}
        log(f"  {name}: mean allocation {r.mean_allocation():.1f}%, never placed {r.never_placed}")
    (out / "sim").mkdir(parents=True, exist_ok=True)
    path = out / "sim" / "replay-waits.json"
    path.write_text(json.dumps({"speedup": speedup, "limit": limit, "summary": summary}, indent=1))
    png = out / "sim" / "replay-waits.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for name, ws in waits.items():
        if ws:
            ax.step([max(w, 1.0) for w in ws], [(i + 1) / len(ws) for i in range(len(ws))], where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("wait from arrival to binding, seconds (1 s and less at the left edge)")
    ax.set_ylabel("fraction of tasks")
    ax.set_title(f"openb default at its own times, arrivals x{speedup:g}: wait-time CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return [path, png]


def plot(ours: dict[str, dict[int, tuple[float, float, float]]], ref: dict[str, dict[int, tuple[float, float, float]]],
         variant: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for name, pts in sorted(ours.items()):
        xs = sorted(pts)
        ax.plot(xs, [pts[x][0] for x in xs], marker="o", linewidth=1.6, label=f"batchsched {name}")
        ax.fill_between(xs, [pts[x][1] for x in xs], [pts[x][2] for x in xs], alpha=0.15)
    for name, pts in sorted(ref.items()):
        short = name.split(": ", 1)[-1]
        xs = sorted(pts)
        ax.plot(xs, [pts[x][0] for x in xs], linestyle="--", linewidth=1.2, color=REF_COLORS.get(short, "black"),
                label=name)
    ax.plot([0, 130], [0, 130], color="black", linewidth=0.5, alpha=0.4)
    ax.set_xlim(50, 131)
    ax.set_ylim(50, 100)
    ax.set_xlabel("GPU arrived, % of cluster cards")
    ax.set_ylabel("GPU allocated, % of cluster cards")
    ax.set_title(f"openb {variant}: allocation vs arrival (dashed: FGD paper's simulator)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
