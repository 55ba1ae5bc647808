"""A gang whose PodGroup sets ``minResources`` (the training operator always writes it) holds
a reservation at the head of its queue like any other gang: it is never placed before its
``minResources`` fit, is told so, and is not starved by later small work.

The session runs on a fake clock against :class:`World` (the reservation tests' cluster, which
binds what the session decides and ends each pod when its run time is over, and here also
carries out the evictions asked for). No sleeps.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from batchsched.core.decisions import Decisions
from batchsched.core.model import parse_pod
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group
from tests.unit.test_reservation import GPU, T0, XK8S, Sim

GANG = "x-k8s:default/big"
QUEUE_LABEL = "batchsched.io/queue"
#: the longest a small pod runs
MAX_RUN = 60
MIN_RESOURCES_SHORT = "gang default/big needs minResources the cluster does not have free: "


class World(Sim):
    """:class:`Sim`, and the evictions the session asks for carried out at once."""

    def step(self, *, after: float = 0.0) -> Decisions:
        d = super().step(after=after)
        for e in d.evictions:
            if e.uid in self.pods:
                self.session.on_evict_result(e, "evicted")
                self.started.pop(e.uid, None)
                self.end(e.uid)
        return d

    def small(self, gpus: int, runs: float, declare: str = "annotation", created: float | None = None,
              *, queue: str = "") -> str:
        """A later 1-GPU pod that declares its run time (in ``queue``)."""
        uid = super().small(gpus, runs, declare, created)
        if queue:
            self.pods[uid]["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue
            self.session.on_pod("MODIFIED", parse_pod(self.pods[uid]))
        return uid


def world() -> World:
    return World(Session(SessionSettings(), use_jit=False))


def big_gang(w: World, *, min_resources: bool, gpus: int = 16, queue: str = "") -> list[str]:
    """Two pods of 8 GPUs, minMember 2 (and ``minResources`` of ``gpus`` GPUs, as the training
    operator writes it), that run for good once started; created before the stream."""
    g = make_group("big").min_member(2).created(w.now - 1)
    if min_resources:
        g = g.min_resources(cpu="2", gpu=gpus)
    w.session.on_groups_listed(XK8S, [g.build()])
    members = [w.pod(f"big-{i}", 8, group="big", created=w.now - 1) for i in range(2)]
    if queue:  # its members name the queue, as the training operator's do
        for uid in members:
            w.pods[uid]["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue
            w.session.on_pod("MODIFIED", parse_pod(w.pods[uid]))
    return members


def full_cluster(w: World, nodes: int = 2, *, queue: str = "") -> None:
    """``nodes`` x 8 GPUs, each GPU busy with a 1-GPU pod that declares its end (5-60 s)."""
    for n in range(nodes):
        w.node(f"n{n}", 8)
    for i in range(8 * nodes):
        w.small(1, 5 + (13 * i) % (MAX_RUN - 4), created=w.now - 100 + i, queue=queue)
    assert len(w.step().binds) == 8 * nodes


Look = Callable[[World, Decisions], None]


def stream(w: World, members: list[str], *, seconds: int, queue: str = "", each: Look | None = None) -> float | None:
    """A new 1-GPU pod (20-40 s, declared) every second; seconds from now to the gang's
    binding, None when it is not bound within ``seconds``. ``each(w, d)`` sees every step."""
    start = w.now
    runs = itertools.cycle([20 + (7 * i) % 21 for i in range(21)])
    for _ in range(seconds):
        w.small(1, next(runs), queue=queue)
        d = w.step(after=1.0)
        bound = [u for u in members if u in w.bound]
        assert len(bound) in (0, len(members)), "a gang is placed whole or not at all"
        if each is not None:
            each(w, d)
        if bound:
            return max(w.bound[u] for u in members) - start
    return None


def told(into: list[tuple[str, str]]) -> Look:
    """Collects what the gang's first member is told."""
    def look(w: World, d: Decisions) -> None:
        into.extend((c.reason, c.message) for c in d.unschedulable if c.ref.name == "big-0")
    return look


