"""Pod topology spread and required inter-pod (anti-)affinity, through the session.

Each test drives a :class:`~batchsched.core.session.Session` on a fake clock with the
in-memory :class:`~tests.unit.test_session.Cluster`, and checks where pods land and what
the pods that do not land are told.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from batchsched.core.cycle import Cycle
from batchsched.core.mirror import ClusterState
from batchsched.core.model import parse_node, parse_pod
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import single_unit
from batchsched.core.reservation import ReservationSettings
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_node, make_pod
from tests.unit.test_session import T0, Cluster

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def node(c: Cluster, name: str, *, zone: str = "", cpu: str = "8", **labels: str) -> None:
    b = make_node(name).cap(cpu=cpu, memory="64Gi").label({HOST: name, **labels})
    if zone:
        b = b.label({ZONE: zone})
    obj = b.obj()
    c.nodes[name] = obj
    c.session.on_node("ADDED", parse_node(obj))


def pod(name: str, *, labels: dict[str, str] | None = None, group: str = "", cpu: str = "1",
        namespace: str = "default") -> dict[str, Any]:
    b = make_pod(name, namespace).req(cpu=cpu).created(T0 - 60).label(labels or {"app": "web"})
    if group:
        b = b.group(group)
    obj: dict[str, Any] = b.obj()
    obj.setdefault("status", {})
    return obj


def spread(obj: dict[str, Any], *, key: str = HOST, skew: int = 1, when: str = "DoNotSchedule",
           match: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    obj["spec"].setdefault("topologySpreadConstraints", []).append({
        "maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when,
        "labelSelector": {"matchLabels": match if match is not None else {"app": "web"}}, **extra,
    })
    return obj


def term(obj: dict[str, Any], kind: str, match: dict[str, str], *, key: str = HOST,
         **extra: Any) -> dict[str, Any]:
    aff = obj["spec"].setdefault("affinity", {}).setdefault(kind, {})
    aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {"labelSelector": {"matchLabels": match}, "topologyKey": key, **extra}
    )
    return obj


def cluster(*names: str, reserve: bool = False) -> Cluster:
    """Nodes of 8 CPUs labelled with their hostname; reservations off unless asked, so
    that the messages are the nodes' own."""
    c = Cluster(Session(SessionSettings(reservation=ReservationSettings(enabled=reserve))))
    for name in names:
        node(c, name)
    return c


def where(c: Cluster, uids: list[str]) -> Counter[str]:
    return Counter(c.node_of(u) for u in uids)


def message(c: Cluster, uid: str) -> str:
    d = c.decisions[-1]
    return next(u.message for u in d.unschedulable if u.ref.uid == uid)


# -- topology spread -----------------------------------------------------------------------


def test_three_pods_spread_over_hostname_land_on_three_nodes() -> None:
    c = cluster("a", "b", "c")
    uids = [c.pod(spread(pod(f"w{i}"))) for i in range(3)]
    c.step()
    assert where(c, uids) == Counter({"a": 1, "b": 1, "c": 1})


def test_without_spread_the_pods_pack_on_one_node() -> None:
    # the same pods without the constraint: the batched path, unchanged (packing by default)
    c = cluster("a", "b", "c")
    uids = [c.pod(pod(f"w{i}")) for i in range(3)]
    c.step()
    assert len(where(c, uids)) >= 1
    assert all(c.node_of(u) for u in uids)


def test_spread_counts_running_pods_and_refuses_beyond_max_skew() -> None:
    c = cluster("a", "b")
    first = c.pod(pod("old", labels={"app": "web"}))
    c.step()
    busy = c.node_of(first)
    free = "b" if busy == "a" else "a"
    one = c.pod(spread(pod("w1")))
    c.step()
    assert c.node_of(one) == free
    two = c.pod(spread(pod("w2")))
    c.step()
    assert c.node_of(two) in ("a", "b")  # 1 and 1: either
    # two pods of 4 CPUs spread over a and b; a third of 8 CPUs fits on neither
    c2 = cluster("a", "b")
    for i in range(2):
        u = c2.pod(spread(pod(f"x{i}", cpu="4")))
        c2.step()
        assert c2.node_of(u)
    big = c2.pod(spread(pod("x2", cpu="8")))
    c2.step()
    assert not c2.node_of(big)
    assert message(c2, big) == "0/2 nodes fit: 2 insufficient cpu."


