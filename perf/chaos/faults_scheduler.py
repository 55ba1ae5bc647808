"""Faults of the scheduler process itself: killed in the middle of its own writes, or
paused or cut off while it leads and still believes it does.

Each fault acts on a :class:`~perf.chaos.world.World` whose replicas already run, finds
the one holding the Lease, brings about the moment it is aimed at by submitting work of
its own, and watches for that moment through the harness's recorder (never batchsched's
logs):

- **SIGKILL mid-gang**: a gang's Bindings are being sent (some members bound, not all);
  the leader is killed and started again. The gang must end whole.
- **SIGKILL mid-preemption**: a high-priority gang preempts one of two low-priority
  gangs whose pods stay terminating a while (``batchsched.io/sim-hold``); the leader is
  killed when the first victim is being deleted and the preemptor is not yet bound, and
  started again while the victims still terminate. The preemptor must be bound whole, no
  other gang evicted, and the victims' gang not left partial.
- **SIGKILL mid-status-write**: a backlog that cannot fit is being told why (pod
  conditions, Events, PodGroup status); the leader is killed part way and started again.
  Every waiting pod must still end with a condition saying why, and a status the pod
  already shows must not be written again.
- **leader paused**: SIGSTOP at the first bind of a burst, held past the lease's
  duration, then SIGCONT: nothing it had queued may land after its renew deadline.
- **leader partitioned**: the leader talks through the fault proxy, which is cut at the
  first bind of a burst: its lease lapses while it still thinks it leads, it must stop
  writing at its renew deadline, before another replica takes over, and nothing it sent
  may land after the heal.

A kill can only land in the middle of a step as fast as the harness sees it: with the
default budgets (128 Bindings, 16 status writes in flight) a small gang is bound within a
few milliseconds, so the CI tests run their replicas with small budgets, and every fault
says in its ``detail`` what it actually hit ("killed after 3 of 16 members bound").

Each fault is a coroutine returning what it saw (for the tests' assertions) and is also
wrapped as a :class:`~perf.chaos.world.Fault` for the runner (:data:`FAULTS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from batchsched.kube.binder import BOUND_BY
from batchsched.kube.errors import NotFoundError
from batchsched.kube.leader import parse_time
from perf.chaos.checks import PodRecord
from perf.chaos.world import LEASE_NAME, LEASES, Fault, Injected, Job, World, WorldError

__all__ = [
    "FAULTS",
    "HOLD",
    "Backlog",
    "Cut",
    "MidGang",
    "MidPreemption",
    "Paused",
    "bound_by",
    "kill_mid_gang",
    "kill_mid_preemption",
    "kill_mid_status_write",
    "partition_leader",
    "pause_leader",
    "scheduled_at",
]

#: kwok keeps a pod with this annotation terminating until the annotation is removed
HOLD = "batchsched.io/sim-hold"

#: how often the harness looks at its recorder while it waits for a moment to strike
_LOOK = 0.005


# -- reading the recorder -----------------------------------------------------------------


def bound_by(rec: PodRecord) -> str:
    """The replica whose Binding bound the pod, as the apiserver copied it onto the pod."""
    return str(((rec.obj.get("metadata") or {}).get("annotations") or {}).get(BOUND_BY, ""))


def scheduled_at(rec: PodRecord) -> float | None:
    """When the apiserver bound the pod: its ``PodScheduled=True`` condition's
    ``lastTransitionTime``, written by the apiserver at the Binding (whole seconds)."""
    for c in (rec.obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return parse_time(c.get("lastTransitionTime"))
    return None


def _records(world: World, pods: Collection[str]) -> dict[str, PodRecord]:
    """The latest record of each of ``pods`` by name (the live one when a name was reused)."""
    wanted = set(pods)
    out: dict[str, PodRecord] = {}
    with world.recorder.locked() as m:
        for rec in m.pods.values():
            if rec.name in wanted and (rec.name not in out or rec.gone is None):
                out[rec.name] = rec
    return out


async def _until(check: Callable[[], Any], *, timeout: float, what: str, every: float = _LOOK) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WorldError(f"{what}: not seen within {timeout:.0f} s")
        await asyncio.sleep(every)


def _bound(world: World, pods: Collection[str]) -> list[str]:
    now = world.recorder.bound_now()
    return [p for p in pods if p in now]


async def _in_thread(call: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, call, *args)


async def leader(world: World, *, timeout: float = 60.0) -> str:
    """The replica that holds the Lease (waiting until one does)."""
    name: str | None = None
    deadline = time.monotonic() + timeout
    while name is None:
        name = await _in_thread(world.schedulers.leader)
        if name is None:
            if time.monotonic() > deadline:
                raise WorldError(f"no replica took the lease within {timeout:.0f} s")
            await asyncio.sleep(0.1)
    return name


async def lease(world: World) -> dict[str, Any]:
    """The Lease's spec as the apiserver holds it now."""
    obj = await world.kube.get(f"{LEASES}/namespaces/{world.namespace}/leases/{LEASE_NAME}")
    return dict(obj.get("spec") or {})


