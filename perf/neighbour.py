"""A neighbour of the scheduler's size, for the Binding ceiling measured beside it.

The ceiling (:mod:`perf.ceiling`) is a bare client that only sends Bindings. A scheduler
shares the machine with the apiserver and etcd and does more: it watches every pod (each
Binding comes back as an event it decodes) and computes. On a 2-core machine that CPU is
taken from the apiserver. :class:`Neighbour` runs what any scheduler must beside the
ceiling's client, without scheduling anything:

- a watch of every pod in the cluster, each event decoded (``watch``);
- a busy loop using ``cpu`` CPU seconds per second (``burn``; above 1, one loop per
  whole core and one for the rest).

The ceiling beside it is the rate a scheduler of that CPU use could reach at best here.

Run alone (as :class:`Neighbour` starts it)::

    python -m perf.neighbour watch --kubeconfig PATH
    python -m perf.neighbour burn --cpu 0.6
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from types import TracebackType

SLICE_S = 0.01


def burn(cpu: float) -> None:
    """Use ``cpu`` CPU seconds per second (at most one core), until killed: busy while
    behind that share of the time since the start, asleep for a slice when ahead (so a
    loaded machine does not make it use less than asked, as long as the CPU is there)."""
    cpu = min(max(cpu, 0.0), 1.0)
    t0, c0 = time.perf_counter(), time.process_time()
    x = 0
    while True:
        if time.process_time() - c0 < cpu * (time.perf_counter() - t0):
            for _ in range(2000):
                x = (x * 31 + 7) & 0xFFFF
        else:
            time.sleep(SLICE_S * (1.0 - cpu) + 0.001)


async def watch(kubeconfig: str) -> None:
    """List every pod, then watch them from the list's resourceVersion, decoding each event."""
    from batchsched.kube.client import KubeClient
    from batchsched.kube.errors import KubeError

    client = await KubeClient.connect(kubeconfig)
    try:
        rv = ""
        while True:
            try:
                if not rv:
                    _, rv = await client.list("/api/v1/pods")
                async for _, obj in client.watch("/api/v1/pods", rv, timeout_seconds=300):
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            except KubeError:
                rv = ""  # expired or cut: list again, as a scheduler's reflector does
                await asyncio.sleep(0.2)
    finally:
        await client.close()


class Neighbour:
    """``with Neighbour(kubeconfig, cpu):`` the watch and the busy loops run inside."""

    def __init__(self, kubeconfig: str, cpu: float) -> None:
        self.kubeconfig = kubeconfig
        self.cpu = cpu
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Neighbour:
        cmd = [sys.executable, "-m", "perf.neighbour"]
        self.procs.append(subprocess.Popen([*cmd, "watch", "--kubeconfig", self.kubeconfig],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        left = self.cpu
        for _ in range(math.ceil(self.cpu)):
            share = min(left, 1.0)
            left -= share
            self.procs.append(subprocess.Popen([*cmd, "burn", "--cpu", f"{share:.3f}"],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # the watch listed and watching, the loops running
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        self.procs.clear()

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.neighbour", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    w = sub.add_parser("watch")
    w.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    b = sub.add_parser("burn")
    b.add_argument("--cpu", type=float, required=True)
    args = ap.parse_args(argv)
    if args.what == "burn":
        burn(args.cpu)
    else:
        asyncio.run(watch(args.kubeconfig))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