def test_a_pod_that_would_break_the_skew_is_told_why_with_counts() -> None:
    c = cluster("a", "b", "c")
    # three pods of app=web on a, none on b and c; b and c have no room
    for i in range(3):
        obj = pod(f"old{i}")
        obj["spec"]["nodeName"] = "a"
        obj["status"]["phase"] = "Running"
        c.pod(obj)
    for name in ("b", "c"):
        obj = pod(f"filler-{name}", labels={"app": "other"}, cpu="8")
        obj["spec"]["nodeName"] = name
        obj["status"]["phase"] = "Running"
        c.pod(obj)
    u = c.pod(spread(pod("new")))
    c.step()
    assert not c.node_of(u)
    assert message(c, u) == (
        "0/3 nodes fit: 2 insufficient cpu, 1 node(s) didn't match pod topology spread constraints."
    )


def test_nodes_without_the_topology_label_are_refused() -> None:
    c = cluster()
    node(c, "a", zone="z1")
    node(c, "b")
    u = c.pod(spread(pod("w"), key=ZONE))
    c.step()
    assert c.node_of(u) == "a"
    v = c.pod(spread(pod("v", cpu="8"), key=ZONE))
    c.step()
    assert message(c, v) == (
        "0/2 nodes fit: 1 insufficient cpu, "
        "1 node(s) didn't match pod topology spread constraints (missing required label)."
    )


def test_zones_spread_and_min_domains() -> None:
    c = cluster()
    for name, zone in (("a1", "z1"), ("a2", "z1"), ("b1", "z2")):
        node(c, name, zone=zone)
    uids = [c.pod(spread(pod(f"w{i}"), key=ZONE)) for i in range(4)]
    c.step()
    zones = Counter(c.nodes[c.node_of(u)]["metadata"]["labels"][ZONE] for u in uids)
    assert zones == Counter({"z1": 2, "z2": 2})
    # minDomains 3 with two zones: the global minimum is 0, so each zone takes maxSkew pods
    d = cluster()
    for name, zone in (("a1", "z1"), ("b1", "z2")):
        node(d, name, zone=zone)
    uids = [d.pod(spread(pod(f"m{i}"), key=ZONE, minDomains=3)) for i in range(3)]
    d.step()
    assert sorted(bool(d.node_of(u)) for u in uids) == [False, True, True]


def test_node_affinity_policy_and_taints_policy() -> None:
    # the pod selects pool=x; node c (pool=y) holds 2 matching pods. Honor: c is not a domain
    def setup(policy: str) -> tuple[Cluster, str]:
        c = cluster()
        node(c, "a", pool="x")
        node(c, "b", pool="x")
        node(c, "c", pool="y")
        for i in range(2):
            obj = pod(f"old{i}")
            obj["spec"]["nodeName"] = "c"
            obj["status"]["phase"] = "Running"
            c.pod(obj)
        obj = spread(pod("new"), nodeAffinityPolicy=policy)
        obj["spec"]["nodeSelector"] = {"pool": "x"}
        return c, c.pod(obj)

    c, u = setup("Honor")
    c.step()
    assert c.node_of(u) in ("a", "b")
    c, u = setup("Ignore")
    c.step()  # with c counted the minimum is 0 still (a and b are empty): a or b fits
    assert c.node_of(u) in ("a", "b")

    # taints: node t is tainted and holds no pod; Honor leaves it out of the minimum
    def tainted(policy: str) -> tuple[Cluster, str]:
        c = cluster("a")
        obj = make_node("t").cap(cpu="8", memory="64Gi").label({HOST: "t"}).taint("k", "v").obj()
        c.nodes["t"] = obj
        c.session.on_node("ADDED", parse_node(obj))
        old = pod("old")
        old["spec"]["nodeName"] = "a"
        old["status"]["phase"] = "Running"
        c.pod(old)
        return c, c.pod(spread(pod("new"), nodeTaintsPolicy=policy))

    c, u = tainted("Ignore")
    c.step()  # t counts with 0 pods: a would have skew 2
    assert not c.node_of(u)
    assert "1 node(s) didn't match pod topology spread constraints" in message(c, u)
    c, u = tainted("Honor")
    c.step()  # only a counts: its own minimum, skew 1
    assert c.node_of(u) == "a"


