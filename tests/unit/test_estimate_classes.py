"""Start estimates over classes of work (:mod:`batchsched.insight.ahead`), as a user reads
them from ``batchsched explain``: every waiting job gets a start, a job behind a declared
end starts at that end, the policy's order (priority, arrival, quota, reservations) is
kept, and the model agrees with the exact copy of the session stepped forward."""

from __future__ import annotations

from typing import Any

import pytest

from batchsched.core.gangs import parse_podgroup
from batchsched.core.model import format_time, parse_node, parse_pod
from batchsched.core.session import Session, SessionSettings
from batchsched.insight.estimate import Estimate, estimate_starts
from batchsched.insight.views import jobs
from tests.builders import make_group, make_node, make_pod

T0 = 1_800_000_000.0
GPU = "nvidia.com/gpu"
XK8S = "scheduling.x-k8s.io"
MIN = 60.0


class World:
    """A session and the apiserver's side of its decisions, applied at once."""

    def __init__(self) -> None:
        self.session = Session(SessionSettings(), use_jit=False)
        self.now = T0
        self.pods: dict[str, dict[str, Any]] = {}

    def node(self, name: str, gpus: int = 8, **labels: str) -> None:
        node = make_node(name).cap(cpu="64", memory="512Gi", **{GPU: str(gpus)}).label(labels)
        self.session.on_node("ADDED", parse_node(node.obj()))

    def queues(self, **nominal: int) -> None:
        self.session.on_queues_listed([
            {"metadata": {"name": q, "uid": f"q-{q}", "resourceVersion": "1"},
             "spec": {"resources": [{"name": GPU, "nominal": str(n)}]}}
            for q, n in nominal.items()])

    def group(self, name: str, size: int) -> None:
        g = make_group(name).min_member(size).created(self.now)
        self.session.on_podgroup("ADDED", parse_podgroup(XK8S, g.obj()))

    def pod(self, name: str, gpus: int, runtime: str, *, group: str = "", queue: str = "",
            priority: int = 0, pool: str = "", evicts: bool = True) -> str:
        b = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(self.now).priority(priority)
        if not evicts:
            b = b.preemption_policy("Never")
        b = b.annotate({"batchsched.io/expected-runtime": runtime})
        if pool:
            b = b.selector(pool=pool)
        if group:
            b = b.group(group)
        if queue:
            b = b.label({"batchsched.io/queue": queue})
        obj = b.obj()
        self.pods[obj["metadata"]["uid"]] = obj
        self.session.on_pod("ADDED", parse_pod(obj))
        return str(obj["metadata"]["uid"])

    def step(self, after: float = 0.0) -> None:
        self.now += after
        d = self.session.step(self.now)
        for b in d.binds:
            obj = self.pods[b.uid]
            obj["spec"]["nodeName"] = b.node
            obj["status"]["phase"] = "Running"
            obj["status"]["startTime"] = format_time(self.now)
            self.session.on_bind_result(b, "bound", now=self.now)
            self.session.on_pod("MODIFIED", parse_pod(obj))
        for e in d.evictions:
            obj = self.pods.pop(e.uid)
            self.session.on_evict_result(e, "evicted")
            self.session.on_pod("DELETED", parse_pod(obj))

    def finish(self, uid: str) -> None:
        self.pods[uid]["status"]["phase"] = "Succeeded"
        self.session.on_pod("MODIFIED", parse_pod(self.pods[uid]))

    def bound(self, uid: str) -> bool:
        return bool(self.pods[uid]["spec"].get("nodeName"))

    def estimates(self, *, exact: bool = False) -> dict[str, Estimate]:
        return estimate_starts(self.session, jobs(self.session, self.now), self.now, use_jit=False, exact=exact)

    def starts(self, *, exact: bool = False) -> dict[str, float | None]:
        """Each waiting job's estimated start in minutes from now, by job name."""
        out: dict[str, float | None] = {}
        for key, e in self.estimates(exact=exact).items():
            name = key.rsplit("/", 1)[-1]
            out[name] = None if e["start"] is None else round((e["start"] - self.now) / MIN, 2)
        return out


def test_a_job_behind_a_declared_end_starts_at_that_end() -> None:
    w = World()
    w.node("n0")
    running = w.pod("train", 8, "30m")
    w.step()
    assert w.bound(running)
    w.pod("next", 8, "10m")
    w.step(after=10 * MIN)
    e = w.estimates()["default/next"]
    assert e["start"] == T0 + 30 * MIN
    assert e["confidence"] == "high"
    assert "declared" in e["basis"]


def test_a_job_waits_for_the_nodes_its_selector_allows_though_others_are_free() -> None:
    w = World()
    w.node("a0", pool="a")
    w.node("b0", pool="b")
    w.pod("on-a", 8, "30m", pool="a")
    w.step()
    w.pod("wants-a", 8, "10m", pool="a")
    w.pod("wants-a-too", 8, "10m", pool="a")
    w.step(after=MIN)
    # b0 stays free all along: neither may use it
    assert w.starts() == {"wants-a": pytest.approx(29, abs=0.01), "wants-a-too": pytest.approx(39, abs=0.01)}


