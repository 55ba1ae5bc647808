"""CPU seconds and memory of a process, read from ``/proc`` (Linux only).

``cpu_seconds`` is user + system time of the whole process (every thread) since it
started; ``peak_rss`` is the kernel's high-water mark of its resident set (``VmHWM``), so a
single reading at the end of a run gives the peak over the run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is state (field 3); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / _TICK


def _status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss(pid: int) -> int | None:
    """Bytes: the peak resident set size so far."""
    kib = _status_kib(pid, "VmHWM")
    return None if kib is None else kib * 1024


def rss(pid: int) -> int | None:
    """Bytes: the resident set size now."""
    kib = _status_kib(pid, "VmRSS")
    return None if kib is None else kib * 1024


@dataclass(slots=True)
class Usage:
    """What one process used over a window: CPU seconds, CPU share of the window, peak RSS."""

    cpu_seconds: float | None
    cpu_percent: float | None
    peak_rss_bytes: int | None
    #: CPU seconds since the process started (startup included)
    cpu_seconds_total: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Window:
    """CPU of a process over a window: ``Window(pid)`` at the start, ``.end()`` at the end."""

    def __init__(self, pid: int, *, start_cpu: float | None = None, started: float) -> None:
        self.pid = pid
        self.start_cpu = cpu_seconds(pid) if start_cpu is None else start_cpu
        self.started = started

    def end(self, now: float) -> Usage:
        cpu = cpu_seconds(self.pid)
        used = None if cpu is None or self.start_cpu is None else cpu - self.start_cpu
        wall = now - self.started
        return Usage(
            cpu_seconds=used,
            cpu_percent=None if used is None or wall <= 0 else 100.0 * used / wall,
            peak_rss_bytes=peak_rss(self.pid),
            cpu_seconds_total=cpu,
        )
