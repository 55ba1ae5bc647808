"""The workload mix the GPU fragmentation policy measures against: its kinds (CPU-only pods
counted as FGD counts them), the popularity cut, the prior given in the configuration, the
seeding from the pods listed at start-up, and the mix kept across restarts in a ConfigMap."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from batchsched.config import ConfigError, parse_config
from batchsched.core import devices
from batchsched.core.devices import MAX_MIX, mix_kind, mix_rows, popular
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Pod
from batchsched.core.session import Session
from batchsched.core.settings import SessionSettings
from batchsched.kube.errors import ForbiddenError, NotFoundError
from batchsched.kube.fake import FakeKube
from batchsched.kube.leader import Fence
from batchsched.kube.mixstore import (
    DATA_KEY,
    MixStore,
    mix_document,
    observe_mix,
    read_mix_document,
)
from batchsched.metrics import Metrics
from tests.builders import make_pod

GPU = "nvidia.com/gpu"
CORE = devices.ELASTIC_CORE
MIX_PATH = "/api/v1/namespaces/ns/configmaps/batchsched-workload-mix"


def pod(name: str, *, cpu: str = "2", gpus: int = 0, core: int = 0, scheduler: str = "batchsched",
        node: str = "") -> Pod:
    req: dict[str, str] = {"cpu": cpu}
    if gpus:
        req[GPU] = str(gpus)
    if core:
        req[CORE] = str(core)
    b = make_pod(name).uid(name).req(req).scheduler(scheduler)
    return (b.running(node) if node else b).build()


# -- kinds ---------------------------------------------------------------------------------


def test_a_pod_without_cards_is_a_cpu_only_kind() -> None:
    state = ClusterState()
    state.pod_event("ADDED", pod("cpu-only", cpu="4"))
    state.pod_event("ADDED", pod("whole", cpu="8", gpus=2))
    state.pod_event("ADDED", pod("share", cpu="1", core=50))
    assert dict(state.mix) == {(4000, 0, 0): 1, (8000, 2, 1000): 1, (1000, 0, 500): 1}
    # FGD's rows: a CPU-only kind has no whole card and no share
    assert sorted(r[1:] for r in mix_rows(state.mix)) == [(1000, 0, 500), (4000, 0, 0), (8000, 2, 1000)]
    assert mix_kind(0, ()) is None  # asks for nothing the mix measures


def test_a_pod_is_counted_once_and_only_if_ours() -> None:
    state = ClusterState()
    p = pod("a", cpu="4")
    state.pod_event("ADDED", p)
    state.pod_event("MODIFIED", p)
    state.pod_event("ADDED", pod("theirs", cpu="4", scheduler="default-scheduler"))
    assert dict(state.mix) == {(4000, 0, 0): 1}


# -- the popularity cut ----------------------------------------------------------------------


def test_the_most_frequent_kinds_covering_95_percent_are_kept() -> None:
    a, b, c, d = (1000, 1, 1000), (2000, 0, 500), (500, 0, 0), (8000, 8, 1000)
    counts = {d: 4, a: 60, c: 6, b: 30}
    # 60 + 30 = 90% < 95%: the kind that crosses 95% (c, 96%) is kept, the tail (d) is not
    assert popular(counts) == [(a, 60), (b, 30), (c, 6)]
    rows = mix_rows(counts)
    assert [r[1:] for r in rows] == [a, b, c]
    # weights in thousandths of the kept total (96)
    assert [r[0] for r in rows] == [60 * 1000 // 96, 30 * 1000 // 96, 6 * 1000 // 96]


def test_no_more_than_max_mix_kinds_are_kept() -> None:
    counts = {(100 * (i + 1), 0, 0): 1 for i in range(3 * MAX_MIX)}
    assert len(mix_rows(counts)) == MAX_MIX


# -- the prior in the configuration -----------------------------------------------------------


def test_the_prior_mix_is_read_from_the_configuration() -> None:
    cfg = parse_config({"gpuSharing": {"mix": [
        {"cpu": "8", "gpus": 1, "weight": 10},
        {"cpu": "4", "gpuShare": "0.5", "weight": 30},
        {"cpu": "2", "weight": 5},
        {"cpu": "500m", "gpuShare": 0.25, "weight": 1},
    ]}})
    prior = cfg.session_settings().mix_prior
    assert prior == (((8000, 1, 1000), 10), ((4000, 0, 500), 30), ((2000, 0, 0), 5), ((500, 0, 250), 1))
    # it seeds the mix of a new session
    assert dict(Session(SessionSettings(mix_prior=prior)).state.mix) == dict(prior)


@pytest.mark.parametrize(("entry", "message"), [
    ({"cpu": "-2", "weight": 5}, "config: gpuSharing.mix[0].cpu: must not be negative, got '-2'"),
    ({"cpu": "4", "gpus": 1, "gpuShare": "0.5", "weight": 5},
     "config: gpuSharing.mix[0]: gives both gpus and gpuShare (whole cards or a share of one, not both)"),
    ({"cpu": "4", "gpuShare": "1.5", "weight": 5},
     "config: gpuSharing.mix[0].gpuShare: must be above 0 and below 1 (a share of one card), got '1.5'"),
    ({"cpu": "4", "gpus": 1000, "weight": 5},
     "config: gpuSharing.mix[0].gpus: must be a whole number of cards from 0 to 64, got 1000"),
    ({"cpu": "4", "gpus": -1, "weight": 5},
     "config: gpuSharing.mix[0].gpus: must be a whole number of cards from 0 to 64, got -1"),
    ({"cpu": "1e9", "weight": 5}, "config: gpuSharing.mix[0].cpu: must be at most 4096, got '1e9'"),
    ({"cpu": "4", "weight": 0}, "config: gpuSharing.mix[0].weight: must be a whole number from 1 to 20000, got 0"),
    ({"cpu": "4", "weight": 10**9},
     "config: gpuSharing.mix[0].weight: must be a whole number from 1 to 20000, got 1000000000"),
    ({"cpu": "4"}, "config: gpuSharing.mix[0].weight: missing (how many pods this kind counts as)"),
    ({"cpu": "4", "gpu": 1, "weight": 5},
     "config: unknown key gpuSharing.mix[0].'gpu' (known: cpu, gpus, gpuShare, weight)"),
    ({"weight": 5}, "config: gpuSharing.mix[0]: asks for nothing (give cpu, gpus or gpuShare)"),
    ({"cpu": "lots", "weight": 5}, "config: gpuSharing.mix[0].cpu: bad quantity 'lots'"),
])
def test_a_bad_prior_is_one_line_naming_the_key(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"gpuSharing": {"mix": [entry]}})
    assert str(err.value) == message


# -- seeding from the pods listed at start-up --------------------------------------------------


def test_the_first_listing_seeds_the_mix_with_every_pod_then_only_ours_count() -> None:
    session = Session()
    session.on_pods_listed([
        pod("ours-running", cpu="8", gpus=1, node="n1"),
        pod("ours-pending", cpu="4", core=50),
        pod("theirs-running", cpu="16", gpus=4, node="n2", scheduler="default-scheduler"),
        pod("theirs-cpu", cpu="2", node="n2", scheduler="default-scheduler"),
    ])
    listed = {(8000, 1, 1000): 1, (4000, 0, 500): 1, (16000, 4, 1000): 1, (2000, 0, 0): 1}
    assert dict(session.state.mix) == listed
    # after the start, a pod of another scheduler is not ours to count; ours are, once
    session.on_pod("ADDED", pod("theirs-later", cpu="16", gpus=4, scheduler="default-scheduler"))
    session.on_pod("ADDED", pod("ours-later", cpu="8", gpus=1))
    session.on_pod("MODIFIED", pod("ours-later", cpu="8", gpus=1))
    assert dict(session.state.mix) == {**listed, (8000, 1, 1000): 2}
    # a relist (an expired watch) counts nothing twice, and no pod of another scheduler
    session.on_pods_listed([*(session.state.pods.values()),
                            pod("theirs-new", cpu="1", scheduler="default-scheduler")])
    assert dict(session.state.mix) == {**listed, (8000, 1, 1000): 2}


# -- kept across restarts -----------------------------------------------------------------------


def test_what_a_listing_cannot_rebuild_is_what_is_kept() -> None:
    state = ClusterState(mix_prior=(((1000, 0, 250), 7),))
    state.replace_pods([pod("a", cpu="8", gpus=1, node="n"), pod("b", cpu="8", gpus=1, node="n")])
    state.pod_event("ADDED", pod("c", cpu="2"))
    assert state.mix_gone() == {(1000, 0, 250): 7}  # only the prior: a listing shows a, b and c
    state.pod_event("DELETED", pod("a", cpu="8", gpus=1, node="n"))
    state.pod_event("DELETED", pod("c", cpu="2"))
    assert state.mix_gone() == {(1000, 0, 250): 7, (8000, 1, 1000): 1, (2000, 0, 0): 1}
    # a restart: the kept counts and the pods listed give the mix back
    again = ClusterState(mix_prior=(((1000, 0, 250), 7),))
    again.restore_mix(state.mix_gone())
    again.replace_pods([pod("b", cpu="8", gpus=1, node="n")])
    assert dict(again.mix) == dict(state.mix)


def test_a_start_estimate_measures_against_the_live_mix() -> None:
    # the copy a start estimate runs forward lists the live pods; the kinds of pods gone
    # (and of the prior) only the live mix holds, and the copy must place as the live does
    from batchsched.insight.estimate import _copy

    live = Session(SessionSettings(mix_prior=(((1000, 0, 250), 7),)), use_jit=False)
    live.on_pods_listed([pod("a", cpu="8", gpus=1, node="n")])
    for p in (pod("b", cpu="4", core=50), pod("c", cpu="2")):
        live.on_pod("ADDED", p)
    live.on_pod("DELETED", pod("c", cpu="2"))
    copy = _copy(live, use_jit=False)
    assert dict(copy.state.mix) == dict(live.state.mix)
    assert mix_rows(copy.state.mix) == mix_rows(live.state.mix)


def test_the_configmap_body_restores_the_mix_in_place_of_the_prior() -> None:
    kube = FakeKube()
    stored = {(8000, 1, 1000): 12, (4000, 0, 500): 30, (2000, 0, 0): 3}
    kube.objects[MIX_PATH] = {"data": {DATA_KEY: mix_document(stored)}}
    state = ClusterState(mix_prior=(((1000, 0, 250), 7),))
    store = MixStore(kube, state, namespace="ns", lease_name="batchsched")
    assert asyncio.run(store.restore())
    state.replace_pods([pod("a", cpu="8", gpus=1, node="n")])
    assert dict(state.mix) == {(8000, 1, 1000): 13, (4000, 0, 500): 30, (2000, 0, 0): 3}
    # the body is what a user reads: kinds and counts, most frequent first
    assert json.loads(mix_document(stored))["kinds"][0] == {
        "cpuMilli": 4000, "wholeCards": 0, "shareMilli": 500, "count": 30}


@pytest.mark.parametrize(("body", "reason"), [
    ({"data": {DATA_KEY: "{not json"}}, "not JSON"),
    ({"data": {"other": "{}"}}, "no data key mix.json"),
    ({"data": {DATA_KEY: '{"kinds": [{"cpuMilli": -1, "wholeCards": 0, "shareMilli": 0, "count": 1}]}'}},
     "kinds[0].cpuMilli: expected a whole number from 0 to"),
    ({"data": {DATA_KEY: '{"kinds": [{"cpuMilli": 1, "wholeCards": 2, "shareMilli": 500, "count": 1}]}'}},
     "kinds[0]: whole cards with a share of 500"),
])
def test_a_malformed_configmap_is_a_warning_and_the_prior_stays(
    body: dict[str, Any], reason: str, caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube()
    kube.objects[MIX_PATH] = body
    state = ClusterState(mix_prior=(((1000, 0, 250), 7),))
    assert not asyncio.run(MixStore(kube, state, namespace="ns", lease_name="batchsched").restore())
    assert dict(state.mix) == {(1000, 0, 250): 7}
    [warning] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "batchsched-workload-mix" in warning.getMessage() and reason in warning.getMessage()


def test_an_unreadable_configmap_is_a_warning_and_the_start_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    kube.fail[f"GET {MIX_PATH}"] = [ForbiddenError(403, "Forbidden", "configmaps is forbidden")]
    state = ClusterState(mix_prior=(((1000, 0, 250), 7),))
    assert not asyncio.run(MixStore(kube, state, namespace="ns", lease_name="batchsched").restore())
    assert dict(state.mix) == {(1000, 0, 250): 7}
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "could not be read" in warning and "forbidden" in warning


def test_an_absent_configmap_starts_from_the_prior_and_the_leader_creates_it(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    state = ClusterState(mix_prior=(((1000, 0, 250), 7),))
    fence = Fence()
    store = MixStore(kube, state, namespace="ns", lease_name="batchsched", fence=fence)
    assert not asyncio.run(store.restore())
    assert dict(state.mix) == {(1000, 0, 250): 7}
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("no stored workload mix (ConfigMap batchsched-workload-mix")
    # a standby writes nothing
    assert not asyncio.run(store.write())
    fence.extend(float("inf"))
    kube.fail[f"PUT {MIX_PATH}"] = [NotFoundError(404, "NotFound", "absent")]
    assert asyncio.run(store.write())
    assert read_mix_document(kube.objects[MIX_PATH]["data"][DATA_KEY]) == {(1000, 0, 250): 7}
    # unchanged: not written again; changed: replaced
    assert not asyncio.run(store.write())
    state.pod_event("ADDED", pod("a", cpu="2"))
    state.pod_event("DELETED", pod("a", cpu="2"))
    assert asyncio.run(store.write())
    assert read_mix_document(kube.objects[MIX_PATH]["data"][DATA_KEY]) == {(1000, 0, 250): 7, (2000, 0, 0): 1}


def test_the_gauge_shows_the_kinds_measured_against() -> None:
    state = ClusterState()
    for i in range(3):
        state.pod_event("ADDED", pod(f"w{i}", cpu="8", gpus=1))
    state.pod_event("ADDED", pod("s", cpu="2", core=50))
    metrics = Metrics()
    observe_mix(metrics.workload_mix, state)
    got = {s.labels["cpu"] + "/" + s.labels["gpus"] + "/" + s.labels["gpu_share"]: s.value
           for m in metrics.workload_mix.collect() for s in m.samples}
    assert got == {"8/1/0": 0.75, "2/0/0.5": 0.25}
