"""Faults from outside the scheduler: the control plane, the network, other actors, nodes
and objects. Each is a :class:`~perf.chaos.world.Fault`; its ``run`` injects the fault,
undoes it where it is undone (a process restarted, a partition healed) and returns what it
did. The runner then waits for the cluster to recover and judges it (see
:mod:`perf.chaos.run`).

Sizes follow the world: the "large gang" asks for up to 64 cards, never more than half the
pool, so the same faults run on 4 nodes in CI and on hundreds by hand. Each fault first
makes the room it needs by retiring the oldest jobs (their work is done), so what it
measures is its own fault, not a full cluster.

What "recovered" means for each is the runner's one definition (:func:`World.recovered`):
nothing partly bound, every waiting pod told why, no waiting pod or gang that surely fits,
no bind for a few quiet seconds. For the node faults, the harness plays the node lifecycle
and the job controller: pods on a deleted node are deleted (as the pod garbage collector
does), and every member pod that is gone is created again under a new name, as the training
operator does; a gang that lost members is recovered when it is whole again or was evicted
whole (and its members created again and waiting, told why).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from batchsched.kube.errors import KubeError, NotFoundError
from perf.chaos.world import (
    QUEUES,
    RENEW_DEADLINE,
    Fault,
    Injected,
    Job,
    World,
    WorldError,
    queue_body,
    retrying,
)

#: how long a stopped component stays down
DOWN_SECONDS = 3.0


def large_gang(world: World) -> int:
    return max(4, min(64, len(world.nodes) * world.gpus_per_node // 2))


async def _run_blocking(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def _first_binding(world: World, job: Job, since: int, timeout: float = 60.0) -> bool:
    """Wait until the proxy saw the replica send a Binding for one of ``job``'s pods, or
    (replicas not behind the proxy) the recorder saw one bound."""
    pods = set(job.pods)
    deadline = time.monotonic() + timeout
    proxy = world.schedulers.proxy
    while time.monotonic() < deadline:
        for _, method, path in proxy.requests[since:]:
            if method == "POST" and path.endswith("/binding") and path.rsplit("/", 2)[-2] in pods:
                return True
        if any(p in pods for p in world.recorder.bound_now()):
            return True
        await asyncio.sleep(0.002)
    return False


def _bound(world: World, job: Job) -> int:
    bound = world.recorder.bound_now()
    return sum(1 for p in job.pods if p in bound)


async def _kill_mid_gang(world: World, component: str) -> Injected:
    box = world.control_plane()
    size = large_gang(world)
    queue = world.team_queues[0]
    await world.make_room(size, queue=queue)
    since = len(world.schedulers.proxy.requests)
    job = await world.submit(members=size, gpu=1, queue=queue)
    seen = await _first_binding(world, job, since)
    at = time.time()
    world.recorder.outage(at, None)  # before the kill: the recorder samples in a thread of its own
    box.stop_component(component)  # SIGKILL, at once: no await between the bind and the kill
    members = set(job.pods)

    def bindings(rows: list[Any]) -> set[str]:
        return {r[2].rsplit("/", 2)[-2] for r in rows if r[0] <= at and r[1] == "POST"
                and r[2].endswith("/binding") and r[2].rsplit("/", 2)[-2] in members
                and (len(r) < 4 or r[3] < 300)}

    sent = len(bindings(world.schedulers.proxy.requests[since:]))
    answered = len(bindings(world.schedulers.proxy.answers))
    bound = _bound(world, job)
    await asyncio.sleep(DOWN_SECONDS)
    await _run_blocking(box.start_component, component)
    healed = time.time()
    world.recorder.outage(at, healed)
    when = (f"with {sent} of {size} Bindings sent, {answered} answered" if seen
            else "before any Binding was sent")
    return Injected(at=at, healed_at=healed,
                    detail=f"SIGKILL {when} (gang of {size}); back {healed - at:.1f} s later",
                    facts={"gang": job.name, "size": size, "bound_at_kill": bound, "sent_at_kill": sent,
                           "answered_at_kill": answered})


async def apiserver_killed(world: World) -> Injected:
    return await _kill_mid_gang(world, "kube-apiserver")


async def etcd_killed(world: World) -> Injected:
    return await _kill_mid_gang(world, "etcd")


async def burst(world: World, count: int) -> list[Job]:
    """``count`` jobs of mixed shapes: small gangs, whole-GPU pods, shares of a card."""
    queues = world.team_queues
    jobs = []
    for i in range(count):
        q = queues[i % len(queues)]
        kind = i % 4
        if kind == 0:
            jobs.append(await world.submit(members=4, gpu=1, queue=q))
        elif kind == 1:
            jobs.append(await world.submit(members=1, gpu=2, queue=q))
        elif kind == 2:
            jobs.append(await world.submit(members=1, share=0.5, queue=q))
        else:
            jobs.append(await world.submit(members=2, share=0.25, queue=q))
    return jobs


async def apiserver_slow(world: World, *, latency: float = 1.2, drop_rate: float = 0.1, seconds: float | None = None) -> Injected:
    """Requests of batchsched delayed 0.6-1.8 s and 10% of connections cut, during a burst."""
    proxy = world.schedulers.proxy
    count = max(8, min(64, len(world.nodes) * 2))
    seconds = seconds if seconds is not None else (8.0 if len(world.nodes) < 16 else 15.0)
    await world.make_room(count * 2)
    before_cut, before = proxy.cut, len(proxy.requests)
    at = time.time()
    proxy.slow(latency, drop_rate)
    jobs = await burst(world, count)
    await asyncio.sleep(seconds)
    proxy.heal()
    healed = time.time()
    return Injected(at=at, healed_at=healed,
                    detail=f"{len(jobs)} jobs in a burst; {len(proxy.requests) - before} requests slowed "
                           f"~{latency:g} s, {proxy.cut - before_cut} connections cut over {healed - at:.0f} s")


def _relists(world: World, name: str) -> int:
    try:
        text = world.schedulers.log(name).read_text(errors="replace")
    except OSError:
        return 0
    return sum(1 for line in text.splitlines() if "batchsched.watch: pods: resourceVersion" in line and "expired" in line)


async def _leading_again(world: World, name: str, *, timeout: float) -> None:
    """Wait until replica ``name``'s log says it leads (as often as it says it stopped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = world.schedulers.log(name).read_text(errors="replace")
        except OSError:
            text = ""
        if text.count(" is the leader") > text.count(" stopped leading"):
            return
        await asyncio.sleep(0.2)