def test_match_label_keys_count_only_the_same_revision() -> None:
    def setup() -> Cluster:
        # two pods of revision 1 on a; b is full
        c = cluster("a", "b")
        for i in range(2):
            obj = pod(f"old{i}", labels={"app": "web", "rev": "1"})
            obj["spec"]["nodeName"] = "a"
            obj["status"]["phase"] = "Running"
            c.pod(obj)
        filler = pod("filler", labels={"app": "other"}, cpu="8")
        filler["spec"]["nodeName"] = "b"
        filler["status"]["phase"] = "Running"
        c.pod(filler)
        return c

    c = setup()
    u = c.pod(spread(pod("new", labels={"app": "web", "rev": "2"}), matchLabelKeys=["rev"]))
    c.step()
    assert c.node_of(u) == "a"  # only revision 2 counts: none anywhere
    c = setup()
    u = c.pod(spread(pod("new", labels={"app": "web", "rev": "2"})))
    c.step()
    assert not c.node_of(u)  # a holds 2 of app=web, b none: skew 3 on a
    assert message(c, u) == (
        "0/2 nodes fit: 1 insufficient cpu, 1 node(s) didn't match pod topology spread constraints."
    )


def test_a_reservation_is_made_where_the_rules_allow() -> None:
    # a: 3 pods of app=web (spread forbids it), with room; b: full of other work
    c = cluster("a", "b", reserve=True)
    for i in range(3):
        obj = pod(f"old{i}")
        obj["spec"]["nodeName"] = "a"
        obj["status"]["phase"] = "Running"
        c.pod(obj)
    filler = pod("filler", labels={"app": "other"}, cpu="8")
    filler["spec"]["nodeName"] = "b"
    filler["status"]["phase"] = "Running"
    c.pod(filler)
    u = c.pod(spread(pod("new")))
    c.step()
    assert not c.node_of(u)
    assert "reservation on node(s) b" in message(c, u)


def test_schedule_anyway_prefers_the_emptier_domain() -> None:
    c = cluster("a", "b")
    for i in range(3):
        obj = pod(f"old{i}")
        obj["spec"]["nodeName"] = "a"
        obj["status"]["phase"] = "Running"
        c.pod(obj)
    u = c.pod(spread(pod("new"), when="ScheduleAnyway"))
    c.step()
    assert c.node_of(u) == "b"
    # and it is only a preference: with b full it still goes to a
    d = cluster("a", "b")
    filler = pod("filler", labels={"app": "other"}, cpu="8")
    filler["spec"]["nodeName"] = "b"
    filler["status"]["phase"] = "Running"
    d.pod(filler)
    old = pod("old")
    old["spec"]["nodeName"] = "a"
    old["status"]["phase"] = "Running"
    d.pod(old)
    u = d.pod(spread(pod("new"), when="ScheduleAnyway"))
    d.step()
    assert d.node_of(u) == "a"


# -- inter-pod affinity --------------------------------------------------------------------


