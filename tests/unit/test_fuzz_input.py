"""Bad input, drawn by hypothesis, through the parsers and a whole scheduling session.

What a user would check: no object the apiserver could hold makes a parser raise (a
config document raises only :class:`~batchsched.config.ConfigError`, a Queue only
:class:`~batchsched.core.queues.QueueError`); a session fed bad Pods, PodGroups and Queues
next to valid work never raises; every object it cannot use is told so (a pod condition,
a PodGroup Event, a Queue condition), and told once, not on every step; the valid work next
to it is placed whole; nothing is bound where it does not fit, and no gang is half bound.

Valid work lives in its own namespace on nodes with a taint no drawn pod tolerates, so what
the bad work legitimately takes cannot crowd it out; the bad work gets nodes of its own.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.config import ConfigError, parse_config
from batchsched.core.decisions import Decisions
from batchsched.core.devices import GPU_SHARES, KAI_FRACTION, internal
from batchsched.core.gangs import VOLCANO, XK8S, parse_podgroup
from batchsched.core.model import Pod, parse_node, parse_pod
from batchsched.core.queues import QueueError, parse_queue
from batchsched.core.queues.tree import QueueTree
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_node, make_pod
from tests.strategies import (
    RESERVED_TAINT,
    config_documents,
    json_values,
    mangled,
    podgroups,
    pods,
    queues,
    stored_podgroups,
    stored_pods,
    stored_queues,
)

T0 = 1_800_000_000.0
OURS = frozenset({"batchsched"})
VALID = "valid"
FUZZ = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- the parsers ------------------------------------------------------------------------------


@settings(FUZZ, max_examples=150)
@given(pods())
def test_a_pod_the_apiserver_could_hold_is_always_read(obj: dict[str, Any]) -> None:
    pod = parse_pod(obj, OURS)
    assert pod.uid == obj["metadata"]["uid"]
    # what cannot be used is said, not guessed at: an invalid pod asks for nothing but its slot
    if pod.invalid:
        assert pod.requests == {"pods": 1}


@settings(FUZZ, max_examples=150)
@given(podgroups())
def test_a_podgroup_is_always_read_and_a_bad_spec_makes_it_invalid(drawn: tuple[str, dict[str, Any]]) -> None:
    api, obj = drawn
    group = parse_podgroup(api, obj)
    spec = obj.get("spec")
    min_member = spec.get("minMember") if isinstance(spec, dict) else None
    if not (isinstance(min_member, int) and not isinstance(min_member, bool) and 0 < min_member < 2**31):
        assert group.invalid  # no guessed quorum
    assert group.min_member >= 1


@settings(FUZZ, max_examples=150)
@given(st.lists(queues(), max_size=5))
def test_every_queue_is_either_in_the_tree_or_told_why_not(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        with contextlib.suppress(QueueError):
            parse_queue(obj)
    unique = list({str(o["metadata"]["name"]): o for o in objs}.values())
    tree = QueueTree.from_objects(unique, ("cpu", "memory", "nvidia.com/gpu", "pods"))
    for obj in unique:
        name = obj["metadata"]["name"]
        status = tree.status(name, pending=0, admitted=0)
        [active] = [c for c in status["conditions"] if c["type"] == "Active"]
        assert (active["reason"] == "Ready") == (name in tree and name not in tree.errors), active
        if active["reason"] == "InvalidSpec":
            assert active["message"].startswith(f"queue {name}")


def test_queue_cycles_and_self_parents_are_invalid_and_their_children_too() -> None:
    def q(name: str, parent: str | None) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"parent": parent} if parent else {}}

    tree = QueueTree.from_objects([q("a", "b"), q("b", "a"), q("c", "a"), q("s", "s"), q("ok", None)], ("cpu",))
    assert str(tree.errors["a"]) == "queue a: parent chain a -> b -> a is a cycle"
    assert str(tree.errors["c"]) == "queue c: parent a is invalid"
    assert str(tree.errors["s"]) == "queue s: is its own parent"
    assert "ok" in tree and "ok" not in tree.errors


@settings(FUZZ, max_examples=300)
@given(config_documents())
def test_a_config_document_is_read_or_refused_with_a_config_error(doc: Any) -> None:
    try:
        cfg = parse_config(doc)
    except ConfigError as exc:
        assert str(exc).startswith("config: ")
    else:
        cfg.session_settings()


@pytest.mark.parametrize(("doc", "message"), [
    # a whole number past any float raised OverflowError
    ({"cycle": {"retryUnschedulableSeconds": 10**400}},
     "config: cycle.retryUnschedulableSeconds: expected a finite number, got 1000"),
    # .nan passed every "greater than 0" check
    ({"cycle": {"retryUnschedulableSeconds": float("nan")}},
     "config: cycle.retryUnschedulableSeconds: expected a finite number, got nan"),
    ({"leaderElection": {"leaseDurationSeconds": float("inf")}},
     "config: leaderElection.leaseDurationSeconds: expected a finite number, got inf"),
    # a digit str.isdigit() knows and int() refuses raised ValueError
    ({"metricsAddress": "127.0.0.1:³"}, "config: metricsAddress: expected host:port, got '127.0.0.1:³'"),
    # accepted: a billion status writer tasks started at once
    ({"status": {"concurrency": 10**9}}, "config: status.concurrency: must be at most 1024, got 1000000000"),
    # int(inf) raised OverflowError
    ({"scoring": {"resources": [{"name": "nvidia.com/gpu", "weight": float("inf")}]}},
     "config: scoring: each resource needs name and weight"),
])
def test_config_values_no_setting_can_have_are_config_errors(doc: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(doc)
    assert str(caught.value).startswith(message)


def test_a_card_record_with_a_digit_int_refuses_is_no_record() -> None:
    # "³" is a digit to str.isdigit(); reading it raised ValueError out of parse_pod, so a pod
    # the apiserver holds (annotations are any string) was never scheduled
    obj = make_pod("share").req(cpu="1").annotate({KAI_FRACTION: "0.5", "batchsched.io/gpu-cards": "main=³"}).obj()
    pod = parse_pod(obj, OURS)
    assert pod.card_asks and pod.cards is None and not pod.invalid
    fullwidth = make_pod("share").annotate({KAI_FRACTION: "0.5", "batchsched.io/gpu-cards": "main=３"}).obj()  # noqa: RUF001
    assert parse_pod(fullwidth, OURS).cards is None


# -- a whole session ------------------------------------------------------------------------


def _nodes() -> list[dict[str, Any]]:
    gpus = {"nvidia.com/gpu": "8"}
    shared = {**gpus, "elasticgpu.io/gpu-core": "800", "elasticgpu.io/gpu-memory": "65536"}
    return [
        *(make_node(n).cap(cpu="64", memory="512Gi", **shared).label(
            {"zone": "a", "batchsched.io/rack": "r0"}).obj() for n in ("n0", "n1")),
        *(make_node(n).cap(cpu="64", memory="512Gi", **gpus).taint(RESERVED_TAINT, "yes").label(
            pool=VALID).obj() for n in ("v0", "v1")),
    ]


def _valid_work() -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """Three single pods, a scheduler-plugins gang and a kube-batch-annotated Volcano gang:
    9 of the 16 GPUs of the reserved nodes."""
    def pod(name: str) -> Any:
        return make_pod(name, VALID).req(cpu="1", gpu=1).tolerate(RESERVED_TAINT).selector(pool=VALID).created(T0 - 60)

    objs = [pod(f"single-{i}").obj() for i in range(3)]
    objs += [pod(f"vg-{i}").req(gpu=2).group("vg").obj() for i in range(2)]
    objs += [pod(f"vv-{i}").group("vv", via="annotation").obj() for i in range(2)]
    groups = [(XK8S, make_group("vg", VALID).min_member(2).obj()),
              (VOLCANO, make_group("vv", VALID).volcano().min_member(2).obj())]
    return objs, groups


class _World:
    """The apiserver's side: applies bindings and card clean-ups, and feeds them back."""

    def __init__(self, pod_objs: list[dict[str, Any]], groups: list[tuple[str, dict[str, Any]]],
                 queue_objs: list[dict[str, Any]], *, as_events: bool) -> None:
        self.session = s = Session(SessionSettings(gang_report_delay=1.0), use_jit=False)
        s.on_nodes_listed([parse_node(o) for o in _nodes()])
        self.objs: dict[str, dict[str, Any]] = {}
        seen: set[tuple[str, str]] = set()
        for o in pod_objs:  # the apiserver holds one pod per name and uid
            key = (o["metadata"]["namespace"], o["metadata"]["name"])
            if key not in seen and o["metadata"]["uid"] not in self.objs:
                seen.add(key)
                self.objs[o["metadata"]["uid"]] = copy.deepcopy(o)
        self.parsed: dict[str, Pod] = {}
        for uid, o in self.objs.items():
            with contextlib.suppress(Exception):
                self.parsed[uid] = parse_pod(o, OURS)
        by_api: dict[str, dict[str, Any]] = {XK8S: {}, VOLCANO: {}}
        for api, o in groups:
            by_api[api].setdefault(o["metadata"]["name"], parse_podgroup(api, o))
        self.groups = [g for gs in by_api.values() for g in gs.values()]
        s.on_queues_listed(list({str(q["metadata"]["name"]): q for q in queue_objs}.values()))
        if as_events:
            for api in by_api:
                s.on_groups_listed(api, [])
            for g in self.groups:
                s.on_podgroup("ADDED", g)
            s.on_pods_listed([])
            for p in self.parsed.values():
                s.on_pod("ADDED", p)
        else:
            for api, gs in by_api.items():
                s.on_groups_listed(api, list(gs.values()))
            s.on_pods_listed(list(self.parsed.values()))
        self.steps: list[Decisions] = []
        self.bound: set[str] = set()
        self.evicted: set[str] = set()
        self.now = T0

    def run(self, steps: int, *, every: float = 2.0) -> None:
        now = self.now
        for _ in range(steps):
            for uid in [u for u in self.evicted if u in self.objs]:
                self.session.on_pod("DELETED", self.parsed.pop(uid))
                del self.objs[uid]
                self.bound.discard(uid)
            d = self.session.step(now)
            self.steps.append(d)
            for b in d.binds:
                o = self.objs[b.uid]
                o["spec"]["nodeName"], o["status"]["phase"] = b.node, "Running"
                self.bound.add(b.uid)
                self.session.on_bind_result(b, "bound", now=now)
                self._modified(b.uid)
            for e in d.evictions:  # the Eviction API: the pod terminates, and is gone by the next step
                if e.uid in self.objs and e.uid not in self.evicted:
                    self.objs[e.uid]["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
                    self.evicted.add(e.uid)
                    self.session.on_evict_result(e, "evicted")
                    self._modified(e.uid)
            for ref, notes, labels in d.cleanups:
                meta = self.objs[ref.uid]["metadata"]
                for k in notes:
                    meta.get("annotations", {}).pop(k, None)
                for k in labels:
                    meta.get("labels", {}).pop(k, None)
                self._modified(ref.uid)
            now += every
        self.now = now

    def write_conditions(self) -> None:
        """The status writer's part: each pod shows the last condition it was told."""
        for d in self.steps:
            for c in d.unschedulable:
                obj = self.objs[c.ref.uid]
                if not isinstance(obj.get("status"), dict):
                    obj["status"] = {}
                status = obj["status"]
                old = status.get("conditions")
                status["conditions"] = [x for x in old if isinstance(x, dict) and x.get("type") != "PodScheduled"] \
                    if isinstance(old, list) else []
                status["conditions"].append({"type": "PodScheduled", "status": "False", "reason": c.reason,
                                             "message": c.message})
                self.parsed[c.ref.uid] = parse_pod(self.objs[c.ref.uid], OURS)

    def relist(self, queue_objs: list[dict[str, Any]]) -> None:
        s = self.session
        for api in (XK8S, VOLCANO):
            s.on_groups_listed(api, [g for g in self.groups if g.api == api])
        s.on_pods_listed(list(self.parsed.values()))
        s.on_queues_listed(list({str(q["metadata"]["name"]): q for q in queue_objs}.values()))

    def _modified(self, uid: str) -> None:
        self.parsed[uid] = parse_pod(self.objs[uid], OURS)
        self.session.on_pod("MODIFIED", self.parsed[uid])

    def node_of(self, uid: str) -> str:
        return str(self.objs[uid]["spec"].get("nodeName") or "")


def _check_world(w: _World, queue_objs: list[dict[str, Any]]) -> None:
    # the valid work is placed, on its own nodes
    for uid, o in w.objs.items():
        if o["metadata"]["namespace"] == VALID:
            assert w.node_of(uid) in ("v0", "v1"), f"{o['metadata']['name']} was not placed"
    # nothing bound where it does not fit; no bad pod on the reserved nodes
    alloc = {o["metadata"]["name"]: parse_node(o).allocatable for o in _nodes()}
    used: dict[str, Counter[str]] = defaultdict(Counter)
    for uid in w.bound:
        node = w.node_of(uid)
        if node.startswith("v"):
            assert w.objs[uid]["metadata"]["namespace"] == VALID
        for r, v in w.parsed[uid].requests.items():
            if not internal(r) and r != GPU_SHARES:
                used[node][r] += v
    for node, u in used.items():
        for r, v in u.items():
            assert v <= alloc[node].get(r, 0), f"{node} over-committed on {r}: {v}"
    # no gang half bound
    for g in w.session.groups.groups.values():
        placed = sum(1 for uid in w.session.groups.member_uids(g) if uid in w.bound)
        assert placed == 0 or placed >= g.min_member, f"{g.key}: {placed} of {g.min_member} bound"
        assert not (g.invalid and placed), f"invalid {g.key} was placed"
    # every pod of ours left waiting is told why, and never the same twice in a row
    told: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for d in w.steps:
        for c in d.unschedulable:
            told[c.ref.uid].append((c.reason, c.message))
    for uid, said in told.items():
        assert all(a != b for a, b in itertools.pairwise(said)), f"{uid} told twice: {said}"
    for uid, p in w.parsed.items():
        waiting = p.scheduler_name in OURS and not w.node_of(uid) and not p.gated and not p.deleting
        # (a pod that shows a nomination waits for its victims, as it was told when it preempted)
        if waiting and not p.terminal and not p.nominated_node:
            assert uid in told, f"{p.key} waits and was never told why ({p.invalid or 'valid'})"
        if p.invalid:
            assert uid not in w.bound
    # Events are not repeated
    events = Counter((e.ref, e.reason, e.message) for d in w.steps for e in d.events)
    assert [k for k, n in events.items() if n > 1] == []
    # an invalid PodGroup is told so; statuses settle (no A, B, A while nothing changes)
    invalid_told = {e.ref.uid for d in w.steps for e in d.events if e.reason == "InvalidPodGroup"}
    for g in w.session.groups.groups.values():
        if g.invalid:
            assert g.uid in invalid_told, f"{g.key} is invalid ({g.invalid}) and was not told"
    for key, history in _histories([(g.key, st_) for d in w.steps for g, st_ in d.group_statuses]).items():
        assert len(history) == len(set(map(repr, history))), f"{key} status flaps: {history}"
    for key, history in _histories([(n, st_) for d in w.steps for n, st_ in d.queue_statuses]).items():
        assert len(history) == len(set(map(repr, history))), f"queue {key} status flaps: {history}"
    # each Queue's status says whether it can be used, and why not
    last = {name: st_ for d in w.steps for name, st_ in d.queue_statuses}
    unique = list({str(q["metadata"]["name"]): q for q in queue_objs}.values())
    tree = QueueTree.from_objects(unique, ())
    for obj in unique:
        name = obj["metadata"]["name"]
        [active] = [c for c in last[name]["conditions"] if c["type"] == "Active"]
        assert (active["reason"] == "InvalidSpec") == (name in tree.errors or name not in tree), active


def _histories(items: list[tuple[str, Any]]) -> dict[str, list[Any]]:
    """Each key's values, repeats in a row dropped (the writers drop those)."""
    out: dict[str, list[Any]] = defaultdict(list)
    for key, value in items:
        if not out[key] or out[key][-1] != value:
            out[key].append(value)
    return out


def _bad_pods(draw: st.DrawFn) -> list[dict[str, Any]]:
    objs = draw(st.lists(st.one_of(pods(), pods(), stored_pods(), mangled(pods())), max_size=8))
    for i, o in enumerate(objs):  # one uid each (names may repeat: the first is kept)
        o["metadata"]["uid"] = f"uid-fuzz-{i}"
        o["metadata"].setdefault("creationTimestamp", "2027-01-15T07:00:00Z")
        o.setdefault("status", {"phase": "Pending"})
    return objs


@st.composite
def _bad_world(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]], list[dict[str, Any]], bool]:
    return (_bad_pods(draw), draw(st.lists(st.one_of(podgroups(), stored_podgroups()), max_size=3)),
            draw(st.lists(st.one_of(queues(), stored_queues()), max_size=4)), draw(st.booleans()))


