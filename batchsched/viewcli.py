"""``batchsched explain``, ``jobs``, ``queues`` and ``dashboard``: the views of the running
scheduler, read with the caller's kubeconfig (also as ``kubectl batchsched ...``, through
the kubectl plugin executable ``kubectl-batchsched`` the package installs)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchsched.kube.viewclient import ViewsServer

#: the PodGroup API groups, in the order ``explain podgroup`` picks one when several hold a name
_APIS = ("scheduling.k8s.io", "scheduling.volcano.sh", "scheduling.x-k8s.io", "kueue.x-k8s.io")
_KINDS = {"pod": "pod", "pods": "pod", "po": "pod", "podgroup": "podgroup", "podgroups": "podgroup",
          "pg": "podgroup", "job": "podgroup", "queue": "queue", "queues": "queue", "bq": "queue"}


def add_parsers(sub: Any) -> None:
    # the Lease is looked for where the configuration file puts it by default
    from batchsched.config import LeaderElectionSection

    lease = LeaderElectionSection()

    def common(p: argparse.ArgumentParser, *, output: bool = True) -> None:
        p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
        p.add_argument("--server", help="the scheduler's views address, https://host:port (default: read from "
                                        "the leader's Lease)")
        p.add_argument("--ca-file", help="the CA (PEM) that verifies the views' certificate (default: read from "
                                         "the leader's Lease, where the scheduler publishes it)")
        p.add_argument("--tls-server-name", help="the name the views' certificate must hold, when it is not "
                                                 "the host of the address (default: the Lease's, if any)")
        p.add_argument("--lease-namespace", default=lease.namespace,
                       help=f"namespace of the scheduler's Lease, its leaderElection.namespace (default: {lease.namespace})")
        p.add_argument("--lease-name", default=lease.lease_name,
                       help=f"name of the scheduler's Lease, its leaderElection.leaseName (default: {lease.lease_name})")
        if output:
            p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")

    ex = sub.add_parser("explain", help="why a pod, job (PodGroup) or queue waits, and when it should start")
    ex.add_argument("kind", help="pod, podgroup (pg, job) or queue; podgroup.API (podgroup.scheduling.k8s.io) "
                                 "names a PodGroup's API, as --api does")
    ex.add_argument("name")
    ex.add_argument("-n", "--namespace", default="default")
    ex.add_argument("--api", help="the PodGroup's API group when the namespace holds the name in several: "
                                  f"{', '.join(_APIS)} (default: the first of these that has it)")
    common(ex)
    jobs = sub.add_parser("jobs", help="jobs (gangs and pods) with their state, wait and estimated start")
    jobs.add_argument("-q", "--queue")
    jobs.add_argument("-n", "--namespace")
    jobs.add_argument("-A", "--all-namespaces", action="store_true", help="(the default without -n)")
    common(jobs)
    queues = sub.add_parser("queues", help="queues with quota, usage, borrowing, waiting work")
    common(queues)
    dash = sub.add_parser("dashboard", help="serve the web view on 127.0.0.1 with your credentials")
    dash.add_argument("--port", type=int, default=8001, help="local port (0: any free one; default 8001)")
    common(dash, output=False)


def _print(body: Any, output: str, text: str) -> None:
    if output == "json":
        import json

        print(json.dumps(body, indent=2, sort_keys=True))
    elif output == "yaml":
        import yaml

        print(yaml.safe_dump(body, sort_keys=True), end="")
    else:
        print(text)


async def _server(args: argparse.Namespace) -> tuple[Any, ViewsServer]:
    from batchsched.kube.viewclient import credentials, find_server

    creds = await credentials(args.kubeconfig)
    server = await find_server(creds, namespace=args.lease_namespace, lease=args.lease_name,
                               server=args.server, ca_file=args.ca_file, server_name=args.tls_server_name)
    return creds, server


async def _view(args: argparse.Namespace) -> int:
    from batchsched.insight.tables import jobs_table, queues_table
    from batchsched.kube.viewclient import read_view

    creds, server = await _server(args)
    if args.command == "explain":
        word, _, api = args.kind.lower().partition(".")
        kind = _KINDS.get(word)
        if kind is None or (api and kind != "podgroup"):
            print(f"batchsched: error: cannot explain a {args.kind!r}: give pod, podgroup or queue", file=sys.stderr)
            return 2
        api = args.api or api
        if api and api not in _APIS:
            print(f"batchsched: error: unknown PodGroup API {api!r}: give one of {', '.join(_APIS)}", file=sys.stderr)
            return 2
        params = {"kind": kind, "name": args.name, "namespace": args.namespace, **({"api": api} if api else {})}
        body = await read_view(creds, server, "/debug/explain", params)
        _print(body, args.output, "\n".join(body.get("summary") or []))
    elif args.command == "jobs":
        params = {k: v for k, v in (("queue", args.queue), ("namespace", args.namespace)) if v}
        body = await read_view(creds, server, "/debug/jobs", params)
        _print(body, args.output, jobs_table(body["jobs"], namespaces=not args.namespace))
    else:
        body = await read_view(creds, server, "/debug/queues")
        _print(body, args.output, queues_table(body["queues"]))
    return 0


async def _dashboard(args: argparse.Namespace) -> int:
    from batchsched.kube.viewclient import serve_proxy

    creds, server = await _server(args)
    runner, port = await serve_proxy(creds, server, port=args.port)
    print(f"http://127.0.0.1:{port}/ui/", flush=True)
    print(f"serving the views of {server.address} with your credentials; Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
    return 0


def main(args: argparse.Namespace) -> int:
    from batchsched.kube.viewclient import ViewError

    try:
        return asyncio.run(_dashboard(args) if args.command == "dashboard" else _view(args))
    except ViewError as exc:
        print(f"batchsched: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"batchsched: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
