"""A workload at one size through every peer, in rounds: A B ceiling, A B ceiling, ...

Writes ``<out>/sched/<workload>@<size>.json``: every run (see :mod:`perf.live`), the
settings each peer ran with, the peers that could not run and why, and the Binding
ceiling measured once per round on a control plane of the same size and node shape.
Each run carries its round's ceiling and its rates (bind window and end to end) as
fractions of it.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from perf.ceiling import run_ceiling
from perf.live import RunConfig, RunError, run_once
from perf.peers import PeerUnavailable, apiserver_args, get_peer
from perf.workload import expand, load_workload

#: the in-round ceiling's sweep (the rate at 1 and 16 in flight never was the best; the
#: stand-alone ``python -m perf ceiling`` sweeps 1, 16, 64, 256)
DEFAULT_CONCURRENCIES = [64, 256]


def log(message: str) -> None:
    print(f"perf: {message}", file=sys.stderr, flush=True)


def code_version() -> str:
    """The commit batchsched ran from, and whether batchsched/ had uncommitted changes."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "batchsched"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{head}{' + uncommitted changes in batchsched/' if dirty else ''}" if head else ""


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_before": os.getloadavg()[0],
        "code": code_version(),
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    tmp.replace(path)


def describe(result: dict[str, Any]) -> str:
    """One line for the log: both rates, start-up, the fraction of the round's ceiling."""
    frac = result.get("fraction_of_ceiling")
    return (
        f"{result['bound']} pods bound, {result['pods_per_s']} pods/s first to last bind, "
        f"{result['pods_per_s_e2e']} pods/s end to end (ready {result['timings'].get('ready_s')} s, "
        f"first bind {result['first_bind_s']} s, last {result['last_bind_s']} s)"
        + (f", {100 * frac:.0f}% of the round's ceiling" if frac else "")
    )


def attach_ceiling(runs: list[dict[str, Any]], round_: int, best: float | None,
                   best_beside: float | None = None) -> None:
    """Give each run of ``round_`` its round's ceiling and its rates as fractions of it
    (and of the ceiling beside a neighbour of batchsched's size, when measured)."""
    for run in runs:
        if run.get("round") != round_:
            continue
        run["ceiling_best"] = best
        for key, frac in (("pods_per_s", "fraction_of_ceiling"), ("pods_per_s_e2e", "fraction_of_ceiling_e2e")):
            rate = run.get(key)
            run[frac] = round(rate / best, 4) if rate and best else None
        if best_beside:
            run["ceiling_beside"] = best_beside
            rate = run.get("pods_per_s")
            run["fraction_of_ceiling_beside"] = round(rate / best_beside, 4) if rate else None


def _scheduler_cores(runs: list[dict[str, Any]], round_: int, name: str) -> float | None:
    """The cores ``name`` used on average over the bind window of its run of ``round_``
    (over the whole run when the window was not measured; None: no such run)."""
    for run in runs:
        if run.get("round") == round_ and run.get("scheduler") == name and run.get("ok"):
            usage = run.get("usage") or {}
            pct = (usage.get("scheduler_bind_window") or usage.get("scheduler") or {}).get("cpu_percent")
            return round(pct / 100.0, 3) if pct else None
    return None


def ceiling_summary(ceilings: list[dict[str, Any]]) -> dict[str, Any]:
    """``best``: the median over rounds of each round's best rate; the range beside it."""
    bests = [c["best"] for c in ceilings if c.get("best")]
    return {
        "best": statistics.median(bests) if bests else None,
        "min": min(bests) if bests else None,
        "max": max(bests) if bests else None,
        "rounds": len(ceilings),
        "per_round": [c.get("best") for c in ceilings],
        # the last round's sweep, for the report's one-line breakdown
        "sweep": ceilings[-1].get("sweep") if ceilings else [],
    }