# -- the gang is not starved ---------------------------------------------------------------------


def test_a_gang_short_of_min_resources_holds_a_reservation_and_starts_like_one_without() -> None:
    """The 2x8-GPU gang behind a stream of later 1-GPU pods of the same priority starts once
    the work on the nodes it holds ends, with ``minResources`` as without."""
    for with_min in (False, True):
        w = world()
        full_cluster(w)
        members = big_gang(w, min_resources=with_min)
        said: list[tuple[str, str]] = []
        wait = stream(w, members, seconds=3 * MAX_RUN, each=told(said))
        assert wait is not None, f"minResources={with_min}: the gang never started"
        assert wait <= MAX_RUN + 10
        reason, message = said[0]
        assert reason == "Reserved"
        if with_min:
            # the user is told the minResources reason, and where the gang holds its nodes
            assert message.startswith(
                f"{MIN_RESOURCES_SHORT}16 {GPU} (free: 0); holds a reservation on node(s) n0, n1; "
                "expected to start in about "
            ), message


def test_a_gang_is_never_placed_before_its_min_resources_fit() -> None:
    """Its quorum fits on two idle nodes, but it asks for 24 GPUs: it waits, told why, until
    the third node's work ends."""
    w = world()
    for n in range(3):
        w.node(f"n{n}", 8)
    busy = [w.small(1, 30, created=w.now - 10) for _ in range(8)]
    w.step()
    assert {w.node_of(u) for u in busy} == {"n0"}
    members = big_gang(w, min_resources=True, gpus=24)
    d = w.step(after=1.0)
    assert not [u for u in members if u in w.bound]
    result = d.plan.results[GANG] if d.plan else None
    assert result is not None
    assert result.message.startswith(f"{MIN_RESOURCES_SHORT}24 {GPU} (free: 16)"), result.message
    statuses = {g.name: st for g, st in d.group_statuses}
    assert statuses["big"].message == result.message
    for _ in range(40):
        w.step(after=1.0)
        if any(u in w.bound for u in members):
            break
    assert all(u in w.bound for u in members)
    assert min(w.bound[u] for u in members) >= T0 + 30  # not before n0's work ended


# -- where it meets preemption and queues ----------------------------------------------------------


def test_a_higher_priority_arrival_preempts_past_the_reservation_and_the_gang_still_starts() -> None:
    """A priority-100 pod of 8 GPUs arrives while the gang holds its reservation: it may take
    what the gang holds (it could preempt the gang anyway), it preempts small pods, never
    anything of the gang, and once it ends the gang starts; the gang evicts no one."""
    w = world()
    full_cluster(w)
    members = big_gang(w, min_resources=True)
    said: list[tuple[str, str]] = []
    w.step(after=1.0)
    urgent = w.pod("urgent", 8, runs=30, declare="annotation", priority=100)
    evicted: list[tuple[str, str]] = []

    def look(w: World, d: Decisions) -> None:
        told(said)(w, d)
        evicted.extend((e.name, e.preemptor) for e in d.evictions)

    wait = stream(w, members, seconds=3 * MAX_RUN, each=look)
    assert urgent in w.bound and w.bound[urgent] - T0 <= 10
    assert evicted and all(name.startswith("small-") and by == "default/urgent" for name, by in evicted)
    assert wait is not None and wait <= MAX_RUN + 30 + 10
    assert w.bound[urgent] + 30 <= min(w.bound[u] for u in members)
    # all the while, told its minResources reason
    assert said and all(m.startswith(MIN_RESOURCES_SHORT) for _, m in said), said


def _queue(name: str, gpus: int) -> dict[str, object]:
    return {"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"},
            "spec": {"resources": [{"name": GPU, "nominal": str(gpus)}]}}


