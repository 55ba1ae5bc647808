"""What ``batchsched explain``, the job and queue views and the start estimates say, on the
real session with a fake clock; and suspended jobs and stopped queues."""

from __future__ import annotations

from typing import Any

from batchsched.core.decisions import Decisions
from batchsched.core.gangs import parse_podgroup
from batchsched.core.model import format_time, parse_node, parse_pod
from batchsched.core.session import Session, SessionSettings
from batchsched.insight.explain import Insight
from tests.builders import make_group, make_node, make_pod

T0 = 1_800_000_000.0
GPU = "nvidia.com/gpu"
XK8S = "scheduling.x-k8s.io"


class World:
    """A session and the apiserver's side of its decisions, applied at once."""

    def __init__(self) -> None:
        self.session = Session(SessionSettings())
        self.now = T0
        self.pods: dict[str, dict[str, Any]] = {}

    def node(self, name: str, gpus: int) -> None:
        self.session.on_node("ADDED", parse_node(make_node(name).cap(cpu="64", memory="512Gi", **{GPU: str(gpus)}).obj()))

    def group(self, name: str, min_member: int, **annotations: str) -> None:
        g = make_group(name).min_member(min_member).created(self.now)
        if annotations:
            g = g.annotate(annotations)
        self.session.on_podgroup("ADDED", parse_podgroup(XK8S, g.obj()))

    def pod(self, name: str, gpus: int, *, group: str = "", runtime: str = "", queue: str = "",
            priority: int = 0) -> str:
        b = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(self.now).priority(priority)
        if group:
            b = b.group(group)
        if runtime:
            b = b.annotate({"batchsched.io/expected-runtime": runtime})
        if queue:
            b = b.label({"batchsched.io/queue": queue})
        obj = b.obj()
        self.pods[obj["metadata"]["uid"]] = obj
        self.session.on_pod("ADDED", parse_pod(obj))
        return str(obj["metadata"]["uid"])

    def finish(self, uid: str) -> None:
        self.pods[uid]["status"]["phase"] = "Succeeded"
        self.session.on_pod("MODIFIED", parse_pod(self.pods[uid]))

    def step(self, after: float = 0.0) -> Decisions:
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
        return d

    def bound(self, uid: str) -> bool:
        return bool(self.pods.get(uid, {}).get("spec", {}).get("nodeName"))


def _two_jobs_behind_a_running_one(w: World) -> tuple[list[str], list[str], list[str]]:
    w.node("n0", 8)
    w.node("n1", 8)
    w.group("first", 2)
    first = [w.pod(f"first-{i}", 8, group="first", runtime="10m") for i in range(2)]
    w.step()
    assert all(w.bound(u) for u in first)
    w.group("second", 2)
    second = [w.pod(f"second-{i}", 8, group="second", runtime="30m") for i in range(2)]
    w.step(after=60)
    w.group("third", 2)
    third = [w.pod(f"third-{i}", 8, group="third", runtime="5m") for i in range(2)]
    w.step(after=60)
    return first, second, third


def test_a_waiting_gang_is_explained_with_its_resource_numbers_position_and_start() -> None:
    w = World()
    _two_jobs_behind_a_running_one(w)
    insight = Insight(w.session, use_jit=False)
    insight.refresh(w.now)
    out = insight.explain(w.now, kind="podgroup", namespace="default", name="third")
    job = out["job"]
    assert job["state"] in ("queued", "reserved")
    assert job["members"] == {"bound": 0, "required": 2, "total": 2}
    assert job["gpus"] == 16
    assert job["position"] == 2 and job["queueLength"] == 2
    assert [a["name"] for a in out["ahead"]] == ["second"]
    # the first job ends 10 minutes after it started (2 minutes ago); the second then runs 30
    e = job["estimate"]
    assert e["confidence"] == "high"
    assert abs(e["start"] - (T0 + 600 + 1800)) <= 12
    second = insight.explain(w.now, kind="pod", namespace="default", name="second-1")["job"]
    assert second["name"] == "second" and second["position"] == 1
    assert abs(second["estimate"]["start"] - (T0 + 600)) <= 12
    assert "nvidia.com/gpu" in second["message"]
    text = "\n".join(out["summary"])
    assert "2 of 2 waiting in unqueued work" in text
    assert "ahead: default/second" in text
    assert "expected to start in about" in text