def run_suite(
    *,
    workload: str,
    size: str | None,
    schedulers: list[str] | None,
    runs: int,
    out: Path,
    ceiling: bool = True,
    ceiling_binds: int | None = None,
    concurrencies: list[int] | None = None,
    timeout: float | None = None,
    strict: bool = False,
    profile: bool = False,
    beside: bool = False,
) -> dict[str, Any]:
    """Every run of one workload at one size; returns (and writes) the suite's data.

    With ``beside``, each round's ceiling is also measured beside a neighbour using the CPU
    batchsched used over its bind window in that round (:mod:`perf.neighbour`): the rate a scheduler of its
    size could reach at best on this machine, and batchsched's share of it.

    With ``strict``, a peer that cannot be built or a run that fails raises instead of
    being recorded (the smoke test's mode). With ``profile``, one more batchsched run
    under cProfile follows the measured rounds (kept apart: profiling slows it down).
    """
    wl = load_workload(workload)
    ex = expand(wl, size)
    names = schedulers or list(wl.schedulers)
    peers = []
    unavailable: dict[str, str] = {}
    for name in names:
        peer = get_peer(name)
        why = peer.unsupported(ex)
        if why:
            unavailable[name] = why
            continue
        try:
            peer.check()
        except PeerUnavailable as exc:
            if strict:
                raise
            unavailable[name] = str(exc)
            log(str(exc))
            continue
        peers.append(peer)
    args = apiserver_args(peers)
    tag = f"{wl.name}@{ex.size_name}"
    data: dict[str, Any] = {
        "workload": wl.name,
        "description": wl.description,
        "size": ex.size_name,
        "nodes": ex.size.nodes,
        "pods": len(ex.pods),
        "gangs": len(ex.gangs),
        "gpu_demand": ex.gpu_demand,
        "gpu_capacity": ex.gpu_capacity,
        "apiserver_args": args,
        "peers": {p.name: {"settings": p.settings, "scheduler_name": p.scheduler_name} for p in peers},
        "unavailable": unavailable,
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": [],
        "profile_runs": [],
        #: one Binding-ceiling measurement per round (see perf.ceiling)
        "ceilings": [],
        #: their summary: best = the median over rounds of each round's best rate
        "ceiling": None,
    }
    path = out / "sched" / f"{tag}.json"
    workdir = out / "work" / tag
    shutil.rmtree(workdir, ignore_errors=True)
    binds = ceiling_binds or max(200, min(len(ex.pods), 4000))
    for r in range(runs):
        # A B ceiling, A B ceiling: every peer once per round, same order each round, then
        # the Binding ceiling on a control plane of the same shape, so each run is read
        # against the ceiling of its own round (the machine's load drifts between rounds)
        for peer in peers:
            log(f"{tag}: round {r + 1}/{runs}: {peer.name} ...")
            cfg = RunConfig(
                peer=peer, workload=ex, round=r, apiserver_args=tuple(args),
                workdir=workdir / f"{peer.name}-{r}", sandbox_name=f"perf-{os.getpid()}", timeout=timeout,
            )
            try:
                result = run_once(cfg)
            except RunError as exc:
                if strict:
                    raise
                result = {"scheduler": peer.name, "round": r, "ok": False, "error": str(exc)}
            data["runs"].append(result)
            write_json(path, data)
            if result["ok"]:
                log(f"{tag}: {peer.name}: {describe(result)}")
            else:
                log(f"{tag}: {peer.name}: FAILED: {result['error']}")
                if strict:
                    raise RunError(f"{tag}: {peer.name}: {result['error']}")
        if ceiling:
            log(f"{tag}: round {r + 1}/{runs}: bind ceiling on {ex.size.nodes} nodes ...")
            load = _scheduler_cores(data["runs"], r, "batchsched") if beside else None
            try:
                c = run_ceiling(
                    nodes=ex.size.nodes, node=wl.node, extended=ex.extended, binds=binds,
                    concurrencies=concurrencies or DEFAULT_CONCURRENCIES,
                    apiserver_args=args, sandbox_name=f"perf-{os.getpid()}-ceiling", neighbour_cpu=load,
                )
            except RunError as exc:
                if strict:
                    raise
                c = {"nodes": ex.size.nodes, "binds": binds, "sweep": [], "best": None, "error": str(exc)}
            c["round"] = r
            data["ceilings"].append(c)
            attach_ceiling(data["runs"], r, c.get("best"), c.get("best_beside"))
            data["ceiling"] = ceiling_summary(data["ceilings"])
            write_json(path, data)
            log(f"{tag}: round {r + 1}: ceiling {c.get('best')} binds/s" + (f" ({c['error']})" if c.get("error") else "")
                + (f", beside a neighbour of {c['neighbour_cpu']:.2f} cores {c.get('best_beside')} binds/s"
                   if c.get("neighbour_cpu") else ""))
            for run in data["runs"]:
                if run.get("round") == r and run.get("fraction_of_ceiling"):
                    log(f"{tag}: round {r + 1}: {run['scheduler']}: {100 * run['fraction_of_ceiling']:.0f}% of the "
                        f"round's ceiling over the bind window, {100 * (run['fraction_of_ceiling_e2e'] or 0):.0f}% end to end")
    if profile and any(p.name == "batchsched" for p in peers):
        log(f"{tag}: batchsched under cProfile (not a measured run) ...")
        cfg = RunConfig(
            peer=get_peer("batchsched"), workload=ex, round=runs, apiserver_args=tuple(args),
            workdir=workdir / "batchsched-profile", sandbox_name=f"perf-{os.getpid()}", timeout=timeout,
            profile=True,
        )
        try:
            data["profile_runs"].append(run_once(cfg))
        except RunError as exc:
            data["profile_runs"].append({"scheduler": "batchsched", "ok": False, "error": str(exc)})
        write_json(path, data)
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json(path, data)
    return data
