"""The ``batchsched`` command: run the scheduler, the local sandbox, the demo, and the views
of a running scheduler (``explain``, ``jobs``, ``queues``, ``dashboard``).

Every error a person can cause (a bad flag, a bad value, a busy port, a bad config file)
ends as one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


def build_parser() -> argparse.ArgumentParser:
    from batchsched.core.devices import POLICIES

    parser = _Parser(prog="batchsched", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run the scheduler")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    run.add_argument("--config", help="batchsched configuration file (YAML)")

    sandbox = sub.add_parser("sandbox", help="a local control plane with fake GPU nodes")
    sb = sandbox.add_subparsers(dest="action", required=True, parser_class=_Parser)
    up = sb.add_parser("up", help="start it and print the kubeconfig path")
    up.add_argument("--name", default="default", help="sandbox name (default: default)")
    up.add_argument("--nodes", type=_positive, default=8, help="number of fake GPU nodes")
    up.add_argument("--gpus-per-node", type=_non_negative, default=8)
    up.add_argument("--cpu", default="96", help="CPU per node (a quantity)")
    up.add_argument("--memory", default="1024Gi", help="memory per node (a quantity)")
    up.add_argument("--gpu-model", default="A100", help="value of the nvidia.com/gpu.product label")
    up.add_argument("--max-pods", type=_positive, default=110)
    up.add_argument("--nodes-per-rack", type=_positive, default=8)
    up.add_argument("--racks-per-block", type=_positive, default=4)
    up.add_argument("--port", type=_port, help="apiserver port on 127.0.0.1 (default: a free one)")
    sb.add_parser("build", help="build (or find in the cache) the control-plane binaries")
    kueue = sb.add_parser("kueue", help="run Kueue (built from its pinned Go module) against the running "
                                        "sandbox until interrupted")
    kueue.add_argument("--name", default="default", help="sandbox name (default: default)")
    for name in ("status", "down"):
        p = sb.add_parser(name, help=f"{name} of the sandbox")
        p.add_argument("--name", default="default")

    from batchsched.simulate.cli import add_parser as add_simulate

    add_simulate(sub)
    snap = sub.add_parser("snapshot", help="save what the scheduler reads from a cluster, for batchsched simulate")
    snap.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    snap.add_argument("--config", help="the batchsched configuration to record with it (YAML)")
    snap.add_argument("-o", "--output", required=True, help="file to write (JSON)")

    from batchsched.viewcli import add_parsers as add_views

    add_views(sub)

    demo = sub.add_parser("demo", help="bring up a sandbox, schedule a workload mix, print placements")
    demo.add_argument("--nodes", type=_positive, default=24)
    demo.add_argument("--keep", action="store_true", help="leave the sandbox running afterwards")
    demo.add_argument("--card-policy", choices=POLICIES,
                      help="where GPU cards and shares go (gpuSharing.policy; default: fragmentation)")
    demo.add_argument("--compare-card-policies", action="store_true",
                      help="only the trace's first wave, once per card policy, and the GPU allocation each reaches")
    return parser


def _sandbox(args: argparse.Namespace) -> int:
    from batchsched.core.quantity import QuantityError, parse_quantity

    if args.action == "build":
        from batchsched.sandbox.build import BuildError, ensure_binaries

        try:
            bins = ensure_binaries()
        except BuildError as exc:
            print(f"batchsched: error: {exc}", file=sys.stderr)
            return 1
        for field in dataclasses.fields(bins):
            print(f"{field.name}: {getattr(bins, field.name)}")
        return 0
    # the running sandbox makes its TLS material (cryptography)
    from batchsched.sandbox.cluster import Sandbox, SandboxError
    from batchsched.sandbox.nodes import NodeShape

    try:
        box = Sandbox(args.name)
        if args.action == "up":
            for flag, value in (("--cpu", args.cpu), ("--memory", args.memory)):
                try:
                    if parse_quantity(value) <= 0:
                        raise QuantityError(value)
                except QuantityError:
                    raise SandboxError(f"{flag} {value!r} is not a positive quantity") from None
            shape = NodeShape(
                count=args.nodes, cpu=args.cpu, memory=args.memory, gpus=args.gpus_per_node,
                gpu_model=args.gpu_model, max_pods=args.max_pods,
                nodes_per_rack=args.nodes_per_rack, racks_per_block=args.racks_per_block,
            )
            state = box.up([shape], apiserver_port=args.port)
            print(state.kubeconfig)
        elif args.action == "kueue":
            return _sandbox_kueue(box)
        elif args.action == "status":
            status = box.status()
            print(json.dumps(status, indent=2))
            return 0 if status.get("running") else 3
        else:
            if not box.down():
                print(f"sandbox {args.name!r} was not running", file=sys.stderr)
    except (SandboxError, ValueError, TimeoutError) as exc:
        print(f"batchsched: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _sandbox_kueue(box: Any) -> int:
    """Kueue against the running sandbox ``box``, in the foreground until Ctrl-C or SIGTERM."""
    import signal
    import threading

    from batchsched.sandbox.cluster import SandboxError
    from batchsched.sandbox.kueue import NAMESPACE_LABEL, Kueue

    state = box.state()
    if state is None or not box.running():
        raise SandboxError(f"sandbox {box.name!r} is not running; `batchsched sandbox up` first")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too where a shell ignores it in background jobs
        signal.signal(sig, lambda *_: stop.set())
    with Kueue(state) as runner:
        print(f"Kueue is running (log: {runner.log}); its webhooks and integrations (batch/job, pod) "
              f"answer in namespaces labelled {NAMESPACE_LABEL}. Ctrl-C stops it.", flush=True)
        stop.wait()
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    import asyncio

    import orjson

    from batchsched.config import ConfigError, load_config
    from batchsched.kube.client import KubeClient
    from batchsched.kube.errors import KubeError
    from batchsched.kube.snapshot import take_snapshot

    async def take() -> dict[str, object]:
        client = await KubeClient.connect(args.kubeconfig)
        try:
            return await take_snapshot(client, load_config(args.config).document())
        finally:
            await client.close()

    try:
        data = asyncio.run(take())
    except (ConfigError, KubeError, OSError) as exc:
        print(f"batchsched: error: {exc}", file=sys.stderr)
        return 1
    with open(args.output, "wb") as f:
        f.write(orjson.dumps(data))
    counts = ", ".join(f"{len(v)} {k}" for k, v in data["objects"].items() if v)  # type: ignore[attr-defined]
    print(f"wrote {args.output}: {counts}")
    return 0


def kubectl_main() -> int:
    """``kubectl batchsched ...``: kubectl runs the executable ``kubectl-batchsched`` on PATH
    with the words after ``batchsched``."""
    parser = build_parser()
    parser.prog = "kubectl batchsched"
    return main(sys.argv[1:], parser=parser)


#: modules of the optional extras, and the extra that brings each
EXTRAS = {"matplotlib": "perf"}


def main(argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    args = (parser or build_parser()).parse_args(argv)
    try:
        return _dispatch(args)
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root not in EXTRAS:
            raise
        extra = EXTRAS[root]
        print(f"batchsched: error: `batchsched {args.command}` needs the {extra} extra ({root} is not "
              f"installed): pip install 'batchsched[{extra}]'", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "sandbox":
        return _sandbox(args)
    if args.command == "run":
        from batchsched.app import run_from_cli

        return run_from_cli(kubeconfig=args.kubeconfig, config_path=args.config)
    if args.command == "snapshot":
        return _snapshot(args)
    if args.command == "simulate":
        from batchsched.simulate.cli import main as simulate_main

        return simulate_main(args)
    if args.command in ("explain", "jobs", "queues", "dashboard"):
        from batchsched.viewcli import main as view_main

        return view_main(args)
    if args.command == "demo":
        from batchsched.demo import main as demo_main

        return demo_main(nodes=args.nodes, keep=args.keep, card_policy=args.card_policy,
                         compare=args.compare_card_policies)
    return 2


if __name__ == "__main__":
    sys.exit(main())