def test_the_estimate_uses_the_observed_run_time_of_like_pods_when_none_is_declared() -> None:
    w = World()
    w.node("n0", 8)
    done = w.pod("etl-a1", 8)
    w.step()
    w.finish(done)
    w.step(after=300)  # it ran 5 minutes
    running = w.pod("etl-b2", 8)
    w.step()
    assert w.bound(running)
    w.pod("etl-c3", 8)
    w.step(after=60)
    insight = Insight(w.session, use_jit=False)
    insight.refresh(w.now)
    e = insight.explain(w.now, kind="pod", namespace="default", name="etl-c3")["job"]["estimate"]
    assert e["confidence"] == "medium"
    assert "run times of like pods" in e["basis"]
    assert abs(e["start"] - (w.now - 60 + 300)) <= 12


def test_a_job_behind_pods_that_declare_no_end_gets_no_estimate_and_says_why() -> None:
    w = World()
    w.node("n0", 8)
    w.pod("server", 8)
    w.step()
    w.pod("waiter", 8)
    w.step(after=5)
    insight = Insight(w.session, use_jit=False)
    insight.refresh(w.now)
    e = insight.explain(w.now, kind="pod", namespace="default", name="waiter")["job"]["estimate"]
    assert e["start"] is None and e["confidence"] == "none"
    assert "declare no end" in e["basis"]


def test_the_first_estimate_is_judged_when_the_job_starts() -> None:
    w = World()
    first, second, _ = _two_jobs_behind_a_running_one(w)
    insight = Insight(w.session, use_jit=False)
    insight.refresh(w.now)
    made_at = w.now
    estimated = insight.first["x-k8s:default/second"][1]
    for u in first:
        w.finish(u)
    w.step(after=600 - 120)
    w.step(after=2)
    assert all(w.bound(u) for u in second)
    err = insight.started("x-k8s:default/second", w.now)
    assert err is not None
    assert err.seconds == w.now - estimated
    assert err.relative == abs(w.now - estimated) / (w.now - made_at)
    assert err.relative < 0.2


def test_a_suspended_gang_is_evicted_whole_held_and_placed_again_when_resumed() -> None:
    w = World()
    w.node("n0", 8)
    w.group("job", 2)
    members = [w.pod(f"job-{i}", 4, group="job") for i in range(2)]
    w.step()
    assert all(w.bound(u) for u in members)
    w.group("job", 2, **{"batchsched.io/suspend": "true"})
    d = w.step(after=1)
    assert sorted(e.uid for e in d.evictions) == sorted(members)
    assert {e.cause for e in d.evictions} == {"suspended"}
    # the operator recreates them: they are held, and told why once
    again = [w.pod(f"job-{i}b", 4, group="job") for i in range(2)]
    d = w.step(after=3)
    assert not any(w.bound(u) for u in again)
    d = w.step(after=3)
    assert d.evictions == [] and d.binds == []
    job = Insight(w.session, use_jit=False).explain(w.now, kind="podgroup", namespace="default", name="job")["job"]
    assert job["state"] == "suspended"
    assert "is suspended" in job["message"]
    w.group("job", 2)
    w.step(after=1)
    assert all(w.bound(u) for u in again)


def _queue(name: str, gpus: int, *, stop: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": [{"name": GPU, "nominal": str(gpus)}]}
    if stop:
        spec["stopPolicy"] = stop
    return {"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"}, "spec": spec}


