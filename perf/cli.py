"""``python -m perf``: the perf suite's commands (see perf/README.md).

    python -m perf list                               workloads, sizes and schedulers
    python -m perf build                              build the peers (kube-scheduler, scheduler-plugins)
    python -m perf sched WORKLOAD [--size S] [--runs N] [--schedulers a,b]   rounds of A B ceiling
        [--ceiling-beside]   the ceiling also beside a neighbour of batchsched's CPU
    python -m perf ceiling --nodes N [--binds B] [--concurrency 1,16,64,256] [--neighbour-cpu F [--events]]
    python -m perf restart [--nodes N --gangs G --pods P]   kill mid-run, restart: ready, first bind
    python -m perf failover [--nodes N --pods P --runs R --lease-duration S]   leader stopped: standby's first bind
    python -m perf idle [--nodes N] [--variant gangs|pods]  CPU while work that cannot fit waits
    python -m perf sandbox [--nodes 1000,5000]            N nodes to Ready; control plane CPU idle
    python -m perf soak [--nodes N --minutes M --rate R --seed S]   a long steady run: growth, stuck units
    python -m perf chaos [--nodes N] [--faults a,b] [--out DIR]   faults under a gang workload, checked
    python -m perf world [--steps N --seeds K --known a,b --features a,b]   randomised worlds, invariants checked
    python -m perf cycle [--quick]
    python -m perf report
    python -m perf smoke                              everything at tiny sizes, one run each

Every command writes under ``--out`` (default ``perf/results``) and rewrites the report.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from perf.report import write_report
from perf.suite import log, run_suite, write_json

RESULTS = Path(__file__).parent / "results"


def _csv_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _positive(text: str) -> int:
    value = _csv_ints(text)
    if len(value) != 1:
        raise argparse.ArgumentTypeError(f"expected one whole number, got {text!r}")
    return value[0]


def _names(text: str) -> list[str]:
    return [s for s in text.split(",") if s]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m perf", description="batchsched's perf suite")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: perf/results)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="workloads, their sizes and schedulers")
    sub.add_parser("build", help="build (or find cached) the peer schedulers")
    s = sub.add_parser("sched", help="live runs of one workload at one size, every scheduler, A B A B")
    s.add_argument("workload", help="a name from perf/workloads/ or a YAML path")
    s.add_argument("--size", help="a size named in the workload, or NODESxPODS (default: its default_size)")
    s.add_argument("--runs", type=_positive, default=3, help="runs per scheduler (default 3)")
    s.add_argument("--schedulers", help="comma-separated subset of the workload's schedulers")
    s.add_argument("--no-ceiling", action="store_true", help="skip the bind ceiling (otherwise one per round)")
    s.add_argument("--ceiling-binds", type=_positive, help="binds per concurrency step (default: min(pods, 4000))")
    s.add_argument("--concurrency", type=_csv_ints, default=[64, 256],
                   help="each round's ceiling sweep, Bindings in flight (default 64,256)")
    s.add_argument("--timeout", type=float, help="seconds until every pod must be bound (default: the workload's)")
    s.add_argument("--ceiling-beside", action="store_true",
                   help="also measure each round's ceiling beside a neighbour using the CPU batchsched used "
                        "over its bind window in that round (a pod watch and a busy loop): the bound the machine sets "
                        "a scheduler of its size")
    s.add_argument("--profile", action="store_true",
                   help="one more batchsched run under cProfile after the measured ones (its top functions go in the report)")
    c = sub.add_parser("ceiling", help="the bind ceiling alone on a fresh control plane")
    c.add_argument("--nodes", type=_positive, default=500)
    c.add_argument("--binds", type=_positive, default=4000)
    c.add_argument("--concurrency", type=_csv_ints, default=[1, 16, 64, 256])
    c.add_argument("--neighbour-cpu", type=float, help="also beside a neighbour of this many cores (perf/neighbour.py)")
    c.add_argument("--events", action="store_true",
                   help="beside the neighbour, each Binding followed by the pod's Scheduled Event (same worker)")
    y = sub.add_parser("cycle", help="cycle and kernel benchmarks, no apiserver")
    y.add_argument("--quick", action="store_true", help="tiny sizes (seconds)")
    q = sub.add_parser("queues", help="cycle time with queues (50 queues, 10,000 pending groups, 5,000 nodes)")
    q.add_argument("rest", nargs=argparse.REMAINDER, help="options of perf/queuebench.py (--nodes, --groups, ...)")
    m = sub.add_parser("sim", help="card policies on the openb trace by the FGD method, against FGD's results")
    m.add_argument("--variant", action="append",
                   help="openb pod list (default: default, gpushare100, multigpu50, gpuspec33)")
    m.add_argument("--config", action="append", default=[],
                   help="also run this batchsched configuration file, as a row beside the policies "
                        "(repeatable; default: the shipped config/batchsched.yaml)")
    m.add_argument("--seeds", type=int, default=10)
    m.add_argument("--load", type=float, default=1.3)
    m.add_argument("--trace-dir", help="folder of the openb CSV files")
    m.add_argument("--replay-speedup", type=float, default=0.0,
                   help="also replay openb default at its own times with arrivals this many times sooner "
                        "and plot the wait-time CDF (0: no replay)")
    m.add_argument("--replay-limit", type=int, help="replay only the first N tasks")
    r = sub.add_parser("restart", help="SIGKILL each scheduler mid-run, start it again: time to ready and first bind")
    r.add_argument("--nodes", type=_positive, default=500, help="8-GPU nodes (default 500; issue 13: 5000)")
    r.add_argument("--gangs", type=int, default=10, help="gangs in the backlog (default 10; issue 13: 100)")
    r.add_argument("--gang-size", type=_positive, default=64, help="single-GPU pods per gang, quorum = size (default 64)")
    r.add_argument("--pods", type=int, default=2000, help="single pods in the backlog (default 2000; issue 13: 20000)")
    r.add_argument("--pod-gpus", type=_positive, default=2, help="GPUs per single pod (default 2: more is asked than exists)")
    r.add_argument("--kill-fraction", type=float, default=0.25, help="kill once this fraction of the pods is bound (default 0.25)")
    r.add_argument("--after", type=float, default=10.0, help="seconds of binds counted after the restart's first bind")
    r.add_argument("--runs", type=_positive, default=1, help="rounds, A B A B (default 1)")
    r.add_argument("--schedulers", default="batchsched,kube-scheduler-gang",
                   help="comma-separated (default batchsched,kube-scheduler-gang)")
    r.add_argument("--timeout", type=float, default=600.0, help="seconds allowed to reach the kill point, and to the first bind after the restart")
    f = sub.add_parser("failover", help="two replicas, the leader SIGKILLed or stopped: time to the standby's first bind")
    f.add_argument("--nodes", type=_positive, default=200, help="8-GPU nodes (default 200; issue 29: 5000)")
    f.add_argument("--pods", type=_positive, default=2000, help="single pods in the backlog (default 2000; issue 29: 20000)")
    f.add_argument("--pod-gpus", type=_positive, default=2, help="GPUs per single pod (default 2)")
    f.add_argument("--gangs", type=int, default=0, help="gangs of --gang-size one-GPU pods in the backlog (default 0)")
    f.add_argument("--gang-size", type=_positive, default=64, help="pods per gang, quorum = size (default 64)")
    f.add_argument("--kill-fraction", type=float, default=0.1,
                   help="stop the leader once it has bound this fraction of the pods (default 0.1)")
    f.add_argument("--modes", type=_names, default=["kill", "term"],
                   help="comma-separated: kill (SIGKILL), term (SIGTERM, the Lease released) (default both)")
    f.add_argument("--runs", type=_positive, default=1, help="runs of each mode, each on a fresh sandbox (default 1)")
    f.add_argument("--lease-duration", type=float, default=15.0,
                   help="leaseDurationSeconds (default 15, as config/batchsched.yaml)")
    f.add_argument("--renew-deadline", type=float, default=10.0, help="renewDeadlineSeconds (default 10)")
    f.add_argument("--retry-period", type=float, default=2.0, help="retryPeriodSeconds (default 2)")
    f.add_argument("--timeout", type=float, default=600.0,
                   help="seconds allowed to reach the stop, and from it to the standby's first bind")
    i = sub.add_parser("idle", help="scheduler CPU over a minute while gangs that can never fit wait")
    i.add_argument("--nodes", type=_positive, default=500, help="8-GPU nodes (default 500; issue 13: 5000)")
    i.add_argument("--free-nodes", type=int, default=4, help="nodes left empty; every other node is full (default 4)")
    i.add_argument("--gangs", type=_positive, default=100, help="waiting gangs (default 100)")
    i.add_argument("--gang-size", type=_positive, default=8, help="pods of 8 GPUs per gang, quorum = size (default 8)")
    i.add_argument("--variant", choices=["gangs", "pods"], default="gangs",
                   help="gangs, or the same pods without gangs (for schedulers that have none)")
    i.add_argument("--window", type=float, default=60.0, help="seconds measured with nothing changing (default 60)")
    i.add_argument("--settle", type=float, default=20.0, help="seconds from the scheduler's start to the window (default 20)")
    i.add_argument("--runs", type=_positive, default=1, help="rounds, A B A B (default 1)")
    i.add_argument("--schedulers", help="comma-separated (default: batchsched,kube-scheduler-gang for gangs, "
                                        "batchsched,kube-scheduler for pods)")
    b = sub.add_parser("sandbox", help="time N fake nodes to Ready and the control plane's CPU while idle")
    b.add_argument("--nodes", type=_csv_ints, default=[1000], help="node counts, comma-separated (default 1000)")
    b.add_argument("--idle", type=float, default=60.0, help="seconds idle after all are Ready (default 60)")
    b.add_argument("--sample", type=float, default=10.0, help="seconds between progress lines (default 10)")
    b.add_argument("--timeout", type=float, help="seconds allowed to reach all Ready (default: as the live runs)")
    k = sub.add_parser("soak", help="batchsched for a long time at a steady arrival rate: growth and stuck units")
    k.add_argument("--nodes", type=_positive, default=1000, help="8-GPU nodes (default 1000)")
    k.add_argument("--minutes", type=float, default=30.0, help="minutes of arrivals, then a drain (default 30)")
    k.add_argument("--rate", type=float, help="jobs per second (default: the rate that keeps about 85%% of the GPUs busy)")
    k.add_argument("--seed", type=int, default=0, help="seed of the arrivals and the job mix (default 0)")
    x = sub.add_parser("chaos", help="faults on a schedule under a gang workload: partial, twice, lost, quota, recovery")
    x.add_argument("--nodes", type=_positive, default=200, help="8-GPU nodes (default 200)")
    x.add_argument("--faults", type=_names, help="comma-separated fault names (default: all; see perf/chaos/)")
    x.add_argument("--out", dest="chaos_out", type=Path, help="folder of chaos.json and chaos.md (default: <--out>/chaos)")
    x.add_argument("--recover-timeout", type=float, default=180.0, help="seconds each fault may take to recover")
    w = sub.add_parser("world", help="randomised worlds through the session: safety and liveness checked each step")
    w.add_argument("--steps", type=_positive, default=2000, help="steps per world, one simulated second each")
    w.add_argument("--seeds", type=_positive, default=20, help="how many worlds (seeds from --first)")
    w.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    w.add_argument("--known", type=_names, default=[],
                   help="checks of known defects to turn on: never,held,restart,placed-evicted")
    w.add_argument("--features", type=_names, default=[],
                   help="world features to turn on, e.g. min_resources,never,holds,whole_job_restart")
    w.add_argument("--starvation", type=int, default=0, help="fail a head of a queue waiting more steps than this")
    sub.add_parser("report", help="rewrite the report from the results folder")
    sub.add_parser("smoke", help="every benchmark at tiny sizes, one run per scheduler; fails on any failure")
    return p


def cmd_list() -> int:
    from perf.peers import PEERS
    from perf.workload import available, load_workload

    for name in available():
        wl = load_workload(name)
        sizes = ", ".join(f"{k} ({v.nodes}x{v.pods})" for k, v in wl.sizes.items())
        print(f"{name}: {wl.description}\n  schedulers: {', '.join(wl.schedulers)}\n  sizes: {sizes}")
    print("schedulers:")
    for peer in PEERS.values():
        print(f"  {peer.name}: {peer.settings}")
    return 0


def cmd_build() -> int:
    from batchsched.sandbox import build

    t = time.monotonic()
    print("kube-scheduler:", build.kube_binaries()["kube-scheduler"])
    print(f"  ({time.monotonic() - t:.0f} s)")
    t = time.monotonic()
    try:
        print("scheduler-plugins:", build.scheduler_plugins_binary())
    except build.BuildError as exc:
        print(f"scheduler-plugins could not be built: {exc}", file=sys.stderr)
        return 1
    print(f"  ({time.monotonic() - t:.0f} s)")
    return 0


def cmd_ceiling(out: Path, nodes: int, binds: int, concurrency: list[int], neighbour_cpu: float | None,
                events: bool) -> int:
    from perf.ceiling import run_ceiling

    data = run_ceiling(nodes=nodes, binds=binds, concurrencies=concurrency, apiserver_args=[],
                       sandbox_name=f"perf-{os.getpid()}-ceiling", neighbour_cpu=neighbour_cpu, events=events)
    write_json(out / "ceiling" / f"{nodes}.json", data)
    log(f"ceiling on {nodes} nodes: {data['best']} binds/s"
        + (f"; beside {neighbour_cpu} cores: {data['best_beside']}" if neighbour_cpu else ""))
    return 0


def cmd_cycle(out: Path, quick: bool) -> int:
    from perf.cyclebench import run_all

    data = run_all(quick=quick, log=log)
    write_json(out / "cycle.json", data)
    return 0


def smoke(out: Path) -> dict[str, Path]:
    """Every benchmark at tiny sizes, strict: any failure raises. Returns the report files."""
    from batchsched.sandbox import build
    from perf.cyclebench import run_all

    run_suite(workload="plain-gpu", size="smoke", schedulers=["batchsched", "kube-scheduler"], runs=1, out=out,
              ceiling=True, ceiling_binds=100, concurrencies=[1, 16], strict=True, beside=True)
    gang_peers = ["batchsched", "kube-scheduler-gang"]
    if build.cached_scheduler_plugins_binary() is not None:
        gang_peers.append("coscheduling")
    else:
        log("smoke: coscheduling skipped: scheduler-plugins is not built (python -m perf build)")
    run_suite(workload="gang-8", size="smoke", schedulers=gang_peers, runs=1, out=out, ceiling=False, strict=True)
    # the same upstream PodGroups for both: preemption of whole gangs, gangs inside one rack
    for workload in ("gang-preempt", "gang-topology"):
        run_suite(workload=workload, size="smoke", schedulers=["batchsched", "kube-scheduler-gang"], runs=1,
                  out=out, ceiling=False, strict=True)
    # nvidia.com/gpu served by DRA devices: each scheduler makes the pods' claims; the
    # ceiling writes what a scheduler writes for them
    run_suite(workload="dra-gpu-extended", size="smoke", schedulers=["batchsched", "kube-scheduler"], runs=1,
              out=out, ceiling=True, ceiling_binds=100, concurrencies=[16], strict=True)
    from perf.idle import IdleSize, run_idle
    from perf.restart import RestartSize, run_restart

    # batchsched's first step places all that fits at once, and on a busy machine the watch
    # shows the kill point only after many more Bindings have left (at 320 GPUs, all of them
    # had): room for 2,000 pods leaves work for the restart however late the kill lands
    run_restart(size=RestartSize(nodes=250, gangs=2, gang_size=8, pods=2500, pod_gpus=1, kill_fraction=0.005,
                                 after=2.0, timeout=120.0),
                schedulers=["batchsched", "kube-scheduler-gang"], runs=1, out=out, log=log, strict=True)
    run_idle(size=IdleSize(nodes=12, free_nodes=4, gangs=5, gang_size=8, settle=5.0, window=5.0, sample=5.0),
             schedulers=["batchsched", "kube-scheduler-gang"], runs=1, out=out, log=log, strict=True)
    write_json(out / "cycle.json", run_all(quick=True, log=log))
    return write_report(out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out: Path = args.out
    if args.command == "list":
        return cmd_list()
    if args.command == "build":
        return cmd_build()
    if args.command == "smoke":
        written = smoke(out)
        log(f"report: {written['report.md']}")
        return 0
    if args.command == "sched":
        run_suite(
            workload=args.workload, size=args.size,
            schedulers=[s for s in args.schedulers.split(",") if s] if args.schedulers else None,
            runs=args.runs, out=out, ceiling=not args.no_ceiling, ceiling_binds=args.ceiling_binds,
            concurrencies=args.concurrency, timeout=args.timeout, profile=args.profile, beside=args.ceiling_beside,
        )
    elif args.command == "restart":
        from perf.restart import RestartSize, run_restart

        rsize = RestartSize(nodes=args.nodes, gangs=args.gangs, gang_size=args.gang_size, pods=args.pods,
                            pod_gpus=args.pod_gpus, kill_fraction=args.kill_fraction, after=args.after,
                            timeout=args.timeout)
        run_restart(size=rsize, schedulers=_names(args.schedulers), runs=args.runs, out=out, log=log)
    elif args.command == "failover":
        from perf.failover import FailoverSize, run_failover
        from perf.failover import table as failover_table

        fsize = FailoverSize(nodes=args.nodes, pods=args.pods, pod_gpus=args.pod_gpus, gangs=args.gangs,
                             gang_size=args.gang_size, kill_fraction=args.kill_fraction,
                             lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
                             retry_period=args.retry_period, timeout=args.timeout)
        try:
            fdata = run_failover(size=fsize, modes=args.modes, runs=args.runs, out=out, log=log)
        except ValueError as exc:
            print(f"python -m perf failover: error: {exc}", file=sys.stderr)
            return 1
        print("\n".join(failover_table(fdata)))
        return 0 if all(r["ok"] for r in fdata["runs"]) else 1
    elif args.command == "idle":
        from perf.idle import IdleSize, run_idle

        isize = IdleSize(nodes=args.nodes, free_nodes=args.free_nodes, gangs=args.gangs, gang_size=args.gang_size,
                         variant=args.variant, settle=args.settle, window=args.window)
        default = "batchsched,kube-scheduler-gang" if args.variant == "gangs" else "batchsched,kube-scheduler"
        run_idle(size=isize, schedulers=_names(args.schedulers or default), runs=args.runs, out=out, log=log)
    elif args.command == "sandbox":
        from perf.live import ready_timeout
        from perf.sandboxbench import run_one, table

        results = []
        for n in args.nodes:
            result = run_one(n, idle=args.idle, sample=args.sample, timeout=args.timeout or ready_timeout(n), log=log)
            write_json(out / "sandbox" / f"{n}.json", result)
            results.append(result)
        print("\n".join(table(results)))
    elif args.command == "soak":
        from perf.soak import SoakSize, run_soak, table

        data = run_soak(size=SoakSize(nodes=args.nodes, minutes=args.minutes, rate=args.rate, seed=args.seed),
                        out=out, log=log)
        print("\n".join(table(data)))
        for c in data["checks"]:
            print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']}: {c['value']} (bound {c['bound']}) {c['detail']}")
        log(f"soak: {out / 'soak' / (data['tag'] + '.md')}")
        return 0 if data["ok"] else 1
    elif args.command == "chaos":
        from perf.chaos.run import ChaosConfig
        from perf.chaos.run import run as chaos_run

        result = chaos_run(ChaosConfig(nodes=args.nodes, faults=args.faults, out=args.chaos_out or out / "chaos",
                                       recover_timeout=args.recover_timeout))
        print(result["table"])
        clean = all(not any(r["counts"].values()) and r["recovered_s"] is not None for r in result["rows"])
        return 0 if clean else 1
    elif args.command == "ceiling":
        cmd_ceiling(out, args.nodes, args.binds, args.concurrency, args.neighbour_cpu, args.events)
    elif args.command == "cycle":
        cmd_cycle(out, args.quick)
    elif args.command == "sim":
        from batchsched.config import ConfigError
        from perf.simbench import VARIANTS, run_waits
        from perf.simbench import run as sim_run

        try:
            shipped = Path(__file__).parents[1] / "config" / "batchsched.yaml"
            configs = args.config or ([str(shipped)] if shipped.exists() else [])
            paths = sim_run(out, args.variant or list(VARIANTS), args.seeds, args.load,
                            args.trace_dir, log=log, configs=configs) if args.seeds else []
        except (ConfigError, FileNotFoundError) as exc:
            print(f"python -m perf sim: error: {exc}", file=sys.stderr)
            return 1
        if args.replay_speedup:
            paths += run_waits(out, args.trace_dir, args.replay_speedup, args.replay_limit, log=log)
        for path in paths:
            log(f"wrote {path}")
        return 0
    elif args.command == "world":
        from perf.world import run as world_run

        return world_run(steps=args.steps, seeds=args.seeds, first=args.first, known=args.known,
                         features=args.features, starvation=args.starvation, log=log)
    elif args.command == "queues":
        from perf.queuebench import main as queues_main

        write_json(out / "queues.json", queues_main(args.rest))
        return 0
    written = write_report(out)
    log(f"report: {written['report.md']}")
    return 0
