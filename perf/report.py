"""The report: every result under ``<out>`` summarised as Markdown, JSON and PNG plots.

Reads ``<out>/sched/*.json`` (live runs, one file per workload and size),
``<out>/restart/*.json`` and ``<out>/idle/*.json`` (the restart and idle benchmarks),
``<out>/ceiling/*.json`` (stand-alone ceiling sweeps) and ``<out>/cycle.json`` (cycle and
kernel benchmarks); writes ``<out>/report.md``, ``<out>/summary.json``,
``<out>/bound-<workload>@<size>.png`` (pods bound over time, one line per run, one colour
per scheduler) and ``<out>/cycle-time.png`` (cycle time against cluster size).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import orjson

from perf.suite import write_json

COLORS = {
    "batchsched": "#1f77b4",
    "kube-scheduler": "#d62728",
    "kube-scheduler-gang": "#ff7f0e",
    "coscheduling": "#2ca02c",
}


def _load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "\u2013"
    return f"{v:,.{digits}f}"


def _spread(values: list[float], digits: int = 0) -> str:
    if not values:
        return "\u2013"
    if len(values) == 1:
        return _fmt(values[0], digits)
    return f"{_fmt(_med(values), digits)} ({_fmt(min(values), digits)}\u2013{_fmt(max(values), digits)})"


def _stats(values: list[float]) -> dict[str, float | None]:
    """Median, min and max (the JSON form of "median (min-max)")."""
    return {"median": _med(values), "min": min(values) if values else None, "max": max(values) if values else None}


def _pct(values: list[float]) -> str:
    """Fractions as "77% (70\u201385%)"."""
    if not values:
        return "\u2013"
    if len(values) == 1:
        return f"{100 * values[0]:.0f}%"
    return f"{100 * _med(values):.0f}% ({100 * min(values):.0f}\u2013{100 * max(values):.0f}%)"  # type: ignore[operator]


def _mib(v: float | None) -> float | None:
    return None if v is None else v / 2**20


def summarize_suite(data: dict[str, Any]) -> dict[str, Any]:
    """Per scheduler: medians and ranges over its successful runs; ratios to batchsched."""
    ceiling = (data.get("ceiling") or {}).get("best")
    per: dict[str, dict[str, Any]] = {}
    order = list(data.get("peers") or {})
    for r in data.get("runs", []):
        if r["scheduler"] not in order:
            order.append(r["scheduler"])
    for name in order:
        runs = [r for r in data.get("runs", []) if r["scheduler"] == name]
        good = [r for r in runs if r.get("ok")]

        def vals(key: str, rs: list[dict[str, Any]] = good) -> list[float]:
            return [r[key] for r in rs if r.get(key) is not None]

        def usage(proc: str, key: str, rs: list[dict[str, Any]] = good) -> list[float]:
            return [r["usage"][proc][key] for r in rs if (r.get("usage") or {}).get(proc, {}).get(key) is not None]

        rate = vals("pods_per_s")
        frac = vals("fraction_of_ceiling")
        frac_e2e = vals("fraction_of_ceiling_e2e")
        if not frac and ceiling:
            # results written before the ceiling was measured in every round: one ceiling for all
            frac = [v / ceiling for v in rate]
            frac_e2e = [v / ceiling for v in vals("pods_per_s_e2e")]
        per[name] = {
            "runs": len(runs),
            "ok": len(good),
            "errors": [r.get("error", "") for r in runs if not r.get("ok")],
            "pods_per_s": rate,
            "pods_per_s_median": _med(rate),
            "pods_per_s_e2e": vals("pods_per_s_e2e"),
            "ready_s": [r["timings"]["ready_s"] for r in good if (r.get("timings") or {}).get("ready_s") is not None],
            "first_bind_s": vals("first_bind_s"),
            "last_bind_s": vals("last_bind_s"),
            "partial_gangs": sum(r.get("partial_gangs", 0) for r in runs),
            # each run's rate over the ceiling measured in its own round
            "fraction_of_ceiling_runs": frac,
            "fraction_of_ceiling_e2e_runs": frac_e2e,
            "fraction_of_ceiling": _med(frac),
            "fraction_of_ceiling_e2e": _med(frac_e2e),
            "scheduler_cpu_s": usage("scheduler", "cpu_seconds"),
            "scheduler_cpu_percent": usage("scheduler", "cpu_percent"),
            "scheduler_peak_rss": usage("scheduler", "peak_rss_bytes"),
            "apiserver_cpu_s": usage("kube-apiserver", "cpu_seconds"),
            "apiserver_cpu_percent": usage("kube-apiserver", "cpu_percent"),
            "apiserver_peak_rss": usage("kube-apiserver", "peak_rss_bytes"),
            "etcd_cpu_s": usage("etcd", "cpu_seconds"),
            "gang_spread_ms": [r["gang_bind_spread_ms"]["median"] for r in good if r.get("gang_bind_spread_ms")],
            "stream_latency_ms": [r["stream_latency_ms"] for r in good if r.get("stream_latency_ms")],
            "metrics": [r.get("scheduler_metrics") or {} for r in good],
        }
        s = per[name]
        s["stats"] = {
            key: _stats(s[key])
            for key in ("pods_per_s", "pods_per_s_e2e", "ready_s", "first_bind_s", "last_bind_s",
                        "fraction_of_ceiling_runs", "fraction_of_ceiling_e2e_runs")
        }
    ours = per.get("batchsched", {}).get("pods_per_s_median")
    ours_e2e = _med(per.get("batchsched", {}).get("pods_per_s_e2e", []))
    for name, s in per.items():
        theirs = s["pods_per_s_median"]
        theirs_e2e = _med(s["pods_per_s_e2e"])
        s["batchsched_ratio"] = (ours / theirs) if ours and theirs and name != "batchsched" else None
        s["batchsched_ratio_e2e"] = (
            (ours_e2e / theirs_e2e) if ours_e2e and theirs_e2e and name != "batchsched" else None
        )
    c = data.get("ceiling") or {}
    ceilings = [x["best"] for x in data.get("ceilings") or [] if x.get("best")]
    return {
        "ceiling": ceiling,
        "ceiling_per_round": ceilings or ([ceiling] if ceiling else []),
        "ceiling_in_rounds": bool(data.get("ceilings")),
        "ceiling_stats": _stats(ceilings) if ceilings else {"median": c.get("best"), "min": c.get("best"), "max": c.get("best")},
        "schedulers": per,
    }


def _cycle_metrics(metrics: list[dict[str, float]]) -> str:
    """batchsched's own account of its cycles, from /metrics (median over runs)."""
    if not metrics:
        return ""
    parts = []
    count = _med([m.get("batchsched_cycle_duration_seconds_count{phase=total}", 0.0) for m in metrics])
    for phase in ("total", "snapshot", "kernel"):
        key = f"batchsched_cycle_duration_seconds_sum{{phase={phase}}}"
        vals = [m[key] for m in metrics if key in m]
        if vals:
            parts.append(f"{phase} {_fmt(_med(vals), 2)} s")
    bound = _med([m.get("batchsched_binds_total{result=bound}", 0.0) for m in metrics])
    return f"{_fmt(count)} cycles; cycle time summed: {', '.join(parts)}; {_fmt(bound)} binds accepted"