def test_within_a_queue_priority_goes_first_then_arrival() -> None:
    w = World()
    w.node("n0")
    w.pod("running", 8, "10m")
    w.step()
    w.pod("first", 8, "20m")
    w.step(after=1)
    w.pod("second", 8, "20m")
    w.step(after=1)
    w.pod("urgent", 8, "20m", priority=100, evicts=False)
    w.step(after=1)
    starts = w.starts()
    # from T0: the running pod ends at 10 min, then urgent, first, second 20 min each
    assert starts == {"urgent": pytest.approx(10 - 3 / 60, abs=0.01), "first": pytest.approx(30 - 3 / 60, abs=0.01),
                      "second": pytest.approx(50 - 3 / 60, abs=0.01)}


def test_a_queue_at_its_quota_waits_for_its_own_work_though_nodes_are_free() -> None:
    w = World()
    w.queues(qa=8, qb=8)
    w.node("n0")
    w.node("n1")
    w.node("n2")
    w.pod("qa-running", 8, "60m", queue="qa")
    w.step()
    w.pod("qa-next", 8, "10m", queue="qa")
    qb = w.pod("qb-next", 8, "10m", queue="qb")
    w.step(after=MIN)
    assert w.bound(qb)
    assert w.starts() == {"qa-next": pytest.approx(59, abs=0.01)}


def test_a_job_of_higher_priority_gets_in_by_evicting_once_the_rest_of_its_room_frees() -> None:
    w = World()
    w.node("n0")
    w.node("n1")
    blocker = w.pod("blocker", 8, "10m", priority=200)  # on n0: nobody may evict it
    low = w.pod("low", 8, "60m")  # on n1
    w.step()
    w.group("high", 2)
    high = [w.pod(f"high-{i}", 8, "20m", group="high", priority=100) for i in range(2)]
    w.step(after=MIN)
    # no room now (evicting low frees one node of two); at 10 min n0 frees and low is evicted
    assert w.starts() == {"high": pytest.approx(9, abs=0.01)}
    # and so the scheduler does
    w.finish(blocker)
    w.step(after=9 * MIN)
    assert low not in w.pods
    w.step(after=1)
    assert all(w.bound(u) for u in high)


def _reserved_world() -> World:
    """Two nodes: n0 frees at 10 min, half of n1 at 20 min; a gang of both whole nodes
    waits first, then a long small pod (it would delay the gang), then two short ones: the
    first fits now (it is bound), the second when the first ends."""
    w = World()
    w.node("n0")
    w.node("n1")
    w.pod("r0", 8, "10m")
    w.pod("r1", 4, "20m")
    w.step()
    w.group("gang", 2)
    for i in range(2):
        w.pod(f"gang-{i}", 8, "30m", group="gang")
    w.step(after=1)
    w.pod("long", 4, "60m")
    w.step(after=1)
    w.pod("short", 4, "5m")
    w.pod("after", 4, "5m")
    w.step(after=1)
    return w


def test_a_reservation_lets_only_work_that_ends_before_it_go_ahead() -> None:
    w = _reserved_world()
    starts = w.starts()
    late = 3 / 60  # minutes since T0
    # the short ones end before the gang can start: they go ahead, one after the other
    assert starts["after"] == pytest.approx(5, abs=0.01)
    assert starts["gang"] == pytest.approx(20 - late, abs=0.01)  # when n1 is free enough
    assert starts["long"] == pytest.approx(50 - late, abs=0.01)  # after the gang, not in its way


def test_the_model_over_classes_agrees_with_the_exact_copy() -> None:
    w = _reserved_world()
    w.pod("more", 8, "15m")
    w.step(after=1)
    assert w.starts() == w.starts(exact=True)


def test_every_waiting_job_gets_a_start_and_one_that_fits_no_node_says_so() -> None:
    w = World()
    w.queues(qa=16, qb=16)
    for i in range(4):
        w.node(f"n{i}")
    for i in range(4):
        w.pod(f"run{i}", 8, f"{20 + 10 * i}m", queue="qa" if i % 2 else "qb")
    w.step()
    for i in range(12):
        q = "qa" if i % 3 else "qb"
        if i % 4 == 0:
            w.group(f"g{i}", 2)
            for m in range(2):
                w.pod(f"g{i}-{m}", 4, f"{5 + i}m", group=f"g{i}", queue=q)
        else:
            w.pod(f"p{i}", 1 + i % 8, f"{5 + 3 * i}m", queue=q, priority=10 * (i % 3))
    w.pod("huge", 16, "5m", queue="qa")
    w.step(after=MIN)
    est = w.estimates()
    waiting = [j.key for j in jobs(w.session, w.now) if j.waiting]
    assert len(waiting) >= 10 and set(est) == set(waiting)
    assert [k for k, e in est.items() if e["start"] is None] == ["default/huge"]
    assert "does not start" in est["default/huge"]["basis"]
    assert all(e["start"] >= w.now for e in est.values() if e["start"] is not None)