async def _restart(world: World, name: str) -> float:
    await _in_thread(world.schedulers.start, name)
    return time.time()


def _hold(world: World, name: str) -> None:
    """The harness stops ``name`` itself: the world's supervisor must not start it again."""
    world.schedulers.replicas[name].held = True


async def _wait_exit(world: World, name: str, timeout: float) -> int | None:
    """The replica's exit code, once it has exited on its own (None if it did not in time)."""
    proc = world.schedulers.replicas[name].proc
    if proc is None:
        return None
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.1)
    return proc.returncode


# -- SIGKILL mid-gang -------------------------------------------------------------------------


@dataclass(slots=True)
class MidGang:
    job: Job
    leader: str
    #: members the harness saw bound when it killed the leader, and once what was already
    #: in flight had landed (half a second later)
    bound_at_kill: int
    bound_after_kill: int
    injected: Injected


async def kill_mid_gang(world: World, *, members: int = 16, gpu: int = 1, queue: str | None = None,
                        timeout: float = 60.0) -> MidGang:
    """Kill the leader while a gang of ``members`` is being bound; start it again."""
    name = await leader(world)
    job = await world.submit(members=members, gpu=gpu, queue=queue)
    bound = await _until(lambda: _bound(world, job.pods), timeout=timeout, what=f"a member of {job.name} bound")
    at = time.time()
    world.schedulers.kill(name, signal.SIGKILL)
    await asyncio.sleep(0.5)
    after = len(_bound(world, job.pods))
    healed = await _restart(world, name)
    return MidGang(job=job, leader=name, bound_at_kill=len(bound), bound_after_kill=after, injected=Injected(
        at=at, healed_at=healed,
        detail=f"{name} killed with {len(bound)} of {members} members of {job.name} bound ({after} after)",
    ))


# -- SIGKILL mid-preemption -------------------------------------------------------------------


@dataclass(slots=True)
class MidPreemption:
    preemptor: Job
    #: the low-priority gangs that filled the nodes; one is enough to make room
    low: list[Job]
    leader: str
    #: pods of the low gangs being deleted when the leader was killed, and once the
    #: restarted leader had run a while with the victims still terminating
    evicted_at_kill: list[str]
    evicted_before_release: list[str]
    injected: Injected
    #: low pods evicted by the end
    evicted: list[str] = field(default_factory=list)


def _deleting(world: World, pods: Collection[str]) -> list[str]:
    return sorted(name for name, rec in _records(world, pods).items() if rec.deleting is not None or rec.gone)


async def _set_hold(world: World, pods: Collection[str], value: str | None) -> None:
    ns = world.namespace

    async def one(pod: str) -> None:
        with contextlib.suppress(NotFoundError):
            await world.kube.patch(f"/api/v1/namespaces/{ns}/pods/{pod}", {"metadata": {"annotations": {HOLD: value}}})

    await asyncio.gather(*(one(p) for p in pods))