def test_affinity_lands_in_the_domain_of_the_pod_it_follows() -> None:
    c = cluster()
    for name, zone in (("a1", "z1"), ("a2", "z1"), ("b1", "z2"), ("b2", "z2")):
        node(c, name, zone=zone)
    db = pod("db", labels={"app": "db"})
    db["spec"]["nodeName"] = "b2"
    db["status"]["phase"] = "Running"
    c.pod(db)
    uids = [c.pod(term(pod(f"w{i}"), "podAffinity", {"app": "db"}, key=ZONE)) for i in range(3)]
    c.step()
    assert all(c.node_of(u) in ("b1", "b2") for u in uids)


def test_affinity_with_no_matching_pod_waits_unless_it_matches_itself() -> None:
    c = cluster("a", "b")
    lonely = c.pod(term(pod("w", labels={"app": "web"}), "podAffinity", {"app": "db"}))
    c.step()
    assert not c.node_of(lonely)
    assert message(c, lonely) == "0/2 nodes fit: 2 node(s) didn't match pod affinity rules."
    # the first of a series that attract each other goes anywhere; the rest follow it
    d = cluster("a", "b", "c")
    uids = [d.pod(term(pod(f"s{i}", labels={"app": "self"}), "podAffinity", {"app": "self"}))
            for i in range(3)]
    d.step()
    assert len(set(d.node_of(u) for u in uids)) == 1 and d.node_of(uids[0])


def test_anti_affinity_one_per_node_and_the_rest_told_why() -> None:
    c = cluster("a", "b")
    uids = [c.pod(term(pod(f"w{i}"), "podAntiAffinity", {"app": "web"})) for i in range(3)]
    c.step()
    placed = [u for u in uids if c.node_of(u)]
    assert sorted(c.node_of(u) for u in placed) == ["a", "b"]
    [left] = [u for u in uids if not c.node_of(u)]
    assert message(c, left) == "0/2 nodes fit: 2 node(s) didn't match pod anti-affinity rules."


def test_existing_pods_anti_affinity_is_symmetric() -> None:
    c = cluster("a", "b")
    loner = term(pod("loner", labels={"app": "loner"}), "podAntiAffinity", {"app": "web"})
    loner["spec"]["nodeName"] = "a"
    loner["status"]["phase"] = "Running"
    c.pod(loner)
    # plain pods (no rules of their own) keep off the loner's node
    uids = [c.pod(pod(f"w{i}")) for i in range(3)]
    other = c.pod(pod("x", labels={"app": "other"}))
    c.step()
    assert {c.node_of(u) for u in uids} == {"b"}
    assert c.node_of(other)
    d = cluster("a")
    loner = term(pod("loner", labels={"app": "loner"}), "podAntiAffinity", {"app": "web"})
    loner["spec"]["nodeName"] = "a"
    loner["status"]["phase"] = "Running"
    d.pod(loner)
    u = d.pod(pod("w"))
    d.step()
    assert message(d, u) == "0/1 nodes fit: 1 node(s) didn't satisfy existing pods anti-affinity rules."


def test_namespaces_of_a_term() -> None:
    c = cluster("a", "b")
    other = pod("db", labels={"app": "db"}, namespace="data")
    other["spec"]["nodeName"] = "a"
    other["status"]["phase"] = "Running"
    c.pod(other)
    # anti-affinity in its own namespace: the db in "data" does not count
    mine = c.pod(term(pod("w1", cpu="7"), "podAntiAffinity", {"app": "db"}))
    c.step()
    assert c.node_of(mine)
    # listing the namespace does
    theirs = c.pod(term(pod("w2"), "podAntiAffinity", {"app": "db"}, namespaces=["data"]))
    c.step()
    assert c.node_of(theirs) == "b"


