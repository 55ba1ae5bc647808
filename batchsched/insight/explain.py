"""``batchsched explain``: one job or queue, in plain words, with the numbers.

:class:`Insight` is what the running scheduler keeps for its views: the start estimates
of the last forward run (made again when older than ``estimate_ttl`` seconds), and the
first estimate made for each job, so that when the job starts the estimate can be judged
(:meth:`Insight.started` returns the error to record).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchsched.core import explain
from batchsched.core.session import Session
from batchsched.insight.estimate import Estimate, Forward, estimate_starts, first_estimates
from batchsched.insight.views import Job, find_job, groups_named, jobs, node_rows, queue_rows

__all__ = ["Insight", "NotFound"]


class NotFound(LookupError):
    """The pod, PodGroup or Queue asked about is not one the scheduler holds."""


@dataclass(slots=True)
class StartError:
    """How far off the first estimate of a job's start was."""

    seconds: float
    relative: float


@dataclass
class Insight:
    """The views over one session, with cached estimates (single writer: the event loop)."""

    session: Session
    estimate_ttl: float = 30.0
    max_steps: int = 400
    use_jit: bool = True
    estimates: dict[str, Estimate] = field(default_factory=dict)
    estimated_at: float = -1e18
    #: job key -> (when the first estimate was made, the start it estimated)
    first: dict[str, tuple[float, float]] = field(default_factory=dict)

    # -- estimates --------------------------------------------------------------------------

    def forward(self, now: float, keep_going: Callable[[], bool] | None = None) -> Callable[[], dict[str, Estimate]]:
        """What a fresh estimate needs from the live session, taken now; the function it
        returns runs the copy forward (it may run in another thread: it touches only the
        copy)."""
        all_jobs = jobs(self.session, now)
        fwd = Forward(self.session, now, self.use_jit)  # the copy is made here, now

        def run() -> dict[str, Estimate]:
            return estimate_starts(self.session, all_jobs, now, max_steps=self.max_steps,
                                   use_jit=self.use_jit, prepared=fwd, keep_going=keep_going)

        return run

    def stale(self, now: float) -> bool:
        return now - self.estimated_at >= self.estimate_ttl

    def expire(self) -> None:
        """The next look makes a new estimate."""
        self.estimated_at = -1e18

    def keep(self, estimates: dict[str, Estimate], made_at: float) -> None:
        self.estimates = estimates
        self.estimated_at = made_at
        first_estimates(self.first, estimates, made_at)

    def refresh(self, now: float) -> None:
        """Estimate again here and now when the last estimates are stale."""
        if self.stale(now):
            self.keep(self.forward(now)(), now)

    def started(self, key: str, now: float) -> StartError | None:
        """A job started at ``now``: the error of its first estimate, if it had one."""
        made = self.first.pop(key, None)
        if made is None:
            return None
        made_at, start = made
        waited = max(now - made_at, 1.0)
        return StartError(seconds=now - start, relative=abs(now - start) / waited)

    def forget_gone(self, live: set[str]) -> None:
        self.first = {k: v for k, v in self.first.items() if k in live}

    # -- views --------------------------------------------------------------------------------

    def jobs(self, now: float, *, queue: str | None = None, namespace: str | None = None) -> dict[str, Any]:
        rows = [j.row(now, self.estimates.get(j.key)) for j in jobs(self.session, now)
                if (queue is None or j.queue == queue) and (namespace is None or j.namespace == namespace)]
        rows.sort(key=lambda r: (r["queue"] or "", r["state"] == "running", r["position"] or 0, r["key"]))
        return {"now": now, "estimatedAt": self.estimated_at, "jobs": rows}

    def queues(self, now: float) -> dict[str, Any]:
        return {"now": now, "queues": queue_rows(self.session, now, jobs(self.session, now))}

    def nodes(self, now: float) -> dict[str, Any]:
        return {"now": now, "nodes": node_rows(self.session)}

    def explain(self, now: float, *, kind: str, name: str, namespace: str = "", api: str = "") -> dict[str, Any]:
        """The explanation of a pod's job, a PodGroup's (of the API group ``api`` when
        given), or a Queue; raises :class:`NotFound`."""
        all_jobs = jobs(self.session, now)
        if kind == "queue":
            return self._queue(now, name, all_jobs)
        job = find_job(all_jobs, kind=kind, namespace=namespace, name=name, api=api)
        if job is None:
            raise NotFound(_not_found(all_jobs, kind=kind, namespace=namespace, name=name, api=api))
        # the same name in other APIs: said, with how to ask for one of them
        also = [j.api for j in groups_named(all_jobs, namespace=namespace, name=name)
                if j.api != job.api] if kind == "podgroup" else []
        by_key = {j.key: j for j in all_jobs}
        estimate = self.estimates.get(job.key)
        row = job.row(now, estimate)
        queue = None
        if job.queue is not None:
            queue = next((q for q in queue_rows(self.session, now, all_jobs) if q["name"] == job.queue), None)
        ahead = [by_key[k].row(now, self.estimates.get(k)) for k in job.ahead if k in by_key]
        pods = [{"name": p.name, "phase": p.phase, "node": p.node_name or None,
                 "message": (p.shows or ("", ""))[1]} for p in job.pods]
        return {
            "kind": job.kind, "api": job.api or None, "namespace": job.namespace, "name": job.name, "now": now,
            "estimatedAt": self.estimated_at, "job": row, "queue": queue, "ahead": ahead, "pods": pods,
            "alsoIn": also, "summary": summary(row, queue, ahead, also),
        }

    def _queue(self, now: float, name: str, all_jobs: list[Job]) -> dict[str, Any]:
        row = next((q for q in queue_rows(self.session, now, all_jobs) if q["name"] == name), None)
        if row is None:
            raise NotFound(f"queue {name} does not exist")
        mine = [j.row(now, self.estimates.get(j.key)) for j in all_jobs if j.queue == name]
        mine.sort(key=lambda r: (r["state"] == "running", r["position"] or 0, r["key"]))
        return {"kind": "Queue", "name": name, "now": now, "queue": row, "jobs": mine,
                "summary": queue_summary(row, mine)}