async def kill_mid_preemption(world: World, *, gangs: int = 2, members: int = 2, gpu: int = 8,
                              settle: float = 6.0, timeout: float = 90.0) -> MidPreemption:
    """``gangs`` low-priority gangs fill ``gangs * members * gpu`` GPUs with pods slow to
    shut down; a high-priority gang of ``members * gpu`` GPUs arrives and preempts one of
    them. The leader is killed between the first eviction and the preemptor's Binding and
    started again; ``settle`` seconds later the victims are let go."""
    name = await leader(world)
    # the gangs and their preemptor are held to as many empty nodes as the gangs fill, so
    # the preemptor must preempt however large and free the rest of the pool is
    # (where there are not that many empty nodes, the gangs fill the pool and it is the same)
    per_node = max(1, world.gpus_per_node // gpu) if gpu else members
    need = -(-gangs * members // per_node)
    await world.make_room(need * world.gpus_per_node)
    empty = tuple(sorted(n for n, free in world.free_cards().items() if free >= world.gpus_per_node))
    held: tuple[str, ...] = empty[:need] if len(empty) >= need else ()
    low = [await world.submit(members=members, gpu=gpu, priority="low-priority", nodes=held)
           for _ in range(gangs)]
    low_pods = [p for job in low for p in job.pods]
    await _set_hold(world, low_pods, "true")
    for job in low:
        await world.wait_bound(job, timeout)
    urgent = await world.submit(members=members, gpu=gpu, priority="high-priority", nodes=held)

    def moment() -> list[str]:
        evicted = _deleting(world, low_pods)
        return evicted if evicted and not _bound(world, urgent.pods) else []

    evicted_at_kill = await _until(moment, timeout=timeout, what=f"a victim of {urgent.name} being deleted")
    at = time.time()
    world.schedulers.kill(name, signal.SIGKILL)
    healed = await _restart(world, name)
    await asyncio.sleep(settle)  # the restarted leader runs with the victims still terminating
    before_release = _deleting(world, low_pods)
    await _set_hold(world, low_pods, None)
    await world.wait_bound(urgent, timeout)
    evicted = _deleting(world, low_pods)
    return MidPreemption(
        preemptor=urgent, low=low, leader=name, evicted_at_kill=evicted_at_kill,
        evicted_before_release=before_release, evicted=evicted, injected=Injected(
            at=at, healed_at=healed,
            detail=(f"{name} killed with {len(evicted_at_kill)} victim(s) terminating and {urgent.name} unbound; "
                    f"{len(evicted)} of {len(low_pods)} low-priority pods evicted in all"),
        ),
    )


# -- SIGKILL mid-status-write -----------------------------------------------------------------


@dataclass(slots=True)
class Backlog:
    jobs: list[Job]
    leader: str
    #: backlog pods already showing why they wait when the leader was killed
    told_at_kill: int
    #: per pod, the (reason, message) of each FailedScheduling Event about it, in order
    events: dict[str, list[str]]
    #: pods whose condition was written again after the restart with the reason and
    #: message it already showed (a write that changed nothing)
    rewritten: list[str]
    #: pods that end without a PodScheduled=False condition saying why
    untold: list[str]
    injected: Injected
    #: PodGroups whose status was written again after the restart unchanged
    groups_rewritten: list[str] = field(default_factory=list)

    @property
    def pods(self) -> list[str]:
        return [p for job in self.jobs for p in job.pods]


def _condition(rec: PodRecord) -> tuple[str, str] | None:
    for c in (rec.obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("reason", "")), str(c.get("message", ""))
    return None


def _resource_version(rec: PodRecord) -> str:
    return str((rec.obj.get("metadata") or {}).get("resourceVersion", ""))


async def kill_mid_status_write(world: World, *, singles: int = 120, gangs: int = 6, members: int = 3,
                                gpu: int | None = None, quiet: float = 5.0,
                                timeout: float = 90.0) -> Backlog:
    """A backlog that cannot fit (each pod asks more GPUs than a node has: ``singles`` pods
    and ``gangs`` gangs of ``members``); the leader is killed once some of it, not all,
    shows why it waits, and started again. Waits until every pod shows a condition and
    nothing was written for ``quiet`` seconds, then deletes the backlog."""
    too_big = gpu if gpu is not None else world.gpus_per_node + 1
    name = await leader(world)
    jobs = list(await asyncio.gather(*(world.submit(members=1, gpu=too_big) for _ in range(singles))))
    jobs += [await world.submit(members=members, gpu=too_big) for _ in range(gangs)]
    pods = [p for job in jobs for p in job.pods]

    def told() -> dict[str, PodRecord]:
        return {n: r for n, r in _records(world, pods).items() if _condition(r) is not None}

    seen = await _until(lambda: told() or None, timeout=timeout, what="a backlog pod told why it waits")
    at = time.time()
    world.schedulers.kill(name, signal.SIGKILL)
    await asyncio.sleep(0.5)  # what was in flight lands
    shown = {n: (_condition(r), _resource_version(r)) for n, r in told().items()}
    groups_shown = _group_statuses(world, [job.name for job in jobs if job.gang])
    healed = await _restart(world, name)

    async def quiet_and_told() -> bool:
        recs = _records(world, pods)
        return all(_condition(r) is not None for r in recs.values()) and len(recs) == len(pods)

    deadline = time.monotonic() + timeout
    while not await quiet_and_told():
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(quiet)
    recs = _records(world, pods)
    rewritten = sorted(
        n for n, (cond, rv) in shown.items()
        if n in recs and _condition(recs[n]) == cond and _resource_version(recs[n]) != rv
    )
    untold = sorted(n for n in pods if n not in recs or _condition(recs[n]) is None)
    events = await _failed_scheduling(world, pods)
    groups_now = _group_statuses(world, list(groups_shown))
    groups_rewritten = sorted(
        g for g, (status, rv) in groups_shown.items()
        if g in groups_now and groups_now[g][0] == status and groups_now[g][1] != rv
    )
    for job in jobs:  # the backlog never fits: it goes once it has been judged
        await world.retire(job)
    return Backlog(jobs=jobs, leader=name, told_at_kill=len(seen), events=events, rewritten=rewritten,
                   untold=untold, groups_rewritten=groups_rewritten, injected=Injected(
                       at=at, healed_at=healed,
                       detail=(f"{name} killed with {len(seen)} of {len(pods)} backlog pods told why; "
                               f"{len(rewritten)} pod conditions and {len(groups_rewritten)} PodGroup statuses "
                               f"rewritten unchanged after the restart, {len(untold)} untold"),
                   ))


def _group_statuses(world: World, names: Collection[str]) -> dict[str, tuple[Any, str]]:
    """PodGroup name -> (its status but the conditions' times, its resourceVersion), for the
    groups that have a status (a status written again unchanged gets new times, if any)."""
    wanted = set(names)

    def timeless(status: dict[str, Any]) -> dict[str, Any]:
        conditions = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []]
        return {**status, "conditions": conditions}

    with world.recorder.locked() as m:
        return {
            name: (timeless(group["status"]), str(group["metadata"].get("resourceVersion", "")))
            for name, group in m.groups.items() if name in wanted and group.get("status")
        }


async def _failed_scheduling(world: World, pods: Collection[str]) -> dict[str, list[str]]:
    wanted = set(pods)
    items, _ = await world.kube.list(f"/api/v1/namespaces/{world.namespace}/events",
                                     fieldSelector="reason=FailedScheduling")
    out: dict[str, list[str]] = {p: [] for p in pods}
    for ev in sorted(items, key=lambda e: str(e.get("firstTimestamp") or "")):
        name = (ev.get("involvedObject") or {}).get("name")
        if name in wanted:
            out[name].append(str(ev.get("message", "")))
    return out


# -- the leader paused or partitioned ---------------------------------------------------------


@dataclass(slots=True)
class Fenced:
    """What the harness saw of a leader cut off while it bound a burst."""

    leader: str
    identity: str
    jobs: list[Job]
    #: the Lease as the leader last renewed it, and the deadline its fence held
    renewed: float
    deadline: float
    #: pods bound by the leader when it was cut off, and just before it came back
    bound_at_cut: list[str]
    bound_before_return: list[str]
    injected: Injected

    @property
    def pods(self) -> list[str]:
        return [p for job in self.jobs for p in job.pods]


@dataclass(slots=True)
class Paused(Fenced):
    resumed_at: float = 0.0


@dataclass(slots=True)
class Cut(Fenced):
    #: (time, method, path) of every write the leader sent through the proxy after the cut
    writes_after_cut: list[tuple[float, str, str]] = field(default_factory=list)
    #: when the leader's process exited on its own (None: it had not by the heal)
    exited_at: float | None = None
    exit_code: int | None = None


def _mine(world: World, pods: Collection[str], identity: str) -> list[str]:
    return sorted(n for n, r in _records(world, pods).items() if r.binds and bound_by(r) == identity)


async def _last_renewal(world: World, identity: str, renew_deadline: float) -> tuple[float, float]:
    spec = await lease(world)
    if spec.get("holderIdentity") != identity:
        raise WorldError(f"the lease is held by {spec.get('holderIdentity')!r}, not {identity}")
    renewed = parse_time(spec.get("renewTime")) or 0.0
    return renewed, renewed + renew_deadline


def _renew_deadline(world: World, name: str) -> float:
    doc = world.schedulers.config_document(name, 0, None)
    return float(doc["leaderElection"]["renewDeadlineSeconds"])


def _lease_duration(world: World, name: str) -> float:
    doc = world.schedulers.config_document(name, 0, None)
    return float(doc["leaderElection"]["leaseDurationSeconds"])


async def pause_leader(world: World, *, name: str | None = None, jobs: list[Job] | None = None,
                       burst: int = 300, beyond_lease: float = 2.0, timeout: float = 120.0,
                       start: Callable[[], Any] | None = None, restart: bool = False) -> Paused:
    """SIGSTOP the leader at the first bind of a burst of single pods (``burst`` new ones,
    or ``jobs`` already submitted), keep it stopped ``beyond_lease`` seconds past its
    lease's duration, then SIGCONT it. ``name``: the replica to watch (default: the
    leader now); ``start``: called once the watch is ready, to start that replica (the
    burst may then be waiting for it). The replica is started again once it has exited
    (it finds its lease lost) only with ``restart``, as its Deployment would; the
    tests read who bound what by identity, so they keep it down."""
    if name is None:
        name = await leader(world)
    if jobs is None:
        jobs = list(await asyncio.gather(*(world.submit(members=1, gpu=0) for _ in range(burst))))
    pods = [p for job in jobs for p in job.pods]
    identity = world.schedulers.identity(name)
    watch = asyncio.get_running_loop().create_task(
        _until(lambda: _bound(world, pods), timeout=timeout, what="a pod of the burst bound"))
    if start is not None:
        await _in_thread(start)
    await watch
    at = time.time()
    world.schedulers.pause(name)
    _hold(world, name)
    await asyncio.sleep(0.5)  # what was in flight lands
    renewed, deadline = await _last_renewal(world, identity, _renew_deadline(world, name))
    bound_at_cut = _mine(world, pods, identity)
    await asyncio.sleep(max(0.0, renewed + _lease_duration(world, name) + beyond_lease - time.time()))
    before = _mine(world, pods, identity)
    world.schedulers.resume(name)
    resumed = time.time()
    if restart:
        await _wait_exit(world, name, timeout)
        await _restart(world, name)
    return Paused(
        leader=name, identity=identity, jobs=jobs, renewed=renewed, deadline=deadline,
        bound_at_cut=bound_at_cut, bound_before_return=before, resumed_at=resumed,
        injected=Injected(at=at, healed_at=resumed, detail=(
            f"{name} stopped {resumed - at:.1f} s at the first bind of {len(pods)} pods "
            f"({len(bound_at_cut)} bound by it)")),
    )


_WRITES = ("POST", "PUT", "PATCH", "DELETE")


async def partition_leader(world: World, *, jobs: list[Job] | None = None, burst: int = 300,
                           heal_after: float = 10.0, timeout: float = 120.0, restart: bool = False) -> Cut:
    """Cut the leader (started through the fault proxy) off the apiserver at the first bind
    of a burst, heal ``heal_after`` seconds later. The replica (whose lost lease ends its
    process) is started again after the heal only with ``restart``."""
    name = await leader(world)
    replica = world.schedulers.replicas[name]
    if replica.kubeconfig != world.schedulers.proxy.kubeconfig:
        raise WorldError(f"the leader {name} does not talk through the proxy")
    if jobs is None:
        jobs = list(await asyncio.gather(*(world.submit(members=1, gpu=0) for _ in range(burst))))
    pods = [p for job in jobs for p in job.pods]
    identity = world.schedulers.identity(name)
    await _until(lambda: _bound(world, pods), timeout=timeout, what="a pod of the burst bound")
    proxy = world.schedulers.proxy
    at = time.time()
    proxy.partition()
    _hold(world, name)
    await asyncio.sleep(0.5)
    renewed, deadline = await _last_renewal(world, identity, _renew_deadline(world, name))
    bound_at_cut = _mine(world, pods, identity)
    exit_code = await _wait_exit(world, name, max(0.0, at + heal_after - time.time()))
    exited = time.time() if exit_code is not None else None
    await asyncio.sleep(max(0.0, at + heal_after - time.time()))
    before = _mine(world, pods, identity)
    proxy.heal()
    healed = time.time()
    writes = [r for r in list(proxy.requests) if r[0] >= at and r[1] in _WRITES]
    if restart:
        await _wait_exit(world, name, timeout)
        await _in_thread(lambda: world.schedulers.start(name, via_proxy=True))
    return Cut(
        leader=name, identity=identity, jobs=jobs, renewed=renewed, deadline=deadline,
        bound_at_cut=bound_at_cut, bound_before_return=before, writes_after_cut=writes,
        exited_at=exited, exit_code=exit_code,
        injected=Injected(at=at, healed_at=healed, detail=(
            f"{name} cut off {healed - at:.1f} s at the first bind of {len(pods)} pods; "
            f"{len(writes)} writes sent into the cut, the last "
            f"{(max((w[0] for w in writes), default=at) - deadline):+.2f} s from its deadline")),
    )


# -- for the runner -------------------------------------------------------------------------


async def _injected(run: Any) -> Injected:
    result = await run
    injected: Injected = result.injected
    return injected


#: the faults for a run of the whole suite, where every replica is started again after it.
#: The partition needs the leader to talk through the proxy (``Schedulers.start(...,
#: via_proxy=True)``); the kills land mid-write only as far as the replicas' budgets allow
#: (see the module docstring), and each says what it hit.
FAULTS: list[Fault] = [
    Fault("scheduler SIGKILLed mid-gang", lambda w: _injected(kill_mid_gang(w))),
    Fault("scheduler SIGKILLed mid-preemption", lambda w: _injected(kill_mid_preemption(w))),
    Fault("scheduler SIGKILLed mid-status-write", lambda w: _injected(kill_mid_status_write(w))),
    Fault("leader paused past its lease", lambda w: _injected(pause_leader(w, restart=True))),
    Fault("leader partitioned from the apiserver", lambda w: _injected(partition_leader(w, restart=True))),
]
