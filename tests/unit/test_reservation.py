"""Reservations (batchsched.core.reservation): a large gang at the head of its queue is not
starved by a stream of smaller, later work.

The session runs on a fake clock against :class:`Sim`, a small in-memory cluster that binds
what the session decides (``status.startTime`` = the bind's time) and ends each running pod
when its own run time is over, whether or not the pod declared it. No sleeps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.config import ConfigError, parse_config
from batchsched.core.decisions import Decisions
from batchsched.core.model import format_time, parse_node, parse_pod
from batchsched.core.plan import UnitStatus
from batchsched.core.reservation import (
    RUNTIME_ANNOTATION,
    ReservationSettings,
    declared_runtime,
    expected_end,
    parse_duration,
)
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_node, make_pod

T0 = 1_800_000_000.0
GPU = "nvidia.com/gpu"
XK8S = "scheduling.x-k8s.io"
GANG = "x-k8s:default/big"


@dataclass
class Sim:
    """The apiserver and the kubelets: binds what the session decides, ends pods on time."""

    session: Session
    now: float = T0
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: uid -> how long the pod really runs (None: until the test ends it)
    runs: dict[str, float | None] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    #: uid -> when it was bound
    bound: dict[str, float] = field(default_factory=dict)
    names: itertools.count[int] = field(default_factory=itertools.count)

    def node(self, name: str, gpus: int) -> None:
        obj = make_node(name).cap(cpu="64", memory="512Gi", **{GPU: str(gpus)}).obj()
        self.session.on_node("ADDED", parse_node(obj))

    def pod(self, name: str, gpus: int, *, runs: float | None = None, declare: str = "",
            group: str = "", created: float | None = None, priority: int = 0) -> str:
        """A pod that runs ``runs`` seconds once bound; ``declare``: "annotation" or
        "deadline" to say so, else it says nothing."""
        b = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).priority(priority)
        b = b.created(self.now if created is None else created)
        if group:
            b = b.group(group)
        obj = b.obj()
        if declare == "annotation" and runs is not None:
            obj["metadata"].setdefault("annotations", {})[RUNTIME_ANNOTATION] = f"{int(runs)}s"
        elif declare == "deadline" and runs is not None:
            obj["spec"]["activeDeadlineSeconds"] = int(runs)
        uid = str(obj["metadata"]["uid"])
        self.pods[uid] = obj
        self.runs[uid] = runs
        self.session.on_pod("ADDED", parse_pod(obj))
        return uid

    def small(self, gpus: int, runs: float, declare: str = "", created: float | None = None) -> str:
        return self.pod(f"small-{next(self.names):04d}", gpus, runs=runs, declare=declare, created=created)

    def end(self, uid: str) -> None:
        self.session.on_pod("DELETED", parse_pod(self.pods.pop(uid)))

    def step(self, *, after: float = 0.0) -> Decisions:
        self.now += after
        for uid, start in list(self.started.items()):
            runs = self.runs.get(uid)
            if runs is not None and self.now >= start + runs and uid in self.pods:
                del self.started[uid]
                self.end(uid)
        d = self.session.step(self.now)
        for b in d.binds:
            obj = self.pods[b.uid]
            obj["spec"]["nodeName"] = b.node
            obj["status"]["phase"] = "Running"
            obj["status"]["startTime"] = format_time(self.now)
            self.started[b.uid] = self.now
            self.bound[b.uid] = self.now
            self.session.on_bind_result(b, "bound", now=self.now)
            self.session.on_pod("MODIFIED", parse_pod(obj))
        return d

    def node_of(self, uid: str) -> str:
        return str(self.pods[uid]["spec"].get("nodeName", "")) if uid in self.pods else ""


def session(**reservation: Any) -> Session:
    return Session(SessionSettings(reservation=ReservationSettings(**reservation)), use_jit=False)


def gang(sim: Sim, *, created: float) -> list[str]:
    """A 16-GPU gang: two pods of 8 GPUs, minMember 2, that run for good once started."""
    sim.session.on_groups_listed(XK8S, [make_group("big").min_member(2).build()])
    return [sim.pod(f"big-{i}", 8, group="big", created=created) for i in range(2)]


def busy_cluster(sim: Sim, *, declare: str = "annotation", runs: tuple[float, ...] = ()) -> None:
    """3 nodes x 8 GPUs, each GPU busy with a 1-GPU pod (run times ``runs``, cycled)."""
    for n in range(3):
        sim.node(f"n{n}", 8)
    cycle = itertools.cycle(runs or (30.0,))
    for i in range(24):
        sim.small(1, next(cycle), declare, created=sim.now - 100 + i)
    d = sim.step()
    assert len(d.binds) == 24


# -- declared ends ----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [
    ("30m", 1800.0), ("1h30m", 5400.0), ("90", 90.0), ("1.5h", 5400.0), ("250ms", 0.25),
    ("20s", 20.0), ("", None), ("soon", None), ("-5", None), ("0", None), ("5x", None), ("m5", None),
])
def test_a_declared_runtime_is_a_go_duration_or_seconds(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_a_pod_ends_at_its_start_plus_the_shorter_of_its_deadline_and_its_annotation() -> None:
    pod = make_pod("p").annotate({RUNTIME_ANNOTATION: "10m"}).obj()
    pod["spec"]["activeDeadlineSeconds"] = 300
    pod["status"]["startTime"] = format_time(T0)
    parsed = parse_pod(pod)
    assert declared_runtime(parsed) == 300.0
    assert expected_end(parsed, T0 + 10) == T0 + 300
    assert expected_end(parsed, T0 + 400) == T0 + 400  # overdue: any moment now
    assert expected_end(parse_pod(make_pod("q").obj()), T0) == float("inf")
    assert expected_end(parse_pod(make_pod("r").deleting(T0).obj()), T0 + 5) == T0 + 5


# -- the policy through the session -------------------------------------------------------------


def test_the_head_gang_holds_the_nodes_that_free_first_and_later_pods_stay_off_them() -> None:
    sim = Sim(session())
    # n0's pods end after 10 s, n1's after 20 s, n2's after 40 s (packing fills n0 first)
    busy_cluster(sim, runs=(10.0,) * 8 + (20.0,) * 8 + (40.0,) * 8)
    members = gang(sim, created=T0 - 60)
    d = sim.step(after=1.0)
    result = d.plan.results[GANG] if d.plan else None
    assert result is not None and result.status is UnitStatus.WAITING and result.reason == "Reserved"
    assert result.message == (
        "gang needs 2 pods (2 cpu, 16 nvidia.com/gpu) placed together; only 0 fit now. Member big-0: "
        "0/3 nodes fit: 3 insufficient nvidia.com/gpu; holds a reservation on node(s) n0, n1; expected "
        "to start in about 20s (when 16 running pod(s) end)"
    )
    assert {(c.ref.name, c.reason, c.message) for c in d.unschedulable} == {
        (f"big-{i}", "Reserved", result.message) for i in range(2)
    }
    statuses = {g.name: st for g, st in d.group_statuses}
    assert (statuses["big"].reason, statuses["big"].message) == ("Reserved", result.message)

    # n0 frees at 10 s: a later 1-GPU pod (no declared end) may not take it
    sim.step(after=9.0)
    late = sim.small(1, 1000.0)
    d = sim.step(after=0.5)
    assert sim.node_of(late) == ""
    told = {c.ref.uid: c.message for c in d.unschedulable}
    assert told[late] == (
        "0/3 nodes fit: 3 insufficient nvidia.com/gpu; capacity on node(s) n0 is reserved for "
        "default/big, which waits longer"
    )
    # ... but one known to end before the gang starts may
    quick = sim.small(1, 5.0, "annotation")
    sim.step(after=0.5)
    assert sim.node_of(quick) == "n0"
    # n1 frees at 20 s: the gang starts there, the late pod waits for n2
    for _ in range(4):
        sim.step(after=3.0)
    assert sorted(sim.node_of(u) for u in members) == ["n0", "n1"]
    assert sim.node_of(late) == ""


def test_without_declared_ends_the_reservation_takes_the_nodes_with_the_least_unknown_work() -> None:
    sim = Sim(session())
    for n in range(3):
        sim.node(f"n{n}", 8)
    # n0: 8 undeclared pods; n1: 2 undeclared and 6 declared; n2: 4 undeclared, 4 declared
    for node, undeclared in (("n0", 8), ("n1", 2), ("n2", 4)):
        for i in range(8):
            uid = sim.pod(f"{node}-{i}", 1, runs=None if i < undeclared else 30.0,
                          declare="" if i < undeclared else "deadline")
            sim.pods[uid]["spec"]["nodeName"] = node
            sim.pods[uid]["status"] = {"phase": "Running", "startTime": format_time(T0)}
            sim.session.on_pod("MODIFIED", parse_pod(sim.pods[uid]))
    gang(sim, created=T0 - 60)
    d = sim.step(after=1.0)
    assert d.plan is not None and d.plan.results[GANG].message == (
        "gang needs 2 pods (2 cpu, 16 nvidia.com/gpu) placed together; only 0 fit now. Member big-0: "
        "0/3 nodes fit: 3 insufficient nvidia.com/gpu; holds a reservation on node(s) n1, n2; start time "
        "unknown (running work on those nodes declares no end)"
    )


def test_a_reservation_held_too_long_is_dropped_for_as_long_again() -> None:
    # a step every 40 s, each trying the waiting gang again: a retry interval below that
    sim = Sim(Session(SessionSettings(reservation=ReservationSettings(max_hold=60.0), retry_unschedulable=30.0),
                      use_jit=False))
    busy_cluster(sim, declare="", runs=(10_000.0,))
    gang(sim, created=T0 - 60)
    reasons = []
    for _ in range(5):
        d = sim.step(after=40.0)
        assert d.plan is not None
        reasons.append(d.plan.results[GANG].reason)
    # held at 40 s and 80 s (first held at 40 s), dropped at 120 s (held 80 s > 60 s) and at
    # 160 s; held anew at 200 s (dropped 80 s > 60 s ago)
    assert reasons == ["Reserved", "Reserved", "Unschedulable", "Unschedulable", "Reserved"]
    d = sim.step(after=100.0)  # held since 200 s: dropped again
    assert d.plan is not None and d.plan.results[GANG].message == (
        "gang needs 2 pods (2 cpu, 16 nvidia.com/gpu) placed together; only 0 fit now. Member big-0: "
        "0/3 nodes fit: 3 insufficient nvidia.com/gpu; it held a reservation for more than 60s, "
        "which was dropped for as long again"
    )


def test_reservations_are_configured_in_the_config_file() -> None:
    cfg = parse_config({"reservation": {"enabled": False, "perQueue": 2, "maxHoldSeconds": 600}})
    assert cfg.session_settings().reservation == ReservationSettings(enabled=False, per_queue=2, max_hold=600.0)
    assert parse_config(None).session_settings().reservation == ReservationSettings()
    with pytest.raises(ConfigError, match=r"reservation\.perQueue"):
        parse_config({"reservation": {"perQueue": 0}})


# -- no starvation -------------------------------------------------------------------------------


def gang_wait(*, enabled: bool, arrivals: list[list[tuple[int, int, bool]]], declare: str,
              first: list[int], tick: float = 5.0) -> float | None:
    """Seconds from the gang's creation to its binding (None: not within the stream), under
    ``arrivals``: per tick, small pods (GPUs, run time, declared)."""
    sim = Sim(session(enabled=enabled))
    busy_cluster(sim, declare=declare, runs=tuple(float(r) for r in first))
    created = sim.now
    members = gang(sim, created=created)
    for batch in arrivals:
        for gpus, runs, declared in batch:
            sim.small(gpus, float(runs), declare if declared else "")
        sim.step(after=tick)
        if all(u in sim.bound for u in members):
            return max(sim.bound[u] for u in members) - created
    return None


MAX_RUN = 60
small_pods = st.lists(st.tuples(st.integers(1, 2), st.integers(5, MAX_RUN), st.booleans()), max_size=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=st.lists(small_pods, min_size=80, max_size=80),
    first=st.lists(st.integers(5, MAX_RUN), min_size=24, max_size=24),
    declare=st.sampled_from(["annotation", "deadline"]),
    all_declared=st.booleans(),
)
def test_the_head_gang_starts_within_a_bound_under_any_stream_of_smaller_later_pods(
    arrivals: list[list[tuple[int, int, bool]]], first: list[int], declare: str, all_declared: bool,
) -> None:
    """Whatever the stream, the older gang at the head starts once the work on its nodes
    ends: within the longest run time plus a few ticks when every running pod declares its
    end, and within two of them when some do not (no finite start, the nodes still drain)."""
    if all_declared:
        arrivals = [[(g, r, True) for g, r, _ in batch] for batch in arrivals]
    wait = gang_wait(enabled=True, arrivals=arrivals, declare=declare, first=first)
    assert wait is not None
    assert wait <= (MAX_RUN + 15 if all_declared else 2 * MAX_RUN + 15)


def test_without_reservations_a_steady_stream_starves_the_gang() -> None:
    """The stream the property runs against today's behaviour: two 1-GPU pods of 20-40 s every
    5 s keep the cluster busy, and every GPU that frees goes to a later small pod."""
    arrivals = [[(1, 20 + (7 * i) % 21, True), (1, 20 + (11 * i) % 21, True)] for i in range(80)]
    first = [5 + (13 * i) % 50 for i in range(24)]
    assert gang_wait(enabled=False, arrivals=arrivals, declare="annotation", first=first) is None
    wait = gang_wait(enabled=True, arrivals=arrivals, declare="annotation", first=first)
    assert wait is not None and wait <= MAX_RUN + 15
