"""Pods in a namespace being deleted: the apiserver refuses their Bindings, so they hold
no room, and the pods of live namespaces are placed as if they were not there."""

from __future__ import annotations

from typing import Any

from batchsched.core.model import parse_pod
from tests.builders import make_pod
from tests.unit.test_insight import GPU, World


def _namespace(name: str, *, deleting: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T10:00:00Z"
    return {"metadata": meta, "status": {"phase": "Terminating" if deleting else "Active"}}


def _pod(w: World, name: str, namespace: str, gpus: int) -> str:
    obj: dict[str, Any] = make_pod(name).namespace(namespace).req(cpu="1", **{GPU: str(gpus)}).created(w.now).obj()
    w.pods[obj["metadata"]["uid"]] = obj
    w.session.on_pod("ADDED", parse_pod(obj))
    return str(obj["metadata"]["uid"])


def test_pods_of_a_namespace_being_deleted_take_no_room() -> None:
    w = World()
    w.node("n0", 8)
    w.session.on_namespaces_listed([_namespace("old", deleting=False), _namespace("team", deleting=False)])
    leftovers = [_pod(w, f"left-{i}", "old", 4) for i in range(2)]
    w.session.on_namespace("MODIFIED", _namespace("old", deleting=True))
    w.step(after=1)
    mine = _pod(w, "mine", "team", 8)
    d = w.step(after=1)
    assert [b.uid for b in d.binds] == [mine]
    assert not any(w.bound(u) for u in leftovers)


def test_a_relist_that_shows_the_namespace_being_deleted_closes_it_too() -> None:
    w = World()
    w.node("n0", 8)
    leftover = _pod(w, "left", "old", 8)
    w.session.on_namespaces_listed([_namespace("old", deleting=True)])
    mine = _pod(w, "mine", "team", 8)
    d = w.step(after=1)
    assert [b.uid for b in d.binds] == [mine] and not w.bound(leftover)


def test_a_namespace_recreated_under_its_name_is_open_again() -> None:
    w = World()
    w.node("n0", 8)
    w.session.on_namespace("MODIFIED", _namespace("team", deleting=True))
    waiting = _pod(w, "waiting", "team", 8)
    assert w.step(after=1).binds == []
    w.session.on_namespace("DELETED", _namespace("team", deleting=True))
    w.session.on_namespace("ADDED", _namespace("team", deleting=False))
    assert [b.uid for b in w.step(after=1).binds] == [waiting]
