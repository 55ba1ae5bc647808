"""Time replay: tasks arrive at their creation time and run for as long as they ran.

Events on a virtual clock: a task's pod is created at ``created``; once bound it runs for
``deleted - created`` of the trace (its duration there), then succeeds and frees its node.
The session is stepped after every batch of events at one instant, and again every
``retry`` seconds while pods wait (as the live scheduler retries them). Reported: cluster
GPU allocation over time, and wait (arrival to binding) and completion (arrival to end)
time percentiles, overall and per kind of task.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from batchsched.core.settings import SessionSettings
from batchsched.simulate.engine import Simulation
from batchsched.simulate.fragmentation import method_settings, with_policy
from batchsched.simulate.openb import Task, TraceNode

ARRIVE, FINISH = 0, 1


@dataclass(slots=True)
class Replay:
    policy: str
    #: (time, % of cluster card compute allocated), after each instant with events
    allocation: list[tuple[float, float]] = field(default_factory=list)
    waits: dict[str, list[float]] = field(default_factory=dict)
    completions: dict[str, list[float]] = field(default_factory=dict)
    never_placed: int = 0

    def percentiles(self, which: str = "waits") -> dict[str, dict[str, float]]:
        data = getattr(self, which)
        out = {}
        for kind, values in sorted(data.items()):
            if len(values) >= 2:
                q = statistics.quantiles(values, n=100, method="inclusive")
                out[kind] = {"p50": q[49], "p90": q[89], "p99": q[98], "n": float(len(values))}
        return out

    def peak_allocation(self) -> float:
        return max((a for _, a in self.allocation), default=0.0)

    def mean_allocation(self) -> float:
        """Time-weighted mean allocation % over the replay."""
        if len(self.allocation) < 2:
            return self.allocation[0][1] if self.allocation else 0.0
        area = 0.0
        for (t0, a0), (t1, _) in zip(self.allocation, self.allocation[1:], strict=False):
            area += a0 * (t1 - t0)
        span = self.allocation[-1][0] - self.allocation[0][0]
        return area / span if span > 0 else self.allocation[-1][1]


def kind_of(t: Task) -> str:
    if t.num_gpu == 0:
        return "cpu"
    if t.shared:
        return "share"
    return f"{t.num_gpu}gpu"


def run(nodes: Sequence[TraceNode], tasks: Sequence[Task], *, policy: str, scope: str = "sharing",
        settings: SessionSettings | None = None, retry: float = 30.0, limit: int | None = None,
        arrival_speedup: float = 1.0, progress: Callable[[int, int], None] | None = None) -> Replay:
    """Replay ``tasks`` (the first ``limit`` by creation time) under ``policy`` and ``scope``
    in ``settings`` (default: the default configuration).
    ``arrival_speedup``: tasks arrive that many times sooner (their durations unchanged),
    to load the cluster more than the trace did."""
    sim = Simulation(method_settings(with_policy(settings or SessionSettings(), policy, scope)))
    sim.add_nodes(n.manifest() for n in nodes)
    capacity = sum(n.gpus for n in nodes) * 1000
    order = sorted(tasks, key=lambda t: (t.created, t.name))[:limit]
    events: list[tuple[float, int, int]] = [(t.created / arrival_speedup, ARRIVE, i) for i, t in enumerate(order)]
    heapq.heapify(events)
    arrived: dict[str, tuple[float, Task]] = {}
    out = Replay(policy)
    allocated = 0
    done = 0
    next_retry = float("inf")
    while events or (arrived and next_retry < float("inf")):
        now = events[0][0] if events else next_retry
        if next_retry < now:
            now = next_retry
        while events and events[0][0] <= now:
            _, what, i = heapq.heappop(events)
            t = order[i]
            uid = f"{t.name}-{i}"
            if what == ARRIVE:
                sim.add_pod(t.manifest(uid, created=now))
                arrived[uid] = (now, t)
            else:
                sim.finish_pod(uid)
                allocated -= t.gpu_request
                done += 1
        sim.step(now)
        placed_now = [u for u in arrived if u in sim.placed]
        for uid in placed_now:
            start, t = arrived.pop(uid)
            out.waits.setdefault(kind_of(t), []).append(now - start)
            duration = max(t.deleted - t.created, 1.0)
            out.completions.setdefault(kind_of(t), []).append(now - start + duration)
            allocated += t.gpu_request
            heapq.heappush(events, (now + duration, FINISH, int(uid.rsplit("-", 1)[1])))
        out.allocation.append((now, 100 * allocated / capacity))
        if not events and not placed_now:
            break  # nothing will end and nothing more fits: the rest never will
        next_retry = now + retry if arrived else float("inf")
        if progress is not None:
            progress(done, len(order))
    out.never_placed = len(arrived)
    return out