def suite_markdown(data: dict[str, Any], summary: dict[str, Any], plot: str | None) -> list[str]:
    nodes, pods = data["nodes"], data["pods"]
    gangs = f", {data['gangs']} gangs" if data.get("gangs") else ""
    lines = [f"## {data['workload']} @ {data['size']}: {nodes:,} nodes, {pods:,} pods{gangs}", ""]
    if data.get("description"):
        lines += [f"{data['description']}. GPUs asked {data['gpu_demand']:,} of {data['gpu_capacity']:,}.", ""]
    ceiling = data.get("ceiling") or {}
    if data.get("ceilings"):
        per_round = ", ".join(
            f"round {c['round'] + 1}: {_fmt(c.get('best'))}" + (" (failed)" if c.get("error") else "")
            for c in data["ceilings"]
        )
        sweep = ", ".join(f"{r['concurrency']} in flight: {_fmt(r['binds_per_s'])}/s" for r in ceiling.get("sweep") or [])
        lines += [
            f"Bind ceiling, measured in every round after the schedulers (A, B, ceiling, ...) on the same "
            f"cluster shape: **{_spread(summary['ceiling_per_round'])} binds/s** ({per_round}; last round: {sweep}). "
            "Each run's rate is divided by its own round's ceiling.",
            "",
        ]
        beside = [c for c in data["ceilings"] if c.get("best_beside")]
        if beside:
            shares = ", ".join(
                f"round {c['round'] + 1}: {_fmt(c['best_beside'])} binds/s beside {c['neighbour_cpu']:.2f} cores"
                + "".join(f"; {r['scheduler']} {100 * r['fraction_of_ceiling_beside']:.0f}% of it"
                          for r in data["runs"] if r.get("round") == c["round"] and r.get("fraction_of_ceiling_beside"))
                for c in beside
            )
            lines += [
                "The ceiling beside a neighbour that uses the CPU batchsched used over its bind window in the round (a watch of "
                f"every pod and a busy loop, `perf/neighbour.py`): the most a scheduler of its size could bind "
                f"on this machine: {shares}.",
                "",
            ]
    elif ceiling.get("sweep"):
        sweep = ", ".join(f"{r['concurrency']} in flight: {_fmt(r['binds_per_s'])}/s" for r in ceiling["sweep"])
        lines += [f"Bind ceiling on this control plane, measured once after the runs: **{_fmt(ceiling['best'])} binds/s** ({sweep}).", ""]
    lines += [
        "| scheduler | runs ok | pods/s, first→last bind: median (min\u2013max) | pods/s end to end | "
        "ready s | first bind s | last bind s | batchsched ÷ this | of ceiling | end to end, of ceiling | partial gangs | "
        "scheduler CPU s (% of a core) | scheduler peak RSS MiB | apiserver CPU s (%) | apiserver peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary["schedulers"].items():
        ratio = "\u2013"
        if s["batchsched_ratio"]:
            ratio = f"{s['batchsched_ratio']:.2f}x"
            if s["batchsched_ratio_e2e"]:
                ratio += f" (e2e {s['batchsched_ratio_e2e']:.2f}x)"
        cpu = _spread(s["scheduler_cpu_s"], 1)
        if s["scheduler_cpu_percent"]:
            cpu += f" ({_fmt(_med(s['scheduler_cpu_percent']))}%)"
        api = _spread(s["apiserver_cpu_s"], 1)
        if s["apiserver_cpu_percent"]:
            api += f" ({_fmt(_med(s['apiserver_cpu_percent']))}%)"
        lines.append(
            f"| {name} | {s['ok']}/{s['runs']} | {_spread(s['pods_per_s'])} | {_spread(s['pods_per_s_e2e'])} | "
            f"{_spread(s['ready_s'], 2)} | {_spread(s['first_bind_s'], 2)} | {_spread(s['last_bind_s'], 2)} | {ratio} | "
            f"{_pct(s['fraction_of_ceiling_runs'])} | {_pct(s['fraction_of_ceiling_e2e_runs'])} | "
            f"{s['partial_gangs']} | {cpu} | {_spread([_mib(v) or 0 for v in s['scheduler_peak_rss']])} | "
            f"{api} | {_spread([_mib(v) or 0 for v in s['apiserver_peak_rss']])} |"
        )
    lines.append("")
    notes = [
        "- ready: the scheduler's /readyz first answered 200 (caches synced), seconds from its start; "
        "first and last bind: seconds from its start; end to end: pods bound over the time from the "
        "scheduler's start to its last bind. Every figure: median (min\u2013max) over the rounds.",
    ]
    for name, s in summary["schedulers"].items():
        if s["gang_spread_ms"]:
            notes.append(f"- {name}: within a gang, first to last bind took a median {_fmt(_med(s['gang_spread_ms']))} ms (median over runs).")
        for lat in s["stream_latency_ms"][:1]:
            parts = "; ".join(f"{k}: p50 {v['p50']:.0f} ms, p99 {v['p99']:.0f} ms" for k, v in lat.items())
            notes.append(f"- {name}: creation-to-bind latency of the pods created during the run (streamed, "
                         f"or once the cluster was full; first run): {parts}.")
        if name == "batchsched" and s["metrics"]:
            notes.append(f"- batchsched's /metrics (median of runs): {_cycle_metrics(s['metrics'])}.")
        for err in s["errors"]:
            notes.append(f"- {name}: a run failed: {err.splitlines()[0] if err else 'unknown'}")
    for name, reason in (data.get("unavailable") or {}).items():
        notes.append(f"- {name} did not run: {reason}")
    for name, p in (data.get("peers") or {}).items():
        notes.append(f"- {name} settings: {p['settings']} (pods' schedulerName `{p['scheduler_name']}`).")
    if data.get("apiserver_args"):
        notes.append(f"- apiserver flags for every run of this workload: `{' '.join(data['apiserver_args'])}`.")
    notes.append(_machine_line(data))
    lines += [*notes, ""]
    lines += gang_markdown(data)
    if plot:
        lines += [f"![pods bound over time]({plot})", ""]
    for run in data.get("profile_runs") or []:
        lines += profile_markdown(run)
    return lines


def gang_markdown(data: dict[str, Any]) -> list[str]:
    """Per scheduler and gang class: when gangs were bound, and what the watch of every pod
    version saw of them (partly bound, preempted whole or in part, spanning racks)."""
    runs = [r for r in data.get("runs", []) if r.get("gang_classes")]
    if not runs:
        return []
    preempting = any(r.get("gangs_preempted") for r in runs)
    topology = any(r.get("topology_gangs") for r in runs)
    lines = [
        "Gangs, per class: seconds from the scheduler's start (for gangs created once the cluster was "
        "full: from their creation) to the first and to the last bind of each gang, as the median over "
        "the gangs (the median of the runs') and the largest (over the runs); then, per run, what the "
        "watch of every pod version saw at the end: gangs bound whole, gangs partly bound (members seen "
        "deleted count as gone)"
        + ("; gangs preempted (a bound member deleted) and of those, partly (members left bound)" if preempting else "")
        + ("; gangs whose members sit in more than one domain of their topology key" if topology else "")
        + ". Several values in a cell: one per run, in order.",
        "",
        "| scheduler | class | gangs | bound whole | first bind s: median (max) | last bind s: median (max) | partial |"
        + (" preempted | partly preempted |" if preempting else "")
        + (" spanning racks |" if topology else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if preempting else "") + ("---|" if topology else ""),
    ]
    by_sched: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_sched.setdefault(r["scheduler"], []).append(r)
    for name, rs in by_sched.items():
        for klass in sorted({k for r in rs for k in r["gang_classes"]}):
            cs = [r["gang_classes"][klass] for r in rs if klass in r["gang_classes"]]

            def each(key: str, cs: list[dict[str, Any]] = cs) -> str:
                return "; ".join(str(c.get(key, 0)) for c in cs)

            def dist(key: str, cs: list[dict[str, Any]] = cs) -> str:
                vals = [c[key] for c in cs if c.get(key)]
                if not vals:
                    return "\u2013"
                return f"{_fmt(_med([v['median'] for v in vals]), 2)} ({_fmt(max(v['max'] for v in vals), 2)})"

            row = (f"| {name} | {klass} | {cs[0]['gangs']} | {each('bound_whole')} | {dist('first_bind_s')} | "
                   f"{dist('last_bind_s')} | {each('partial')} |")
            if preempting:
                row += f" {each('preempted')} | {each('partly_preempted')} |"
            if topology:
                row += f" {each('spanning')} |"
            lines.append(row)
    return [*lines, ""]


def profile_markdown(run: dict[str, Any], top: int = 15) -> list[str]:
    prof = run.get("profile") or {}
    if not prof.get("by_own_time"):
        return [f"batchsched under cProfile: {prof.get('error') or run.get('error') or 'no profile'}", ""]
    lines = [
        f"Where batchsched's time goes: one extra run under cProfile (not counted above; profiling "
        f"slows it down): {run.get('bound')} pods bound in {_fmt(run.get('last_bind_s'), 2)} s, "
        f"{prof['total_s']:.2f} s profiled on the main thread (event loop: watch, cycle, binder, status). "
        f"Top functions by own time:",
        "",
        "| function | calls | own s | cumulative s |",
        "|---|---|---|---|",
    ]
    for r in prof["by_own_time"][:top]:
        lines.append(f"| `{r['function']}` | {r['calls']:,} | {r['own_s']:.3f} | {r['cumulative_s']:.3f} |")
    lines.append("")
    return lines


def cycle_markdown(cyc: dict[str, Any], plot: str | None) -> list[str]:
    lines = ["## Cycle and kernel benchmarks (no apiserver)", ""]
    if cyc.get("quick"):
        lines += ["Quick (smoke) sizes.", ""]
    lines += [
        "Steady-state cycle (node filter cached; the first cycle after a node change also builds it), "
        "milliseconds. Pending pods ask for 1, 2, 4 or 8 GPUs at three priorities; a third of the "
        "nodes' GPUs are already taken.",
        "",
        "| nodes | pending | placed | snapshot | units | order | kernels | plan | cycle | all | first cycle |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cyc.get("cycle", []):
        s, f = r["steady_s"], r["first_s"]
        lines.append(
            f"| {r['nodes']:,} | {r['pods']:,} | {r['placed']:,} | " + " | ".join(
                _fmt(1e3 * s[k], 1) for k in ("snapshot", "units", "order", "kernels", "plan", "cycle", "total")
            ) + f" | {_fmt(1e3 * f['total'], 1)} |"
        )
    lines.append("")
    if cyc.get("twin"):
        lines += ["JIT kernels against their plain-Python twins (same cycle code), steady cycle:", "",
                  "| nodes | pending | JIT kernels ms | twin kernels ms | speed-up | JIT cycle ms | twin cycle ms |",
                  "|---|---|---|---|---|---|---|"]
        for t in cyc["twin"]:
            j, p = t["jit"]["steady_s"], t["twin"]["steady_s"]
            speed = p["kernels"] / j["kernels"] if j["kernels"] else None
            lines.append(
                f"| {t['jit']['nodes']:,} | {t['jit']['pods']:,} | {_fmt(1e3 * j['kernels'], 2)} | "
                f"{_fmt(1e3 * p['kernels'], 1)} | {_fmt(speed)}x | {_fmt(1e3 * j['cycle'], 1)} | {_fmt(1e3 * p['cycle'], 1)} |"
            )
        lines.append("")
    if cyc.get("gang"):
        lines += ["One gang (min count = size) of single-GPU pods on half-used nodes:", "",
                  "| nodes | gang | kernel ms | whole cycle ms | first cycle ms |", "|---|---|---|---|---|"]
        for g in cyc["gang"]:
            lines.append(f"| {g['nodes']:,} | {g['gang']} | {g['kernel_ms']:.3f} | {g['cycle_ms']:.2f} | {g['first_cycle_ms']:.1f} |")
        lines.append("")
    if cyc.get("cards"):
        lines += ["GPU cards: nodes of 8 elasticgpu.io cards, a fractional mix pending, steady cycle, per card "
                  "policy, next to the whole-GPU cycle of the same size:", "",
                  "| nodes | pending | whole-GPU cycle ms | fragmentation ms | binpack ms |", "|---|---|---|---|---|"]
        for c in cyc["cards"]:
            w = c["whole_gpu"]
            lines.append(f"| {w['nodes']:,} | {w['pods']:,} | {1000 * w['steady_s']['cycle']:.0f} | "
                         f"{1000 * c['fragmentation']['steady_s']:.0f} | {1000 * c['binpack']['steady_s']:.0f} |")
        lines.append("")
    w = cyc.get("warm_up")
    if w:
        lines += [
            f"Kernel compile / warm-up in a fresh process: cold numba cache {w['cold']['warm_up_s']:.2f} s "
            f"(process {w['cold']['process_s']:.2f} s), warm cache {w['warm']['warm_up_s']:.2f} s "
            f"(process {w['warm']['process_s']:.2f} s); importing the kernels module {w['warm']['import_s']:.2f} s.",
            "",
        ]
    m = cyc.get("mirror")
    if m:
        lines += [
            f"Mirror memory: a process holding {m['nodes']:,} nodes and {m['pods']:,} pods ({m['bound']:,} bound, "
            f"{m['pending']:,} pending), parsed from apiserver-like JSON pages: RSS {m['rss_with_mirror_mib']:.0f} MiB "
            f"({m['rss_after_imports_mib']:.0f} MiB after imports, so {m['mirror_mib']:.0f} MiB for the mirror), "
            f"peak {m['peak_rss_mib']:.0f} MiB; parse and apply took {m['ingest_s']:.2f} s.",
            "",
        ]
    if cyc.get("backlog"):
        from perf.backlog import markdown as backlog_markdown

        lines += backlog_markdown(cyc["backlog"])
    if plot:
        lines += [f"![cycle time against cluster size]({plot})", ""]
    return lines


def _by_scheduler(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in data.get("peers") or {}}
    for r in data.get("runs", []):
        out.setdefault(r["scheduler"], []).append(r)
    return out


def restart_markdown(data: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The restart benchmark (perf/restart.py): one row per scheduler, median (min-max)."""
    lines = [
        f"## Restart after SIGKILL: {data['nodes']:,} nodes, {data['gangs']} gangs of {data['gang_size']} "
        f"+ {data['single_pods']:,} pods of {data['pod_gpus']} GPUs",
        "",
        f"{data['pods']:,} pods asking {data['gpu_demand']:,} GPUs of {data['gpu_capacity']:,}, all created before the "
        f"first start. Each scheduler is killed (SIGKILL) once {100 * data['kill_fraction']:.0f}% of the pods are bound, "
        f"then, after no bind has been seen for {data['quiet_s']:.0f} s, started again with the same configuration. "
        "Times are seconds from the start of that process; median (min\u2013max) over the rounds.",
        "",
        "| scheduler | runs ok | first start: ready | first start: first bind | bound at the kill | pending at restart | "
        "**restart: ready** | **restart: first bind** | CPU s to that bind | pods/s in the "
        f"{data['after_s']:.0f} s after it |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary: dict[str, Any] = {}
    for name, runs in _by_scheduler(data).items():
        good = [r for r in runs if r.get("ok")]

        def v(part: str, key: str, rs: list[dict[str, Any]] = good) -> list[float]:
            return [r[part][key] for r in rs if r.get(part, {}).get(key) is not None]

        cols = {
            "first_ready_s": v("first_start", "ready_s"), "first_first_bind_s": v("first_start", "first_bind_s"),
            "bound_at_kill": v("first_start", "bound_at_kill"), "pending_at_restart": v("restart", "pending_at_restart"),
            "restart_ready_s": v("restart", "ready_s"), "restart_first_bind_s": v("restart", "first_bind_s"),
            "restart_cpu_s_to_first_bind": v("restart", "cpu_s_to_first_bind"),
            "pods_per_s_after": v("restart", "pods_per_s_after"),
        }
        summary[name] = {"runs": len(runs), "ok": len(good), **{k: _stats(x) for k, x in cols.items()}}
        lines.append(
            f"| {name} | {len(good)}/{len(runs)} | {_spread(cols['first_ready_s'], 2)} | {_spread(cols['first_first_bind_s'], 2)} | "
            f"{_spread(cols['bound_at_kill'])} | {_spread(cols['pending_at_restart'])} | {_spread(cols['restart_ready_s'], 2)} | "
            f"{_spread(cols['restart_first_bind_s'], 2)} | {_spread(cols['restart_cpu_s_to_first_bind'], 2)} | "
            f"{_spread(cols['pods_per_s_after'])} |"
        )
    lines.append("")
    for name, runs in _by_scheduler(data).items():
        for r in runs:
            if not r.get("ok"):
                lines.append(f"- {name}: a run failed: {(r.get('error') or 'unknown').splitlines()[0]}")
    for name, p in (data.get("peers") or {}).items():
        lines.append(f"- {name}: {p['settings']}; gangs: {p['gangs']}.")
    lines += [_machine_line(data), ""]
    return lines, summary


def idle_markdown(data: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The idle benchmark (perf/idle.py): one row per scheduler, median (min-max)."""
    what = (f"{data['gangs']} gangs of {data['gang_size']} pods of 8 GPUs (quorum {data['gang_size']})"
            if data["variant"] == "gangs" else f"{data['pods']:,} single pods of 8 GPUs")
    lines = [
        f"## Idle: {what} waiting on {data['nodes']:,} nodes, {data['free_nodes']} of them free",
        "",
        f"Every other node is full (one 8-GPU pod bound at creation). After {data['settle_s']:.0f} s from the "
        f"scheduler's start, nothing changes for {data['window_s']:.0f} s; CPU over that window, percent of one core, "
        "median (min\u2013max) over the rounds.",
        "",
        "| scheduler | runs ok | **scheduler CPU %** | per sample, first run | apiserver CPU % | etcd CPU % | "
        "binds in the window | node writes in the window | batchsched cycles in the window | scheduler RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary: dict[str, Any] = {}
    for name, runs in _by_scheduler(data).items():
        good = [r for r in runs if r.get("ok")]

        def v(key: str, rs: list[dict[str, Any]] = good) -> list[float]:
            return [r[key] for r in rs if r.get(key) is not None]

        cols = {k: v(k) for k in ("scheduler_cpu_percent", "apiserver_cpu_percent", "etcd_cpu_percent",
                                   "binds_in_window", "node_writes_in_window", "cycles_in_window")}
        rss = [x / 2**20 for x in v("scheduler_rss_bytes")]
        summary[name] = {"runs": len(runs), "ok": len(good), **{k: _stats(x) for k, x in cols.items()}}
        series = good[0].get("scheduler_cpu_percent_series") if good else None
        samples = ", ".join(f"{x:.1f}" for x in series) if series else "\u2013"
        lines.append(
            f"| {name} | {len(good)}/{len(runs)} | {_spread(cols['scheduler_cpu_percent'], 1)} | "
            f"{samples} | {_spread(cols['apiserver_cpu_percent'], 1)} | "
            f"{_spread(cols['etcd_cpu_percent'], 1)} | {_spread(cols['binds_in_window'])} | "
            f"{_spread(cols['node_writes_in_window'])} | "
            f"{_spread(cols['cycles_in_window'])} | {_spread(rss)} |"
        )
    lines.append("")
    for name, runs in _by_scheduler(data).items():
        for r in runs:
            if not r.get("ok"):
                lines.append(f"- {name}: a run failed: {(r.get('error') or 'unknown').splitlines()[0]}")
    for name, p in (data.get("peers") or {}).items():
        lines.append(f"- {name}: {p['settings']}.")
    lines += [_machine_line(data), ""]
    return lines, summary


def _machine_line(data: dict[str, Any]) -> str:
    m = data.get("machine") or {}
    code = m.get("code")
    return (f"- {m.get('cpus')} CPUs, load average {m.get('load_before', 0):.1f} before the first run; "
            f"started {data.get('started')}" + (f"; code {code}" if code else "") + ".")


# -- plots -------------------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bound(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    seen: set[str] = set()
    for r in data.get("runs", []):
        tl = r.get("timeline") or []
        if not tl:
            continue
        name = r["scheduler"]
        xs = [0.0] + [p[0] for p in tl]
        ys = [0] + [p[1] for p in tl]
        ax.step(xs, ys, where="post", color=COLORS.get(name, "gray"), alpha=0.8, linewidth=1.2,
                label=None if name in seen else name)
        seen.add(name)
    ax.set_xlabel("seconds since the scheduler process started")
    ax.set_ylabel("pods bound")
    ax.set_title(f"{data['workload']} @ {data['size']}: {data['nodes']:,} nodes, {data['pods']:,} pods")
    ax.grid(alpha=0.3)
    if seen:
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_cycle(cyc: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    by_pods: dict[int, list[tuple[int, float]]] = {}
    for r in cyc.get("cycle", []):
        by_pods.setdefault(r["pods"], []).append((r["nodes"], r["steady_s"]["total"]))
    for pods, pts in sorted(by_pods.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{pods:,} pending pods")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (8 GPUs each)")
    ax.set_ylabel("one cycle, seconds (snapshot + units + cycle)")
    ax.set_title("batchsched cycle time against cluster size")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- the whole report ----------------------------------------------------------------------------


def write_report(out: Path) -> dict[str, Path]:
    """Write report.md, summary.json and the plots; returns what was written."""
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    lines = ["# batchsched perf report", "", f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %z')}.", ""]
    summary: dict[str, Any] = {"sched": {}, "ceiling": {}, "cycle": None}
    for path in sorted((out / "sched").glob("*.json")):
        data = _load(path)
        s = summarize_suite(data)
        summary["sched"][path.stem] = {"nodes": data["nodes"], "pods": data["pods"], **s}
        png = out / f"bound-{path.stem}.png"
        plot_bound(data, png)
        written[png.name] = png
        lines += suite_markdown(data, s, png.name)
    for path in sorted((out / "ceiling").glob("*.json")):
        data = _load(path)
        summary["ceiling"][path.stem] = data
        lines += [f"## Bind ceiling, {data['nodes']:,} nodes, {data['binds']:,} binds per step", "",
                  "| in flight | binds/s | client CPU % | apiserver CPU % | apiserver CPU ms per bind |",
                  "|---|---|---|---|---|"]
        for r in data["sweep"]:
            lines.append(f"| {r['concurrency']} | {_fmt(r['binds_per_s'])} | {_fmt(r['client_cpu_percent'])} | "
                         f"{_fmt(r['apiserver_cpu_percent'])} | {_fmt(r['apiserver_cpu_ms_per_bind'], 2)} |")
        lines.append("")
    for kind, render in (("restart", restart_markdown), ("idle", idle_markdown)):
        for path in sorted((out / kind).glob("*.json")):
            data = _load(path)
            section, ssum = render(data)
            summary.setdefault(kind, {})[path.stem] = ssum
            lines += section
    scale = [_load(p) for p in sorted((out / "sandbox").glob("*.json"))]
    if scale:
        from perf.sandboxbench import table

        scale.sort(key=lambda r: r["nodes"])
        summary["sandbox"] = {str(r["nodes"]): {k: v for k, v in r.items() if k != "samples"} for r in scale}
        lines += ["## The sandbox at scale (python -m perf sandbox)", "",
                  "Seconds from creating the nodes to all Ready (as `batchsched sandbox up` waits), then CPU "
                  "(percent of one core) of each control-plane process while idle, and nodes that left Ready.", "",
                  *table(scale), ""]
    cycle_path = out / "cycle.json"
    if cycle_path.exists():
        cyc = _load(cycle_path)
        summary["cycle"] = cyc
        png = out / "cycle-time.png"
        if cyc.get("cycle"):
            plot_cycle(cyc, png)
            written[png.name] = png
        lines += cycle_markdown(cyc, png.name if png.name in written else None)
    for sim_md in sorted((out / "sim").glob("*.md")):
        # the card policies on the openb trace (python -m perf sim): tables and plots there
        text = sim_md.read_text().replace("](", "](sim/")
        lines += ["#" + text.lstrip("#") if text.startswith("# ") else text, ""]
    replay = out / "sim" / "replay-waits.png"
    if replay.exists():
        lines += ["## openb at its own times, arrivals sped up: wait-time CDF", "", "![waits](sim/replay-waits.png)", ""]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    written["report.md"] = md
    js = out / "summary.json"
    write_json(js, summary)
    written["summary.json"] = js
    return written
