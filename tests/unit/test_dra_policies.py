"""DRA pods among the other policies, through the Session: nodes publishing GPUs by DRA
beside nodes whose device plugins publish ``nvidia.com/gpu`` or ``elasticgpu.io`` cards;
fair share between queues whose jobs ask DRA GPUs; a stopped queue holding DRA pods; and
a pod whose claim is refused by a node's devices, which backs off without keeping another
queue waiting.

Each DRA pod here asks its GPUs through a claim made from a ResourceClaimTemplate: the
world plays kube-controller-manager's part (the claim made and named in the pod's status)
and the apiserver's (claim writes and Bindings applied, card annotations written)."""

from __future__ import annotations

from typing import Any

import pytest

from batchsched.core.devices import ELASTIC_CORE, ELASTIC_MEMORY
from batchsched.core.dra.book import class_column
from batchsched.core.model import GPU, parse_node, parse_pod
from batchsched.insight.explain import Insight
from tests.builders import make_node, make_pod
from tests.unit.test_dra_scheduling import DraWorld

COLUMN = class_column("gpu.nvidia.com")
#: a GPU of 80Gi: none of the DRA nodes here has one, but their class column shows room
BIG = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0"


class MixedWorld(DraWorld):
    """A :class:`DraWorld` whose pods may also ask device-plugin GPUs, and whose DRA pods
    get their claims from templates."""

    def plugin_node(self, name: str, **capacity: str) -> None:
        self.session.on_node("ADDED", parse_node(make_node(name).cap(cpu="64", memory="512Gi", **capacity).obj()))

    def card_pod(self, name: str, *, queue: str = "", **requests: str) -> str:
        b = make_pod(name).req(cpu="1", **requests).created(self.now)
        if queue:
            b = b.label({"batchsched.io/queue": queue})
        obj = b.obj()
        self.pods[obj["metadata"]["uid"]] = obj
        self.session.on_pod("ADDED", parse_pod(obj))
        return str(obj["metadata"]["uid"])

    def templated(self, name: str, count: int = 1, *, queue: str = "", selectors: tuple[str, ...] = ()) -> str:
        """A pod whose claim ``gpu`` comes from a template; its claim made at once, as
        kube-controller-manager makes it, and named in the pod's status."""
        uid = self.pod(name, template="gpus", queue=queue)
        extra: dict[str, Any] = {"selectors": [{"cel": {"expression": s}} for s in selectors]} if selectors else {}
        self.claim(f"{name}-gpu", count, **extra)
        self.pods[uid]["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
        self.session.on_pod("MODIFIED", parse_pod(self.pods[uid]))
        return uid

    def step(self, after: float = 1.0, *, refuse: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
        """A step, with the card assignment each Binding carries written on its pod."""
        d = super().step(after, refuse=refuse)
        for b in d.binds:
            if b.uid in refuse or not (b.annotations or b.labels):
                continue
            meta = self.pods[b.uid]["metadata"]
            meta.setdefault("annotations", {}).update(dict(b.annotations))
            meta.setdefault("labels", {}).update(dict(b.labels))
            self.session.on_pod("MODIFIED", parse_pod(self.pods[b.uid]))
        return d

    def allocated(self, name: str) -> list[str]:
        """The devices of pod ``name``'s claim (empty while it is not allocated)."""
        return self.devices_of(f"{name}-gpu")

    def uid_of(self, name: str) -> str:
        return next(u for u, p in self.pods.items() if p["metadata"]["name"] == name)


# -- DRA pods beside card pods ---------------------------------------------------------


def mixed() -> MixedWorld:
    """Three kinds of GPU node: ``dra`` publishes 2 GPUs by DRA, ``whole`` 2
    ``nvidia.com/gpu``, ``cards`` two elasticgpu.io cards (200 core, 2 x 16 GiB)."""
    w = MixedWorld()
    w.node("dra", 2)
    w.plugin_node("whole", **{GPU: "2"})
    w.plugin_node("cards", **{ELASTIC_CORE: "200", ELASTIC_MEMORY: "32768"})
    return w


def test_each_kind_of_gpu_pod_lands_only_on_nodes_of_its_kind_and_nothing_is_booked_twice() -> None:
    w = mixed()
    dra = [w.templated(f"dra-{i}") for i in range(3)]
    whole = [w.card_pod(f"whole-{i}", **{GPU: "1"}) for i in range(3)]
    shares = [w.card_pod(f"share-{i}", **{ELASTIC_CORE: "50"}) for i in range(5)]
    w.step()
    for _ in range(3):
        w.step(after=30)
    assert sorted(w.node_of(u) for u in dra) == ["", "dra", "dra"]
    assert sorted(w.node_of(u) for u in whole) == ["", "whole", "whole"]
    assert sorted(w.node_of(u) for u in shares) == ["", "cards", "cards", "cards", "cards"]
    devices = [dev for i in range(3) for dev in w.allocated(f"dra-{i}")]
    assert sorted(devices) == ["gpu-0", "gpu-1"], "two claims got the two GPUs, one each; the third none"
    cards: dict[str, int] = {}
    for u in shares:
        for key, value in (w.pods[u]["metadata"].get("annotations") or {}).items():
            if key.startswith("elasticgpu.io/container-") and w.node_of(u):
                cards[value] = cards.get(value, 0) + 50
    assert cards and all(v <= 100 for v in cards.values()), f"a card booked past 100 %: {cards}"
    assert sum(cards.values()) == 200


def test_each_waiting_pod_is_told_what_it_lacks_and_explain_says_it() -> None:
    w = mixed()
    for i in range(2):
        w.templated(f"dra-{i}")
        w.card_pod(f"whole-{i}", **{GPU: "1"})
    for i in range(4):
        w.card_pod(f"share-{i}", **{ELASTIC_CORE: "50"})
    w.step()
    late = {"dra": w.templated("dra-late"), "whole": w.card_pod("whole-late", **{GPU: "1"}),
            "share": w.card_pod("share-late", **{ELASTIC_CORE: "50"})}
    d = w.step(after=30)
    told = {kind: w.told(d, uid) for kind, uid in late.items()}
    assert not any(w.node_of(u) for u in late.values()), told
    # each is told what it lacks, and that nodes of the other kinds have none of it
    assert told["dra"].startswith(f"0/3 nodes fit: 2 node(s) had no devices its ResourceClaims can be allocated, "
                                  f"1 insufficient {COLUMN}"), told
    assert told["whole"] == f"0/3 nodes fit: 3 insufficient {GPU}.", told
    assert told["share"] == f"0/3 nodes fit: 3 insufficient {ELASTIC_CORE}.", told
    insight = Insight(w.session, use_jit=False)
    insight.refresh(w.now)
    out = insight.explain(w.now, kind="pod", namespace="default", name="dra-late")
    assert out["job"]["devices"] == {"gpu.nvidia.com": 1}
    assert f"insufficient {COLUMN}" in out["job"]["message"]
    out = insight.explain(w.now, kind="pod", namespace="default", name="whole-late")
    assert not out["job"].get("devices")
    assert f"insufficient {GPU}" in out["job"]["message"]
    # the DRA pod ahead of it is said to ask its device, not only "0 GPU(s)"
    [ahead] = [line for line in out["summary"] if "ahead: default/dra-late" in line]
    assert "0 GPU(s) and 1 device(s) of DeviceClass gpu.nvidia.com" in ahead, ahead


# -- fair share between queues asking DRA GPUs -----------------------------------------


def cohort(kind: str, weights: dict[str, float]) -> MixedWorld:
    """Three nodes of 8 GPUs (published by DRA, or as ``nvidia.com/gpu``); queues ``a``
    and ``b`` of nominal 4 under one root with an idle ``lender`` of the other 16, their
    quotas over the resource the nodes publish."""
    w = MixedWorld()
    column = COLUMN if kind == "dra" else GPU
    for i in range(3):
        if kind == "dra":
            w.node(f"n{i}", 8)
        else:
            w.plugin_node(f"n{i}", **{GPU: "8"})
    w.queues = [{"metadata": {"name": "org"}, "spec": {}}]
    for name, nominal in (("a", 4), ("b", 4), ("lender", 16)):
        spec: dict[str, Any] = {"parent": "org", "resources": [{"name": column, "nominal": str(nominal)}]}
        if name in weights:
            spec["weight"] = weights[name]
        w.queues.append({"metadata": {"name": name}, "spec": spec})
    w.session.on_queues_listed(w.queues)
    return w


def submit(w: MixedWorld, kind: str, name: str, queue: str) -> str:
    return w.templated(name, queue=queue) if kind == "dra" else w.card_pod(name, queue=queue, **{GPU: "1"})


def held(w: MixedWorld) -> dict[str, int]:
    """The GPUs each queue's bound pods hold (one a pod)."""
    out = {"a": 0, "b": 0}
    for p in w.pods.values():
        queue = p["metadata"]["labels"]["batchsched.io/queue"]
        if p["spec"].get("nodeName") and queue in out:
            out[queue] += 1
    return out


@pytest.mark.parametrize("kind", ["nvidia.com/gpu", "dra"])
@pytest.mark.parametrize(("weights", "split"), [({"b": 2}, {"a": 8, "b": 16}), ({"a": 2}, {"a": 16, "b": 8}),
                                                 ({}, {"a": 12, "b": 12})])
def test_queues_share_dra_gpus_by_their_weights_as_they_share_device_plugin_gpus(
        kind: str, weights: dict[str, float], split: dict[str, int]) -> None:
    """Both queues ask far more than the cohort's 24 GPUs; the split follows the weights,
    for GPUs through claims as for ``nvidia.com/gpu``; GPUs freed later go back by the
    same weights (a's and b's runs end alike), and only the bound pods' claims are
    allocated."""
    w = cohort(kind, weights)
    for i in range(24):
        for q in ("a", "b"):
            submit(w, kind, f"{q}-{i}", q)
    for _ in range(3):
        w.step()
    assert held(w) == split
    ended = [u for u, p in w.pods.items() if p["spec"].get("nodeName")][:12]
    for u in ended:  # twelve runs end, whichever queue they were of
        w.delete(u)
    for _ in range(3):
        w.step(after=30)
    assert held(w) == split
    if kind == "dra":
        for p in w.pods.values():
            name = p["metadata"]["name"]
            assert bool(w.allocated(name)) == bool(p["spec"].get("nodeName")), name
        devices = [(w.node_of(u), d) for u, p in w.pods.items() for d in w.allocated(p["metadata"]["name"])]
        assert len(devices) == len(set(devices)) == 24


# -- a stopped queue -------------------------------------------------------------------


def team(stop: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": [{"name": COLUMN, "nominal": "8"}]}
    if stop:
        spec["stopPolicy"] = stop
    return {"metadata": {"name": "team", "uid": "q-team"}, "spec": spec}


@pytest.mark.parametrize("stop", ["Hold", "HoldAndDrain"])
def test_a_stopped_queues_dra_pods_are_not_placed_nor_their_claims_allocated_until_it_runs_again(stop: str) -> None:
    w = MixedWorld()
    w.node("n0", 4)
    w.queues = [team()]
    w.session.on_queues_listed(w.queues)
    running = w.templated("running", 2, queue="team")
    w.step()
    assert w.node_of(running) == "n0" and len(w.allocated("running")) == 2
    w.queues = [team(stop)]
    w.session.on_queue("MODIFIED", w.queues[0])
    waiting = [w.templated(f"w-{i}", queue="team") for i in range(2)]
    told: dict[str, str] = {}
    for _ in range(3):
        d = w.step(after=30)
        told.update({u: w.told(d, u) for u in waiting if w.told(d, u)})
        for e in d.evictions:  # HoldAndDrain: what runs is evicted
            assert e.uid == running
        assert not d.binds
        assert not any(w.node_of(u) for u in waiting)
        assert not any(w.allocated(f"w-{i}") for i in range(2))
    message = f"queue team is stopped (stopPolicy {stop}): it admits no new work until its stopPolicy is None"
    assert [told.get(u) for u in waiting] == [message, message]
    assert (running in w.pods) == (stop == "Hold"), "Hold lets the running pod run on; HoldAndDrain evicts it"
    w.queues = [team()]
    w.session.on_queue("MODIFIED", w.queues[0])
    w.step()
    assert all(w.node_of(u) == "n0" for u in waiting)
    devices = [d for i in range(2) for d in w.allocated(f"w-{i}")]
    devices += w.allocated("running") if running in w.pods else []
    assert len(devices) == len(set(devices)) == (4 if stop == "Hold" else 2)


# -- a pod refused its devices, and fair share -----------------------------------------


def refused_world(*, cohort: bool) -> tuple[MixedWorld, str]:
    """Node ``n0``'s one 80Gi GPU is held by a pod of ``lender``; a pod of queue ``a`` asks
    an 80Gi GPU: the class column counts n0's free 40Gi GPUs, its claim is refused there.
    Queues ``a``, ``b`` (and ``lender``) lend to each other in a ``cohort``, else ``b`` may
    use 4 GPUs of its own. Returns the world and that pod's uid."""
    w = MixedWorld()
    w.node("n0", 4, memory=["80Gi", "40Gi", "40Gi", "40Gi"])
    w.node("n1", 4)
    parent = {"parent": "org"} if cohort else {}
    w.queues = [{"metadata": {"name": "org"}, "spec": {}}] if cohort else []
    for name, nominal in (("a", 2), ("b", 2 if cohort else 4), ("lender", 4)):
        w.queues.append({"metadata": {"name": name},
                         "spec": {**parent, "resources": [{"name": COLUMN, "nominal": str(nominal)}]}})
    w.session.on_queues_listed(w.queues)
    w.templated("hold", queue="lender", selectors=(BIG,))
    w.step()
    assert w.allocated("hold") == ["gpu-0"]
    big = w.templated("a-big", queue="a", selectors=(BIG,))
    w.now += 5  # older than what comes next: a's turn comes first
    return w, big


def test_a_pod_refused_its_devices_does_not_keep_another_queues_pod_from_a_gpu_it_can_use() -> None:
    """a's pod is refused on n0 (and n1 has no 80Gi GPU); b's pod, next in the fair order,
    gets a free GPU in the same step, not after its back-off: the refused pod holds no
    reservation on GPUs it cannot use."""
    w, big = refused_world(cohort=False)
    w.node("n1", 0)  # only n0's three free 40Gi GPUs
    bs = [w.templated(f"b-{i}", queue="b") for i in range(3)]
    d = w.step()
    assert "cannot be allocated on node n0" in w.told(d, big)
    assert [w.node_of(u) for u in bs] == ["n0", "n0", "n0"], [w.told(d, u) for u in bs]
    assert not w.allocated("a-big")


def test_a_pod_refused_its_devices_leaves_the_free_gpus_to_both_queues_by_fair_share() -> None:
    """a's oldest pod is refused its devices; a's other pods and b's share the seven free
    GPUs evenly (equal weights) in the first step: none of them stays free for the
    refused pod, and b is not kept waiting until a's back-off ends."""
    w, big = refused_world(cohort=True)
    for i in range(4):
        w.templated(f"a-{i}", queue="a")
        w.templated(f"b-{i}", queue="b")
    d = w.step()
    assert "cannot be allocated on node" in w.told(d, big)
    got = held(w)
    assert sorted(got.values()) == [3, 4] and not w.node_of(big), (got, [(c.ref.name, c.message) for c in d.unschedulable])