def test_the_valid_work_alone_is_placed() -> None:
    valid, groups = _valid_work()
    w = _World(valid, groups, [], as_events=False)
    w.run(3)
    _check_world(w, [])
    assert len(w.bound) == len(valid)


@settings(FUZZ, max_examples=60)
@given(_bad_world())
def test_a_session_fed_bad_input_next_to_valid_work(world: Any) -> None:
    bad_pods, bad_groups, bad_queues, as_events = world
    bad_queues = [q for q in bad_queues if q["metadata"]["name"]]  # the intake skips a Queue without a name
    valid, groups = _valid_work()
    w = _World(valid + bad_pods, groups + bad_groups, bad_queues, as_events=as_events)
    w.run(8)
    _check_world(w, bad_queues)
    # nothing changes: a few more steps tell nobody anything new
    quiet = len(w.steps)
    w.run(3, every=1.0)
    for d in w.steps[quiet:]:
        assert d.binds == [] and d.events == [] and d.unschedulable == []
    # nor does a relist of everything (a watch that expired), the pods showing what they were told
    w.write_conditions()
    w.relist(bad_queues)
    quiet = len(w.steps)
    w.run(3, every=1.0)
    for d in w.steps[quiet:]:
        assert d.binds == [] and d.events == [] and [c.ref.name for c in d.unschedulable] == []
    # nor the retries of the minutes after (the unschedulable retry, the sweeps)
    w.run(6, every=37.0)
    _check_world(w, bad_queues)
    told = Counter((c.ref.uid, c.reason, c.message) for d in w.steps for c in d.unschedulable)
    assert [k for k, n in told.items() if n > 1] == []