def test_the_gang_asking_its_queues_whole_nominal_is_not_starved_by_another_queues_stream() -> None:
    """Queue team (nominal 16 GPUs) has the gang asking all 16; queue other (nominal 16) fills
    the cluster within its nominal (nothing to reclaim, so minResources falls short) and keeps
    submitting 1-GPU pods. team, below its nominal, goes first: its gang holds the nodes, and
    other's later pods do not take them."""
    w = world()
    w.session.on_queues_listed([_queue("team", 16), _queue("other", 16)])
    full_cluster(w, queue="other")
    members = big_gang(w, min_resources=True, queue="team")
    said: list[tuple[str, str]] = []
    wait = stream(w, members, seconds=3 * MAX_RUN, queue="other", each=told(said))
    assert wait is not None and wait <= MAX_RUN + 10
    assert said[0][0] == "Reserved" and said[0][1].startswith(f"{MIN_RESOURCES_SHORT}16 {GPU} (free: 0)")
    # and team is at its nominal, never beyond
    running = [o for o in w.pods.values() if o["spec"].get("nodeName")
               and o["metadata"].get("labels", {}).get(QUEUE_LABEL) == "team"]
    assert sum(int(o["spec"]["containers"][0]["resources"]["requests"][GPU]) for o in running) == 16


def test_the_gang_whose_queue_is_at_nominal_waits_for_its_quota_then_reclaims_what_was_lent() -> None:
    """Queue team (nominal 16) runs its own 16 small pods: the gang in team is short of quota
    and of minResources (nothing it may reclaim while team is at its nominal) and holds
    nothing. Queue other (nominal 0) borrows what team's ending pods free. Once team's own
    work is gone, the gang reclaims what other borrowed, is placed whole, and team is at its
    nominal again, never beyond."""
    w = world()
    org = {"metadata": {"name": "org", "uid": "q-org", "resourceVersion": "1"}, "spec": {}}
    team, other = _queue("team", 16), _queue("other", 0)
    team["spec"]["parent"] = other["spec"]["parent"] = "org"  # type: ignore[index]
    w.session.on_queues_listed([org, team, other])
    full_cluster(w, queue="team")
    members = big_gang(w, min_resources=True, queue="team")
    said: list[tuple[str, str]] = []
    evicted: list[tuple[str, str]] = []

    def look(w: World, d: Decisions) -> None:
        told(said)(w, d)
        evicted.extend((e.preemptor, e.cause) for e in d.evictions)

    wait = stream(w, members, seconds=3 * MAX_RUN, queue="other", each=look)
    assert wait is not None and wait <= MAX_RUN + 10
    assert said[0] == ("InsufficientMinResources", f"{MIN_RESOURCES_SHORT}16 {GPU} (free: 0)")
    assert evicted and set(evicted) == {("x-k8s:default/big", "reclaimed")}
    running = [o for o in w.pods.values() if o["spec"].get("nodeName")
               and o["metadata"].get("labels", {}).get(QUEUE_LABEL) == "team"]
    assert sum(int(o["spec"]["containers"][0]["resources"]["requests"][GPU]) for o in running) == 16


def test_a_gang_whose_min_resources_cover_its_elastic_members_reserves_for_them_too() -> None:
    """minMember 2 of three 8-GPU pods, ``minResources`` 24 GPUs: the gang holds three
    nodes, so that when they are free its ``minResources`` is free too, and starts whole
    under the stream (a reservation for its quorum alone would leave it short for good)."""
    w = world()
    full_cluster(w, nodes=3)
    g = make_group("big").min_member(2).created(w.now - 1).min_resources(cpu="3", gpu=24)
    w.session.on_groups_listed(XK8S, [g.build()])
    members = [w.pod(f"big-{i}", 8, group="big", created=w.now - 1) for i in range(3)]
    said: list[tuple[str, str]] = []
    wait = stream(w, members, seconds=3 * MAX_RUN, each=told(said))
    assert wait is not None and wait <= MAX_RUN + 10
    assert said[0][0] == "Reserved"
    assert said[0][1].startswith(f"{MIN_RESOURCES_SHORT}24 {GPU} (free: 0); holds a reservation on node(s) n0, n1, n2")
