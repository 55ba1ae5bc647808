"""A discrete-event loop around the production :class:`~batchsched.core.session.Session`.

The simulator feeds the session the objects a watch would (pods and nodes as Kubernetes JSON,
parsed by the same parsers), steps it at virtual times, and carries out its decisions at
once: a binding succeeds (the pod comes back bound, with the annotations the binder would
have written), an eviction succeeds (the pod is gone). Nothing here decides where a pod goes;
every placement is the session's. Deterministic: no wall clock, no randomness.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchsched.core.decisions import Decisions
from batchsched.core.model import Pod, parse_node, parse_pod
from batchsched.core.session import Session
from batchsched.core.settings import SessionSettings

JSON = dict[str, Any]


@dataclass(slots=True)
class Placed:
    """A pod the session bound: where, when, and the cards it got."""

    node: str
    at: float
    cards: tuple[tuple[int, ...], ...] | None = None


@dataclass
class Simulation:
    """One cluster and one session; time only moves when :meth:`step` is told ``now``."""

    settings: SessionSettings
    use_jit: bool = True
    session: Session = field(init=False)
    #: pod JSON by uid, as the apiserver would hold it now
    objects: dict[str, JSON] = field(default_factory=dict)
    placed: dict[str, Placed] = field(default_factory=dict)
    evicted: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.session = Session(self.settings, use_jit=self.use_jit)

    # -- inputs ----------------------------------------------------------------------------

    def add_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        self.session.on_nodes_listed([parse_node(n) for n in nodes])

    def add_pod(self, obj: Mapping[str, Any]) -> Pod:
        body = copy.deepcopy(dict(obj))
        pod = parse_pod(body)
        self.objects[pod.uid] = body
        self.session.on_pod("ADDED", pod)
        return pod

    def delete_pod(self, uid: str) -> None:
        body = self.objects.pop(uid, None)
        if body is not None:
            self.session.on_pod("DELETED", parse_pod(body))

    def finish_pod(self, uid: str) -> None:
        """The pod ran to completion (phase Succeeded): its resources are free."""
        body = self.objects.get(uid)
        if body is not None:
            body.setdefault("status", {})["phase"] = "Succeeded"
            self.session.on_pod("MODIFIED", parse_pod(body))

    # -- the loop --------------------------------------------------------------------------

    def step(self, now: float) -> Decisions:
        """One session step at ``now``, its decisions carried out."""
        d = self.session.step(now)
        for b in d.binds:
            body = self.objects.get(b.uid)
            if body is None:
                continue
            meta = body.setdefault("metadata", {})
            if b.annotations:
                meta["annotations"] = {**(meta.get("annotations") or {}), **dict(b.annotations)}
            if b.labels:
                meta["labels"] = {**(meta.get("labels") or {}), **dict(b.labels)}
            body.setdefault("spec", {})["nodeName"] = b.node
            body.setdefault("status", {})["phase"] = "Running"
            self.session.on_bind_result(b, "bound", now=now)
            self.session.on_pod("MODIFIED", parse_pod(body))
            self.placed[b.uid] = Placed(b.node, now, b.cards)
        for e in d.evictions:
            self.session.on_evict_result(e, "evicted")
            self.evicted.add(e.uid)
            self.delete_pod(e.uid)
        for ref, notes, labels in d.cleanups:
            body = self.objects.get(ref.uid)
            if body is not None:
                meta = body.setdefault("metadata", {})
                for k in notes:
                    (meta.get("annotations") or {}).pop(k, None)
                for k in labels:
                    (meta.get("labels") or {}).pop(k, None)
                self.session.on_pod("MODIFIED", parse_pod(body))
        return d

    def pending(self) -> list[str]:
        return [str(uid) for uid in self.session.state.pending]
