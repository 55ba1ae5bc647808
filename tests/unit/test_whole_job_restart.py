"""Whole-job restart: a running gang that loses a member below its quorum is evicted whole
at once when its PodGroup (or the config) asks for it; otherwise it waits out its schedule
timeout, as before."""

from __future__ import annotations

from batchsched.core.model import parse_pod
from batchsched.core.session import Session, SessionSettings
from tests.unit.test_insight import World


def _running_gang(w: World, **annotations: str) -> list[str]:
    w.node("n0", 8)
    w.node("n1", 8)
    w.group("train", 3, **annotations)
    members = [w.pod(f"train-{i}", 4, group="train") for i in range(3)]
    w.step()
    assert all(w.bound(u) for u in members)
    return members


def test_a_failed_member_evicts_the_rest_at_once_with_the_annotation() -> None:
    w = World()
    members = _running_gang(w, **{"batchsched.io/whole-job-restart": "true"})
    w.pods[members[0]]["status"]["phase"] = "Failed"
    w.session.on_pod("MODIFIED", parse_pod(w.pods[members[0]]))
    d = w.step(after=1)
    assert sorted(e.uid for e in d.evictions) == sorted(members[1:])
    assert {e.cause for e in d.evictions} == {"restart"}
    [note] = [e for e in d.events if e.reason == "WholeJobRestart"]
    assert note.message == (
        "a running member was lost: 2 of 3 required members remain; evicting the 2 bound member(s) "
        "so the whole job restarts together (batchsched.io/whole-job-restart)"
    )
    # its recreated members are placed whole again
    again = [w.pod(f"train-{i}r", 4, group="train") for i in range(3)]
    w.step(after=1)
    assert all(w.bound(u) for u in again)


def test_without_it_the_gang_waits_out_its_timeout() -> None:
    w = World()
    members = _running_gang(w)
    w.pods[members[0]]["status"]["phase"] = "Failed"
    w.session.on_pod("MODIFIED", parse_pod(w.pods[members[0]]))
    d = w.step(after=1)
    assert d.evictions == []
    assert [e.reason for e in d.events if e.reason in ("GangIncomplete", "WholeJobRestart")] == ["GangIncomplete"]


def test_the_config_default_applies_and_the_annotation_overrides_it() -> None:
    w = World()
    w.session = Session(SessionSettings(gang_whole_job_restart=True))
    members = _running_gang(w, **{"batchsched.io/whole-job-restart": "false"})
    w.session.on_pod("DELETED", parse_pod(w.pods.pop(members[2])))
    assert w.step(after=1).evictions == []

    w2 = World()
    w2.session = Session(SessionSettings(gang_whole_job_restart=True))
    members = _running_gang(w2)
    w2.session.on_pod("DELETED", parse_pod(w2.pods.pop(members[2])))  # its node went away
    assert sorted(e.uid for e in w2.step(after=1).evictions) == sorted(members[:2])


def test_a_suspend_or_restart_annotation_that_is_not_true_or_false_makes_the_group_invalid() -> None:
    from batchsched.core.gangs import XK8S, parse_podgroup
    from tests.builders import make_group

    for name in ("batchsched.io/suspend", "batchsched.io/whole-job-restart"):
        group = parse_podgroup(XK8S, make_group("job").min_member(2).annotate({name: "yes"}).obj())
        assert group.invalid == f'annotation {name} must be "true" or "false", got \'yes\''
        assert not parse_podgroup(XK8S, make_group("job").min_member(2).annotate({name: " False"}).obj()).invalid


def _running_gang_of_whole_nodes(w: World) -> list[str]:
    for n in ("n0", "n1", "n2"):
        w.node(n, 8)
    w.group("train", 3, **{"batchsched.io/whole-job-restart": "true"})
    members = [w.pod(f"train-{i}", 8, group="train") for i in range(3)]
    w.step()
    assert all(w.bound(u) for u in members)
    return members


def test_a_member_its_operator_replaces_at_once_still_restarts_the_job() -> None:
    # the training operator (restartPolicy ExitCode) recreates a failed replica at once
    w = World()
    members = _running_gang_of_whole_nodes(w)
    w.pods[members[0]]["status"]["phase"] = "Failed"
    w.session.on_pod("MODIFIED", parse_pod(w.pods[members[0]]))
    first = w.step(after=0.1)  # sooner after the last step than gangs are checked on a timer
    w.session.on_pod("DELETED", parse_pod(w.pods.pop(members[0])))
    w.pod("train-0", 8, group="train")
    second = w.step(after=0.1)
    assert sorted(e.uid for d in (first, second) for e in d.evictions) == sorted(members[1:])


def test_no_member_is_placed_while_the_restart_evicts_the_rest() -> None:
    w = World()
    members = _running_gang_of_whole_nodes(w)
    w.pods[members[0]]["status"]["phase"] = "Failed"
    w.session.on_pod("MODIFIED", parse_pod(w.pods[members[0]]))
    w.session.on_pod("DELETED", parse_pod(w.pods.pop(members[0])))
    new = w.pod("train-0", 8, group="train")
    d = w.session.step(w.now + 1)  # the evictions are sent, not yet carried out
    assert sorted(e.uid for e in d.evictions) == sorted(members[1:])
    assert d.binds == []
    for e in d.evictions:  # the evicted members go; their replacements come
        w.session.on_evict_result(e, "evicted")
        w.session.on_pod("DELETED", parse_pod(w.pods.pop(e.uid)))
    again = [new, *(w.pod(f"train-{i}", 8, group="train") for i in (1, 2))]
    events = [e.reason for e in w.step(after=2).events]
    assert all(w.bound(u) for u in again)
    assert events.count("WholeJobRestart") == 0  # one failure, one restart


def test_a_refused_binding_places_the_member_again_and_restarts_nothing() -> None:
    """The job never ran whole: one member's Binding was refused, so the member that did
    bind stays and the refused one is placed again, as without the annotation."""
    w = World()
    w.node("n0", 8)
    w.node("n1", 8)
    w.group("train", 2, **{"batchsched.io/whole-job-restart": "true"})
    members = [w.pod(f"train-{i}", 8, group="train") for i in range(2)]
    d = w.session.step(w.now)
    assert sorted(b.uid for b in d.binds) == sorted(members)
    kept, refused = d.binds
    obj = w.pods[kept.uid]
    obj["spec"]["nodeName"] = kept.node
    obj["status"]["phase"] = "Running"
    w.session.on_bind_result(kept, "bound", now=w.now)
    w.session.on_pod("MODIFIED", parse_pod(obj))
    w.session.on_bind_result(refused, "failed", now=w.now)
    events: list[str] = []
    evicted: list[str] = []
    for _ in range(5):
        d = w.step(after=1)
        events.extend(e.reason for e in d.events)
        evicted.extend(e.uid for e in d.evictions)
    assert evicted == []
    assert "WholeJobRestart" not in events
    assert all(w.bound(u) for u in members)
    # now it ran whole: losing a member restarts it
    w.pods[members[0]]["status"]["phase"] = "Failed"
    w.session.on_pod("MODIFIED", parse_pod(w.pods[members[0]]))
    d = w.step(after=1)
    assert [e.uid for e in d.evictions] == [members[1]]
    assert [e.reason for e in d.events if e.reason == "WholeJobRestart"] == ["WholeJobRestart"]