@settings(FUZZ, max_examples=100)
@given(st.lists(json_values, max_size=3))
def test_a_podgroup_spec_of_any_json_is_read(specs: list[Any]) -> None:
    for spec in specs:
        for api in (XK8S, VOLCANO):
            group = parse_podgroup(api, {"metadata": {"name": "g", "namespace": "fuzz"}, "spec": spec})
            if not isinstance(spec, dict):
                assert group.invalid


def test_a_gang_of_pods_whose_names_hold_digits_int_refuses_is_ordered_and_placed() -> None:
    # "³" is a digit to str.isdigit(): ordering the members by name raised ValueError
    objs = [make_pod(f"w{i}³", VALID).req(cpu="1", gpu=1).tolerate(RESERVED_TAINT).selector(pool=VALID).group("g").obj()
            for i in range(2)]
    w = _World(objs, [(XK8S, make_group("g", VALID).min_member(2).obj())], [], as_events=False)
    w.run(2)
    assert len(w.bound) == 2


def test_a_podgroup_asking_for_more_than_batchsched_counts_is_told_so_not_that_it_is_no_quantity() -> None:
    # "8Pi" of memory is a quantity the apiserver stores; the group was told it "is not a quantity"
    group = make_group("huge").min_member(1).min_resources(memory="8Pi").build()
    assert group.invalid == (
        "spec.minResources.memory: quantity '8Pi' of memory is beyond what batchsched counts (at most 1024Ti)")
    assert make_group("odd").min_resources(cpu="lots").build().invalid == "spec.minResources.cpu: 'lots' is not a quantity"