WATCH_CACHE_OFF = "--watch-cache-sizes=pods#0"
#: how long after the heal the replica's relist is waited for
RELIST_WAIT_SECONDS = 60.0


async def _churn(world: World) -> None:
    """Pods come and go (the changes the partitioned replica misses)."""
    jobs = await burst(world, 6)
    for job in jobs[:3]:
        await world.retire(job)


async def watch_expired(world: World, *, partition_for: float = 3.0) -> Injected:
    """A real 410 Gone: the replica's watches cut and held by the proxy while pods come and
    go; etcd compacted; healed. With the apiserver's watch cache off for pods, the resumed
    watch reaches etcd at a compacted revision. Only the watches are cut, so the lease's
    renewals pass and the replica keeps leading: what is tested is its resumed watch, not a
    restart (a full partition longer than the renew deadline is a scheduler fault)."""
    box = world.control_plane()
    state = box.state()
    api = next(p for p in state.processes if p.name == "kube-apiserver") if state else None
    prepared = ""
    if api is not None and WATCH_CACHE_OFF not in api.args:
        # the apiserver must serve pod watches from etcd: start it so once (not the fault)
        down = time.time()
        world.recorder.outage(down, None)
        box.stop_component("kube-apiserver")
        await _run_blocking(lambda: box.start_component("kube-apiserver", extra_args=[WATCH_CACHE_OFF]))
        world.recorder.outage(down, time.time())
        prepared = "apiserver restarted with the pod watch cache off first; "
        # a replica cut off near its renew deadline notices the lost lease only then, and
        # exits: let that happen before the replica that leads is chosen below
        await asyncio.sleep(max(0.0, down + RENEW_DEADLINE + 1.0 - time.time()))
        await world.recovered(120)
    await world.make_room(8)
    # a replica that loses its lease meanwhile (a loaded machine) starts afresh with a
    # list, not a resumed watch: that attempt shows nothing, so it is made again
    attempt = 0
    while attempt < 3:
        attempt += 1
        leader = world.schedulers.leader() or "a"
        # a replica that lost its lease to the apiserver's restart above starts afresh (a
        # list, after its watches' back-off): the fault is made once it leads again, with
        # watches that resume, or there is no watch to expire
        await _leading_again(world, leader, timeout=120)
        before = _relists(world, leader)
        restarts = world.schedulers.replicas[leader].restarts
        proxy = world.schedulers.proxy
        at = time.time()
        proxy.partition(watches_only=True)
        churn = asyncio.create_task(_churn(world))
        await asyncio.sleep(partition_for)
        revision = await _run_blocking(box.compact_etcd)
        proxy.heal()
        healed = time.time()
        await churn
        # a watch cut by the partition waits out its retry back-off (a few seconds) before
        # it resumes and meets the compaction
        deadline = time.monotonic() + RELIST_WAIT_SECONDS
        while _relists(world, leader) <= before and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        relisted = _relists(world, leader) > before
        restarted = world.schedulers.replicas[leader].restarts - restarts
        if relisted or not restarted:
            break
        await world.recovered(120)
    return Injected(at=at, healed_at=healed,
                    detail=f"{prepared}watches cut {healed - at:.1f} s, etcd compacted at {revision}; "
                           + ("410 and relist seen in the log" if relisted else "no relist in the log")
                           + (f" (attempt {attempt})" if attempt > 1 else ""),
                    facts={"relisted": relisted, "revision": revision, "replica": leader, "restarted": restarted,
                           "attempts": attempt})