def test_a_held_queue_admits_nothing_new_and_a_drained_one_evicts_what_runs() -> None:
    w = World()
    w.node("n0", 8)
    w.session.on_queues_listed([_queue("team", 8)])
    running = w.pod("a", 4, queue="team")
    w.step()
    assert w.bound(running)
    w.session.on_queue("MODIFIED", _queue("team", 8, stop="Hold"))
    waiting = w.pod("b", 4, queue="team")
    d = w.step(after=1)
    assert not w.bound(waiting) and d.evictions == []
    assert w.bound(running)
    insight = Insight(w.session, use_jit=False)
    job = insight.explain(w.now, kind="pod", namespace="default", name="b")["job"]
    assert job["state"] == "queue-stopped"
    assert job["message"] == "queue team is stopped (stopPolicy Hold): it admits no new work until its stopPolicy is None"
    q = insight.explain(w.now, kind="queue", name="team")["queue"]
    assert q["state"] == "Hold" and q["pending"] == 1 and q["admitted"] == 1
    w.session.on_queue("MODIFIED", _queue("team", 8, stop="HoldAndDrain"))
    d = w.step(after=1)
    assert [e.uid for e in d.evictions] == [running]
    assert d.evictions[0].cause == "drained"
    w.session.on_queue("MODIFIED", _queue("team", 8))
    w.step(after=1)
    assert w.bound(waiting)


def test_the_views_count_queues_jobs_and_cards() -> None:
    w = World()
    w.node("n0", 8)
    w.node("n1", 8)
    w.session.on_queues_listed([_queue("team", 16)])
    w.pod("a", 3, queue="team")
    w.pod("b", 8, queue="team")
    w.step()
    w.pod("c", 8, queue="team")
    w.step(after=1)
    insight = Insight(w.session, use_jit=False)
    q = insight.queues(w.now)["queues"][0]
    assert (q["name"], q["pending"], q["admitted"]) == ("team", 1, 2)
    gpu = q["resources"][0]
    assert (gpu["name"], gpu["unit"], gpu["nominal"], gpu["used"]) == (GPU, "cards", 16, 11)
    nodes = insight.nodes(w.now)["nodes"]
    assert [n["gpus"] for n in nodes] == [8, 8]
    assert sum(n["gpusUsed"] for n in nodes) == 11
    rows = insight.jobs(w.now, queue="team")["jobs"]
    assert sorted((r["name"], r["state"]) for r in rows) == [("a", "running"), ("b", "running"), ("c", "queued")]


def test_a_cohort_counts_the_jobs_of_the_queues_under_it() -> None:
    w = World()
    w.node("n0", 8)
    org = {"metadata": {"name": "org", "uid": "q-org", "resourceVersion": "1"}, "spec": {}}
    team = _queue("team", 8)
    team["spec"]["parent"] = "org"
    w.session.on_queues_listed([org, team])
    w.pod("a", 8, queue="team")
    w.step()
    w.pod("b", 8, queue="team")
    w.step(after=1)
    rows = {q["name"]: q for q in Insight(w.session, use_jit=False).queues(w.now)["queues"]}
    assert (rows["team"]["pending"], rows["team"]["admitted"]) == (1, 1)
    assert (rows["org"]["pending"], rows["org"]["admitted"]) == (1, 1)
    assert rows["org"]["parent"] is None and rows["team"]["parent"] == "org"


def test_a_job_held_since_the_last_estimate_shows_no_start() -> None:
    w = World()
    w.node("n0", 8)
    w.group("first", 1)
    w.pod("first-0", 8, group="first", runtime="10m")
    w.step()
    w.group("next", 1)
    w.pod("next-0", 8, group="next", runtime="10m")
    w.step(after=5)
    insight = Insight(w.session, use_jit=False)
    insight.refresh(w.now)
    assert insight.explain(w.now, kind="podgroup", namespace="default", name="next")["job"]["estimate"]["start"]
    w.group("next", 1, **{"batchsched.io/suspend": "true"})
    w.step(after=1)
    e = insight.explain(w.now, kind="podgroup", namespace="default", name="next")["job"]["estimate"]
    assert e["start"] is None and "held until a person acts" in e["basis"]


def test_a_forward_run_cut_short_says_how_far_it_got() -> None:
    w = World()
    _two_jobs_behind_a_running_one(w)
    asked = []

    def once() -> bool:
        asked.append(1)
        return len(asked) <= 1  # one cycle of the copy, then stop

    insight = Insight(w.session, use_jit=False)
    insight.keep(insight.forward(w.now, keep_going=once)(), w.now)
    e = insight.explain(w.now, kind="podgroup", namespace="default", name="third")["job"]["estimate"]
    assert e["start"] is None and e["confidence"] == "none"
    assert e["basis"].startswith("no start estimate: later than in about")
    assert "after 1 cycles" in e["basis"]