def test_a_namespace_selector_is_refused_visibly() -> None:
    c = cluster("a")
    u = c.pod(term(pod("w"), "podAffinity", {"app": "db"}, namespaceSelector={"matchLabels": {"team": "x"}}))
    c.step()
    assert message(c, u) == (
        "0/1 nodes fit: batchsched does not support a namespaceSelector in required pod affinity "
        "terms yet (list the namespaces instead)."
    )
    # an empty namespaceSelector is every namespace
    d = cluster("a", "b")
    db = pod("db", labels={"app": "db"}, namespace="data")
    db["spec"]["nodeName"] = "b"
    db["status"]["phase"] = "Running"
    d.pod(db)
    u = d.pod(term(pod("w"), "podAffinity", {"app": "db"}, namespaceSelector={}))
    d.step()
    assert d.node_of(u) == "b"


# -- gangs ---------------------------------------------------------------------------------


def gang(c: Cluster, name: str, n: int, rule: Any) -> list[str]:
    c.session.on_groups_listed("scheduling.x-k8s.io", [make_group(name).min_member(n).build()])
    return [c.pod(rule(pod(f"{name}-{i}", labels={"app": name}, group=name))) for i in range(n)]


def test_a_gang_with_spread_lands_one_per_node() -> None:
    c = cluster("a", "b", "c", "d")
    uids = gang(c, "g", 4, lambda o: spread(o, match={"app": "g"}))
    c.step()
    assert where(c, uids) == Counter({"a": 1, "b": 1, "c": 1, "d": 1})


def test_a_gang_with_anti_affinity_to_itself_lands_one_per_node() -> None:
    c = cluster("a", "b", "c", "d")
    uids = gang(c, "g", 4, lambda o: term(o, "podAntiAffinity", {"app": "g"}))
    c.step()
    assert where(c, uids) == Counter({"a": 1, "b": 1, "c": 1, "d": 1})


def test_a_gang_with_affinity_to_itself_lands_in_one_domain() -> None:
    c = cluster()
    for name, zone in (("a1", "z1"), ("a2", "z1"), ("b1", "z2"), ("b2", "z2")):
        node(c, name, zone=zone, cpu="2")
    uids = gang(c, "g", 4, lambda o: term(o, "podAffinity", {"app": "g"}, key=ZONE))
    c.step()
    zones = {c.nodes[c.node_of(u)]["metadata"]["labels"][ZONE] for u in uids}
    assert len(zones) == 1 and all(c.node_of(u) for u in uids)


def test_a_gang_that_cannot_spread_is_placed_not_at_all() -> None:
    c = cluster("a", "b", "c")
    uids = gang(c, "g", 4, lambda o: term(o, "podAntiAffinity", {"app": "g"}))
    d = c.step()
    assert not d.binds and not any(c.node_of(u) for u in uids)
    text = message(c, uids[0])
    assert "only 3 fit now" in text
    assert text.endswith("0/3 nodes fit: 3 node(s) didn't match pod anti-affinity rules.")


def test_a_gang_counts_pods_placed_before_it_in_the_same_cycle() -> None:
    c = cluster("a", "b")
    loners = [c.pod(term(pod(f"l{i}", labels={"app": "g"}), "podAntiAffinity", {"app": "g"}))
              for i in range(2)]
    uids = gang(c, "g", 2, lambda o: term(o, "podAntiAffinity", {"app": "g"}))
    c.step()
    placed = [u for u in loners + uids if c.node_of(u)]
    assert len(placed) == 2
    assert len({c.node_of(u) for u in placed}) == 2


# -- the plain path stays the plain path ---------------------------------------------------


@pytest.mark.parametrize("use_jit", [True, False])
def test_cycle_with_the_twin_kernel(use_jit: bool) -> None:
    state = ClusterState()
    for name in ("a", "b", "c"):
        state.node_event("ADDED", parse_node(make_node(name).cap(cpu="8", memory="8Gi").label({HOST: name}).obj()))
    for i in range(3):
        state.pod_event("ADDED", parse_pod(spread(pod(f"w{i}"))))
    units = [single_unit(p) for p in state.pending.values()]
    plan = Cycle(ScoringConfig(), use_jit=use_jit).run(state.snapshot(), units, state=state)
    assert sorted(b.node for b in plan.bindings) == ["a", "b", "c"]