def _pending_cards(world: World) -> float:
    from perf.chaos.checks import cards_asked

    with world.recorder.locked() as m:
        return sum(cards_asked(p.obj) for p in m.pods.values() if p.live and not p.binds)


async def rogue_binder(world: World, *, latency: float = 1.0) -> Injected:
    """Another scheduler binds some of our pending pods (and one gang member) while
    batchsched binds them: one of the two gets 409, nothing lands twice, nothing is
    over-committed. batchsched's requests are delayed ``latency`` s by the proxy, and the
    harness binds a pod as soon as batchsched's Binding of it reaches the proxy: its
    decision is made, its Binding is on the way, ours lands first.

    Two schedulers that do not see each other's decisions can always fill one node twice
    (kube-scheduler's answer is the kubelet refusing the pod); that would be this harness's
    doing, not batchsched's, so the harness binds only onto nodes with room for every pod
    waiting, its own included."""
    total = len(world.nodes) * world.gpus_per_node
    await world.make_room(total // 2)
    q = world.team_queues
    proxy = world.schedulers.proxy
    since = len(proxy.answers)
    waiting_before = _pending_cards(world)
    proxy.slow(latency)
    at = time.time()
    singles = await asyncio.gather(*(world.submit(members=1, gpu=1, queue=q[i % 2]) for i in range(4)))
    gang = await world.submit(members=3, gpu=1, queue=q[0])
    asked = waiting_before + 4 + 3
    targets = [j.pods[0] for j in singles[::2]] + [gang.pods[1]]
    roomy = [n for n, f in sorted(world.free_cards().items(), key=lambda kv: -kv[1]) if f >= asked]

    async def bind(i: int, pod: str) -> bool:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
                "target": {"apiVersion": "v1", "kind": "Node", "name": roomy[i % len(roomy)]}}
        try:
            await world.kube.create(f"/api/v1/namespaces/{world.namespace}/pods/{pod}/binding", body)
            return True
        except KubeError:
            return False

    # bind each target the moment batchsched's own Binding of it reaches the proxy (where
    # it waits out the latency): batchsched has decided, and loses the race
    won = 0
    pending = set(targets) if roomy else set()
    seen = len(proxy.requests)
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        new = proxy.requests[seen:]
        seen += len(new)
        for _, method, path in new:
            pod = path.rsplit("/", 2)[-2] if path.endswith("/binding") else ""
            if method == "POST" and pod in pending:
                pending.discard(pod)
                won += await bind(len(targets) - len(pending) - 1, pod)
        await asyncio.sleep(0.01)
    await asyncio.sleep(max(3.0, latency * 4))
    proxy.heal()
    ours = set(targets)
    refused = sum(1 for _, method, path, status in proxy.answers[since:]
                  if method == "POST" and path.endswith("/binding") and status == 409 and path.rsplit("/", 2)[-2] in ours)
    return Injected(at=at, healed_at=time.time(),
                    detail=(f"the harness bound {won} of {len(targets)} pods first; batchsched's Bindings of them "
                            f"refused with 409: {refused}") if roomy else
                           f"no node with room for all {asked:g} cards waiting: the harness bound nothing",
                    facts={"won": won, "targets": targets, "refused": refused})


