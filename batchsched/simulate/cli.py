"""``batchsched simulate``: the production session replayed on a trace, every card policy
side by side, next to the published state of the art; or one configuration file
(``--config``), applied as ``batchsched run --config`` applies it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from batchsched.core.devices import POLICIES

if TYPE_CHECKING:
    from batchsched.simulate.experiment import Run

SCOPES = ("sharing", "all")
#: every policy in the scope it is meant for (fragmentation in both): what runs by default
DEFAULT_RUNS = (("fragmentation", "sharing"), ("fragmentation", "all"), ("binpack", "sharing"),
                ("spread", "sharing"), ("random", "sharing"), ("bestfit", "all"), ("dotproduct", "all"))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="replay a trace through the scheduling session, per card policy")
    p.add_argument("--trace", default="openb", choices=["openb"], help="the trace (openb)")
    p.add_argument("--scenario", help="replay this what-if scenario (YAML: config, nodes, queues, timed jobs; "
                                      "see batchsched.simulate.scenario)")
    p.add_argument("--snapshot", help="replay this cluster snapshot (batchsched snapshot, or /debug/snapshot) "
                                      "instead of a trace: where its pending pods go")
    p.add_argument("--variant", default="default",
                   help="which openb pod list: default, gpushare100, multigpu50, gpuspec33, cpu050, ...")
    p.add_argument("--trace-dir", help="the folder holding the trace's CSV files")
    p.add_argument("--mode", default="fragmentation", choices=["fragmentation", "replay"],
                   help="fragmentation: tasks arrive in a seeded order and never leave (FGD's method); "
                        "replay: tasks arrive at their creation time and run as long as in the trace")
    p.add_argument("--limit", type=int, help="replay: only the first N tasks by creation time")
    p.add_argument("--arrival-speedup", type=float, default=1.0,
                   help="replay: tasks arrive this many times sooner (durations unchanged): more load")
    p.add_argument("--load", type=float, default=1.3, help="GPU asked as a share of the cluster's cards")
    p.add_argument("--seeds", type=int, default=10, help="seeds 42, 43, ...")
    p.add_argument("--config", help="replay with this batchsched configuration file (YAML), read as "
                                    "`batchsched run --config` reads it; alone, it is the one run")
    p.add_argument("--policy", action="append", choices=POLICIES,
                   help="card policies to compare (default: all; with --config: the file's)")
    p.add_argument("--scope", action="append", choices=SCOPES,
                   help="which pods the card policy places: sharing (shares only) or all "
                        "(default: each policy in the scope it is meant for; with --config: the file's)")
    p.add_argument("--workers", type=int, help="processes (default: one per CPU)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")


def main(args: argparse.Namespace) -> int:
    from batchsched.config import ConfigError
    from batchsched.simulate import experiment

    if args.config and (args.snapshot or args.scenario):
        return _error("--config does not apply to --snapshot or --scenario: they carry their own configuration")
    if args.snapshot:
        return _snapshot(args)
    if args.scenario:
        return _scenario(args)
    try:
        runs = _runs(args)
        d = experiment.trace_dir(args.trace_dir)
    except (ConfigError, FileNotFoundError) as exc:
        return _error(str(exc))
    if args.mode == "replay":
        return _replay(args, d, runs)
    seeds = list(range(42, 42 + args.seeds))
    results = experiment.run_fragmentation(
        d, args.variant, runs, seeds, args.load, workers=args.workers,
        progress=experiment.progress_bar if args.output == "table" else None,
    )
    ours = experiment.summarise(results)
    ref = experiment.reference(args.variant)
    if args.output == "json":
        print(json.dumps({
            "trace": args.trace, "variant": args.variant, "mode": args.mode, "load": args.load,
            "config": args.config, "seeds": seeds, "runs": results,
            "summary": {k: {str(p): v for p, v in pts.items()} for k, pts in ours.items()},
            "reference": {k: {str(p): v for p, v in pts.items()} for k, pts in ref.items()},
        }, indent=1))
        return 0
    print(f"openb {args.variant}: {args.mode}, load {args.load:.0%}, {len(seeds)} seed(s)")
    print(experiment.table(ours, ref))
    return 0


def _error(message: str) -> int:
    print(f"batchsched: error: {message}", file=sys.stderr)
    return 1


def _runs(args: argparse.Namespace) -> list[Run]:
    """What to replay: the configuration file (alone, or with its policy or scope replaced by
    the flags), else the default configuration per policy and scope asked, else DEFAULT_RUNS.
    A bad file raises its ConfigError."""
    from batchsched.simulate import experiment

    if args.config:
        return experiment.config_runs(args.config, args.policy or (), args.scope or ())
    if args.policy or args.scope:
        return [experiment.policy_run(p, s) for p in (args.policy or POLICIES) for s in (args.scope or SCOPES)]
    return [experiment.policy_run(p, s) for p, s in DEFAULT_RUNS]


def _replay(args: argparse.Namespace, d: Any, runs: list[Run]) -> int:
    from batchsched.simulate import openb, replay

    nodes = openb.read_nodes(d / "openb_node_list_gpu_node.csv")
    tasks = openb.read_tasks(d / f"openb_pod_list_{args.variant}.csv")
    rows: list[dict[str, Any]] = []
    for run in runs:
        cards = run.settings.cards
        r = replay.run(nodes, tasks, policy=cards.policy, scope=cards.scope, settings=run.settings,
                       limit=args.limit, arrival_speedup=args.arrival_speedup)
        rows.append({"run": run.name, "policy": cards.policy, "scope": cards.scope,
                     "peak_allocation": r.peak_allocation(),
                     "mean_allocation": r.mean_allocation(), "never_placed": r.never_placed,
                     "wait_s": r.percentiles("waits"), "completion_s": r.percentiles("completions")})
    if args.output == "json":
        print(json.dumps({"trace": args.trace, "variant": args.variant, "mode": "replay", "config": args.config,
                          "runs": rows}, indent=1))
        return 0
    print(f"openb {args.variant}: replay of {args.limit or len(tasks)} tasks at their trace times")
    width = max(24, *(len(row["run"]) + 2 for row in rows))
    print(f"{'run':<{width}}{'peak alloc %':>14}{'mean alloc %':>14}{'never placed':>14}{'wait p50/p90/p99 (s)':>28}")
    for row in rows:
        waits = [w for w in row["wait_s"].values()]
        p50 = max((w["p50"] for w in waits), default=0.0)
        p90 = max((w["p90"] for w in waits), default=0.0)
        p99 = max((w["p99"] for w in waits), default=0.0)
        print(f"{row['run']:<{width}}{row['peak_allocation']:>14.2f}{row['mean_allocation']:>14.2f}"
              f"{row['never_placed']:>14}{f'{p50:.0f}/{p90:.0f}/{p99:.0f}':>28}")
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from batchsched.core.devices import annotations_for
    from batchsched.core.model import parse_pod
    from batchsched.simulate import snapshot

    snap = json.loads(Path(args.snapshot).read_text())
    placed = snapshot.replay(snap, now=time.time())
    pods = {p["metadata"]["uid"]: p for p in snap["objects"].get("pods", [])}
    rows = []
    for uid, where in sorted(placed.items(), key=lambda kv: (pods[kv[0]]["metadata"].get("namespace", ""),
                                                             pods[kv[0]]["metadata"]["name"])):
        pod = pods[uid]
        notes, _ = annotations_for(parse_pod(pod).card_asks, where.cards or ())
        rows.append({"namespace": pod["metadata"].get("namespace", ""), "name": pod["metadata"]["name"],
                     "node": where.node, "cards": notes, "devices": list(where.devices)})
    if args.output == "json":
        print(json.dumps({"snapshot": args.snapshot, "placed": rows}, indent=1))
        return 0
    print(f"{len(rows)} pending pod(s) placed by a replay of {args.snapshot}:")
    for r in rows:
        parts = [f"{r['namespace']}/{r['name']} -> {r['node']}", *(f"{k}={v}" for k, v in r["cards"].items())]
        if r["devices"]:
            parts.append("devices " + ",".join(r["devices"]))
        print("  " + " ".join(parts))
    return 0


def _scenario(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from batchsched.simulate import scenario

    result = scenario.run(yaml.safe_load(Path(args.scenario).read_text()) or {})
    rows = [{"job": j.name, "queue": j.queue, "arrived": j.arrived, "started": j.started, "ended": j.ended,
             "wait": j.wait, "evictions": j.evictions} for j in result.jobs.values()]
    if args.output == "json":
        print(json.dumps({"scenario": args.scenario, "jobs": rows, "usage": result.usage}, indent=1))
        return 0
    print(f"{'job':<24}{'queue':<16}{'arrived':>10}{'started':>10}{'wait s':>10}{'ended':>10}{'evicted':>9}")
    for r in rows:
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.0f}"
        print(f"{r['job']:<24}{r['queue'] or '-':<16}{f(r['arrived']):>10}{f(r['started']):>10}"
              f"{f(r['wait']):>10}{f(r['ended']):>10}{r['evictions']:>9}")
    return 0