def test_a_pod_whose_labels_hold_other_types_than_strings_is_read_with_strings() -> None:
    # a label value of another type (no apiserver holds one) reached the class index and
    # the queue tree as it was: a list made the session raise TypeError (unhashable), which
    # stops the replica, where an unreadable object is reported and skipped
    obj = make_pod("odd", "fuzz").req(cpu="1").obj()
    obj["metadata"]["labels"] = {"batchsched.io/queue": ["qa"], "rank": 3}
    pod = parse_pod(obj, OURS)
    assert pod.labels == {"batchsched.io/queue": "['qa']", "rank": "3"}
    w = _World([obj], [], [], as_events=False)
    w.run(2)
    [told] = [c for d in w.steps for c in d.unschedulable]
    assert "queue ['qa'] does not exist" in told.message


def test_a_gang_below_quorum_whose_bound_member_is_terminating_is_not_timed_out_again_and_again() -> None:
    # found with a drawn pod bound and being deleted: every back-off announced
    # "evicting the 1 bound member(s)" (GangTimeout) and "1 of 2 ... placed" (GangIncomplete)
    # again, while there was nothing to evict
    stuck = make_pod("stuck", "fuzz").req(cpu="1").group("g").node("n0").deleting("2027-01-15T08:00:00Z").obj()
    waiting = make_pod("waiting", "fuzz").req(cpu="1", gpu=64).group("g").obj()
    w = _World([stuck, waiting], [(XK8S, make_group("g", "fuzz").min_member(2).timeout(30).obj())], [],
               as_events=False)
    w.run(30, every=20.0)
    reasons = [e.reason for d in w.steps for e in d.events]
    assert "GangTimeout" not in reasons and "GangIncomplete" not in reasons, reasons
    assert [e for d in w.steps for e in d.evictions] == []
