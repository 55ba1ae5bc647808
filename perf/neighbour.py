"""A neighbour of the scheduler's size, for the Binding ceiling measured beside it.

The ceiling (:mod:`perf.ceiling`) is a bare client that only sends Bindings. A scheduler
shares the machine with the apiserver and etcd and does more: it watches every pod (each
Binding comes back as an event it decodes) and computes. On a 2-core machine that CPU is
taken from the apiserver. :class:`Neighbour` runs what any scheduler must beside the
ceiling's client, without scheduling anything:

- a watch of every pod in the cluster, each event decoded;
- in the same process, a busy loop that brings the process to ``cpu`` CPU seconds per
  second, the watch's own included (above one core, a pure busy loop per further core).

The ceiling beside it is the rate a scheduler of that CPU use could reach at best here.

Run alone (as :class:`Neighbour` starts it)::

    python -m perf.neighbour --kubeconfig PATH --cpu 0.6
    python -m perf.neighbour --cpu 1.0          # no watch: a busy loop alone
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import time
from types import TracebackType

SLICE_S = 0.01


def _behind(cpu: float, t0: float, c0: float) -> bool:
    """Whether the process has used less than ``cpu`` of the time since ``(t0, c0)``."""
    return time.process_time() - c0 < cpu * (time.perf_counter() - t0)


def _spin() -> None:
    x = 0
    for _ in range(2000):
        x = (x * 31 + 7) & 0xFFFF


def burn(cpu: float) -> None:
    """Use ``cpu`` CPU seconds per second (at most one core) until killed: busy while
    behind that share of the time since the start, asleep for a slice when ahead (so a
    loaded machine does not make it use less than asked, as long as the CPU is there)."""
    cpu = min(max(cpu, 0.0), 1.0)
    t0, c0 = time.perf_counter(), time.process_time()
    while True:
        if _behind(cpu, t0, c0):
            _spin()
        else:
            time.sleep(SLICE_S * (1.0 - cpu) + 0.001)


async def watch_and_burn(kubeconfig: str, cpu: float) -> None:
    """The watch of every pod, and a busy loop between its events that brings the whole
    process to ``cpu`` CPU seconds per second."""
    cpu = min(max(cpu, 0.0), 1.0)
    watcher = asyncio.create_task(watch(kubeconfig))
    t0, c0 = time.perf_counter(), time.process_time()
    while not watcher.done():
        if _behind(cpu, t0, c0):
            _spin()
            await asyncio.sleep(0)  # the watch's events in between
        else:
            await asyncio.sleep(SLICE_S * (1.0 - cpu) + 0.001)
    watcher.result()


async def watch(kubeconfig: str) -> None:
    """List every pod, then watch them from the list's resourceVersion, decoding each event."""
class Neighbour:
    """``with Neighbour(kubeconfig, cpu):`` the watch and the busy loops run inside."""

    def __init__(self, kubeconfig: str, cpu: float) -> None:
        self.kubeconfig = kubeconfig
        self.cpu = cpu
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Neighbour:
        cmd = [sys.executable, "-m", "perf.neighbour", "--cpu"]
        first = min(self.cpu, 1.0)
        self.procs.append(subprocess.Popen([*cmd, f"{first:.3f}", "--kubeconfig", self.kubeconfig],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        left = self.cpu - first
        while left > 0:
            share = min(left, 1.0)
            left -= share
            self.procs.append(subprocess.Popen([*cmd, f"{share:.3f}"],
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
    ap.add_argument("--cpu", type=float, required=True, help="CPU seconds per second (at most 1 per process)")
    ap.add_argument("--kubeconfig", default="", help="watch every pod of this cluster too")
    args = ap.parse_args(argv)
    if args.kubeconfig:
        asyncio.run(watch_and_burn(args.kubeconfig, args.cpu))
    else:
        burn(args.cpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