def _not_found(all_jobs: list[Job], *, kind: str, namespace: str, name: str, api: str) -> str:
    if kind == "podgroup" and api:
        others = [j.api for j in groups_named(all_jobs, namespace=namespace, name=name)]
        where = f" (there is one in {', '.join(others)})" if others else ""
        return f"there is no PodGroup {namespace}/{name} in {api} with a pod that waits or runs{where}"
    return f"{kind} {namespace}/{name} is not a pod of ours that waits or runs"


def _gpus(value: float) -> str:
    return f"{value:g}"


def _devices(devices: dict[str, int]) -> str:
    """`` and 4 devices of DeviceClass gpu.nvidia.com`` (DRA), or nothing."""
    if not devices:
        return ""
    return " and " + ", ".join(f"{n} device(s) of DeviceClass {c}" for c, n in sorted(devices.items()))


def summary(job: dict[str, Any], queue: dict[str, Any] | None, ahead: list[dict[str, Any]],
            also: Sequence[str] = ()) -> list[str]:
    """The lines ``batchsched explain`` prints for a job; ``also``: the other API groups
    holding a PodGroup of the same name in its namespace."""
    m = job["members"]
    lines = [
        f"{job['kind']} {job['namespace']}/{job['name']}: {job['stateText']}",
        *([f"  api: {job['api']}"] if job.get("api") else []),
        f"  members: {m['bound']} of {m['required']} required bound ({m['total']} in all), "
        f"asking {_gpus(job['gpus'])} GPU(s){_devices(job.get('devices') or {})}; priority {job['priority']}",
    ]
    if job["message"]:
        lines.append(f"  why: {job['message']}")
    for other in also:
        lines.append(f"  also a PodGroup {job['namespace']}/{job['name']} in {other}: "
                     f"batchsched explain podgroup {job['name']} -n {job['namespace']} --api {other}")
    if job["queue"]:
        q = f"  queue: {job['queue']}"
        if queue is not None:
            q += f" ({queue['state']}; {queue['pending']} waiting, {queue['admitted']} running"
            gpu = next((r for r in queue["resources"] if r["unit"] == "cards"), None)
            if gpu is not None and gpu["nominal"] is not None:
                q += (f"; GPUs used {_gpus(gpu['used'])} of nominal {_gpus(gpu['nominal'])}, "
                      f"borrowed {_gpus(gpu['borrowed'])}, lent {_gpus(gpu['lent'])}")
            q += ")"
        lines.append(q)
    if job["position"] is not None:
        lines.append("  position: " + explain.queue_position(job["position"], job["queueLength"], job["queue"]))
        for a in ahead[:5]:
            asks = f"{_gpus(a['gpus'])} GPU(s){_devices(a.get('devices') or {})}"
            lines.append(f"    ahead: {a['namespace']}/{a['name']} ({a['state']}, {asks}, priority {a['priority']})")
        if len(ahead) > 5:
            lines.append(f"    ... and {len(ahead) - 5} more ahead")
    e = job["estimate"]
    if job["state"] != "running":
        if e["start"] is not None:
            lines.append(f"  start: {explain.estimate_known(e['inSeconds'], '')} "
                         f"(confidence {e['confidence']}; {e['basis']})")
        else:
            lines.append(f"  start: {e['basis'] or explain.estimate_unknown('not estimated yet')}")
    return lines


def queue_summary(queue: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The lines ``batchsched explain queue`` prints."""
    lines = [f"Queue {queue['name']}: {queue['state']}" + (f" ({queue['message']})" if queue["message"] else "")]
    if queue["parent"]:
        lines.append(f"  cohort: {queue['parent']}; weight {queue['weight']}; fair share {queue['fairShare']}")
    for r in queue["resources"]:
        nominal = "unlimited" if r["nominal"] is None else _gpus(r["nominal"])
        line = (f"  {r['name']}: used {_gpus(r['used'])} of nominal {nominal}, "
                f"borrowed {_gpus(r['borrowed'])}, lent {_gpus(r['lent'])}")
        if r.get("unavailable"):
            line += f"; {_gpus(r['unavailable'])} withheld (nodes that failed GPU health checks)"
        lines.append(line)
    lines.append(f"  jobs: {queue['pending']} waiting, {queue['admitted']} running")
    for r in rows[:10]:
        when = ""
        if r["estimate"]["start"] is not None:
            when = f"; starts in about {explain.about(r['estimate']['inSeconds'])}"
        lines.append(f"    {r['namespace']}/{r['name']}: {r['state']}{when}")
    return lines
