"""A workload at one size through every peer, alternating A B A B, plus the ceiling.

Writes ``<out>/sched/<workload>@<size>.json``: every run (see :mod:`perf.live`), the
settings each peer ran with, the peers that could not run and why, and the bind ceiling
measured on a control plane of the same size.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from perf.ceiling import run_ceiling
from perf.live import RunConfig, RunError, run_once
from perf.peers import PeerUnavailable, apiserver_args, get_peer
from perf.workload import expand, load_workload

DEFAULT_CONCURRENCIES = [1, 16, 64, 256]


def log(message: str) -> None:
    print(f"perf: {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_before": os.getloadavg()[0],
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    tmp.replace(path)


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
) -> dict[str, Any]:
    """Every run of one workload at one size; returns (and writes) the suite's data.

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
        if not peer.supports(ex):
            unavailable[name] = f"{name} cannot schedule gangs"
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
        "ceiling": None,
    }
    path = out / "sched" / f"{tag}.json"
    workdir = out / "work" / tag
    shutil.rmtree(workdir, ignore_errors=True)
    for r in range(runs):
        for peer in peers:  # A B A B: every peer once per round, same order each round
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
                log(
                    f"{tag}: {peer.name}: {result['bound']} pods bound, {result['pods_per_s']} pods/s "
                    f"(first bind {result['first_bind_s']} s, last {result['last_bind_s']} s)"
                )
            else:
                log(f"{tag}: {peer.name}: FAILED: {result['error']}")
                if strict:
                    raise RunError(f"{tag}: {peer.name}: {result['error']}")
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
    if ceiling:
        log(f"{tag}: bind ceiling on {ex.size.nodes} nodes ...")
        data["ceiling"] = run_ceiling(
            nodes=ex.size.nodes,
            binds=ceiling_binds or max(200, min(len(ex.pods), 4000)),
            concurrencies=concurrencies or DEFAULT_CONCURRENCIES,
            apiserver_args=args,
            sandbox_name=f"perf-{os.getpid()}-ceiling",
        )
        log(f"{tag}: ceiling {data['ceiling']['best']} binds/s")
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json(path, data)
    return data