async def _taint(world: World, node: str, effect: str) -> None:
    current = await world.kube.get(f"/api/v1/nodes/{node}")
    taints = [*((current.get("spec") or {}).get("taints") or []), {"key": "chaos", "value": "broken", "effect": effect}]
    await world.kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": taints}})


async def _untaint(world: World, node: str) -> None:
    with contextlib.suppress(NotFoundError):
        current = await world.kube.get(f"/api/v1/nodes/{node}")
        taints = [t for t in (current.get("spec") or {}).get("taints") or [] if t.get("key") != "chaos"]
        await world.kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": taints or None, "unschedulable": None}})


async def nodes_changed(world: World) -> Injected:
    """Under running gangs: one node deleted, one cordoned, one tainted NoSchedule, one
    tainted NoExecute. The harness deletes the deleted node's pods and recreates every
    member pod that is gone; nothing new may land on those nodes after the change."""
    from batchsched.sandbox.nodes import NodeShape, create_nodes, wait_nodes_ready

    room = len(world.nodes) * world.gpus_per_node // 2
    per_gang = max(2, min(16, room // 8))  # four gangs of 2-GPU pods in half the pool
    await world.make_room(room)
    gangs = [await world.submit(members=per_gang, gpu=2, queue=world.team_queues[i % 2]) for i in range(4)]
    for g in gangs:
        with contextlib.suppress(WorldError):
            await world.wait_bound(g, 30)
    bound = world.recorder.bound_now()
    hosts: list[str] = []
    for g in gangs:
        for p in g.pods:
            node = bound.get(p)
            if node and node not in hosts:
                hosts.append(node)
    spare = [n for n in world.nodes if n not in hosts]
    chosen = (hosts + spare)[:4]
    while len(chosen) < 4:
        chosen.append(chosen[-1])
    deleted, cordoned, no_schedule, no_execute = chosen
    world.start_job_controller()
    at = time.time()
    await world.kube.delete(f"/api/v1/nodes/{deleted}")
    await world.kube.patch(f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": True}})
    await _taint(world, no_schedule, "NoSchedule")
    await _taint(world, no_execute, "NoExecute")
    # the node lifecycle: the pods of a deleted node are deleted (the job controller above
    # then creates their members again)
    orphans = [p.name for p in world.recorder.pods_now() if p.node == deleted]
    for pod in orphans:
        with contextlib.suppress(NotFoundError):
            await retrying(lambda pod=pod: world.kube.delete(  # type: ignore[misc]
                f"/api/v1/namespaces/{world.namespace}/pods/{pod}", gracePeriodSeconds=0))
    shape = world.nodes.index(deleted)

    async def undo() -> None:
        names = await create_nodes(world.kube, [NodeShape(count=1, prefix=world.pool, start=shape,
                                                          gpus=world.gpus_per_node,
                                                          labels={"chaos.batchsched.io/world": world.namespace})])
        await wait_nodes_ready(world.kube, names, timeout=60)
        for node in (cordoned, no_schedule, no_execute):
            await _untaint(world, node)

    world.after_recovery.append(undo)
    return Injected(at=at, detail=f"{deleted} deleted ({len(orphans)} pods), {cordoned} cordoned, "
                                  f"{no_schedule} NoSchedule, {no_execute} NoExecute, under {len(gangs)} gangs",
                    facts={"deleted": deleted, "cordoned": cordoned, "no_schedule": no_schedule,
                           "no_execute": no_execute, "gangs": [g.name for g in gangs]})


async def objects_recreated(world: World) -> Injected:
    """A waiting gang's PodGroup (asking more members than exist) deleted and created again
    with a minMember it meets; a Queue whose quota held its pods back deleted and created
    again with room.
    batchsched must follow the new objects: both are placed."""
    await world.make_room(16)
    ns = world.namespace
    # a gang whose PodGroup asks more members than it has (as when an operator has not
    # created them all yet): it waits
    size = 8
    gang = await world.submit(members=size, min_member=size + 2, gpu=1, queue=world.team_queues[0])
    # a queue with no quota: its pods wait
    qname = f"{ns}-c"
    tight = {"parent": ns, "resources": [{"name": "batchsched.io/gpu", "nominal": 0, "borrowingLimit": 0}]}
    await retrying(lambda: world.kube.create(QUEUES, queue_body(ns, qname, tight)))
    world.queues[qname] = tight
    held = [await world.submit(members=1, gpu=1, queue=qname) for _ in range(2)]
    await asyncio.sleep(3)
    at = time.time()
    await world.kube.delete(f"{world.group_path(gang)}/{gang.name}")
    await asyncio.sleep(0.5)
    new_min = size // 2
    gang.min_member = new_min
    await retrying(lambda: world.kube.create(world.group_path(gang), world.group_body(gang)))
    await world.kube.delete(f"{QUEUES}/{qname}")
    await asyncio.sleep(0.5)
    roomy = {"parent": ns, "resources": [{"name": "batchsched.io/gpu", "nominal": 2, "borrowingLimit": 0}]}
    await retrying(lambda: world.kube.create(QUEUES, queue_body(ns, qname, roomy)))
    world.queues[qname] = roomy

    async def undo() -> None:
        for job in held:
            await world.retire(job)
        await world.retire(gang)
        with contextlib.suppress(NotFoundError):
            await world.kube.delete(f"{QUEUES}/{qname}")
        world.queues.pop(qname, None)

    world.after_recovery.append(undo)
    return Injected(at=at, detail=f"PodGroup {gang.name} ({gang.api}) of {size} pods: quorum {size + 2}->{new_min}; "
                                  f"Queue {qname} quota 0->2 with 2 pods waiting",
                    facts={"gang": gang.name, "min_member": new_min, "queue_jobs": [j.name for j in held]})


async def placed(world: World, facts: dict[str, Any]) -> dict[str, int]:
    """For :func:`objects_recreated`: how many of the gang's and the queue's pods are bound."""
    bound = world.recorder.bound_now()
    gang = world.jobs.get(facts["gang"])
    queue_pods = [p for name in facts["queue_jobs"] if (j := world.jobs.get(name)) for p in j.pods]
    return {"gang": sum(1 for p in (gang.pods if gang else []) if p in bound),
            "queue": sum(1 for p in queue_pods if p in bound)}


FAULTS: dict[str, Fault] = {
    "apiserver-killed": Fault("apiserver killed mid-gang", apiserver_killed),
    "etcd-killed": Fault("etcd killed mid-gang", etcd_killed),
    "apiserver-slow": Fault("apiserver slow, connections dropped", apiserver_slow),
    "watch-expired": Fault("watch 410 Gone after compaction", watch_expired),
    "rogue-binder": Fault("another scheduler binds our pods", rogue_binder),
    "nodes-changed": Fault("nodes deleted, cordoned, tainted", nodes_changed),
    "objects-recreated": Fault("PodGroup and Queue recreated", objects_recreated),
}
