"""Pods of one template are read once: what a pod asks (requests, cards, extended asks,
tolerations) comes from a memo keyed by what it is read from. A pod read through the memo
is the pod read afresh, whatever its neighbours asked, and no two pods share a mutable
part."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batchsched.core import model
from batchsched.core.devices import (
    CARDS_ANNOTATION,
    ELASTIC_CORE,
    ELASTIC_MEMORY,
    POLICY_ANNOTATION,
)
from batchsched.core.model import parse_pod


def pod(name: str, requests: dict[str, str], *, annotations: dict[str, str] | None = None,
        init: list[dict[str, Any]] | None = None, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "batchsched",
        "containers": [{"name": "main", "image": "x", "resources": {"requests": requests}}],
    }
    if init is not None:
        spec["initContainers"] = init
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations or {}},
            "spec": spec, "status": {"phase": "Pending"}}


KINDS = [
    pod("gpu", {"cpu": "1", "nvidia.com/gpu": "2"}),
    pod("gpu-packed", {"cpu": "1", "nvidia.com/gpu": "2"}, annotations={POLICY_ANNOTATION: "spread"}),
    pod("share", {ELASTIC_CORE: "30", ELASTIC_MEMORY: "2048"}),
    pod("bound-share", {ELASTIC_CORE: "30", ELASTIC_MEMORY: "2048"}, annotations={CARDS_ANNOTATION: "main=3"}),
    pod("unreadable", {"cpu": "lots"}),
    pod("refused", {"nvidia.com/gpu": "1", ELASTIC_CORE: "50"}),
    pod("init", {"cpu": "1"}, init=[{"name": "setup", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}]),
    pod("tolerant", {"cpu": "1"}, tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]),
    pod("extended", {"example.com/fpga": "2"}),
    pod("sidecar", {"cpu": "1"}, init=[{"name": "setup", "restartPolicy": "Always",
                                       "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}]),
]


def fresh(obj: dict[str, Any]) -> model.Pod:
    model._SPEC_ASKS.clear()
    try:
        return parse_pod(obj)
    finally:
        model._SPEC_ASKS.clear()


@pytest.mark.parametrize("first", KINDS, ids=lambda o: o["metadata"]["name"])
def test_a_pod_read_after_any_other_is_the_pod_read_afresh(first: dict[str, Any]) -> None:
    model._SPEC_ASKS.clear()
    parse_pod(first)
    for obj in KINDS:
        twin = copy.deepcopy(obj)
        twin["metadata"]["name"] += "-2"
        twin["metadata"]["uid"] += "-2"
        assert parse_pod(obj) == fresh(obj)
        assert parse_pod(twin) == fresh(twin)


def test_pods_of_one_template_share_no_mutable_part() -> None:
    model._SPEC_ASKS.clear()
    a, b = (parse_pod(pod(n, {"cpu": "1", "nvidia.com/gpu": "2"})) for n in ("a", "b"))
    assert a.requests == b.requests and a.requests is not b.requests
    a.requests["cpu"] = 0  # nothing should ever do this; if something did, b would not see it
    assert b.requests["cpu"] == 1000


def test_the_memo_is_bounded() -> None:
    model._SPEC_ASKS.clear()
    for i in range(model.SPEC_ASKS_KEPT + 10):
        parse_pod(pod(f"p{i}", {"cpu": f"{i + 1}m"}))
    assert len(model._SPEC_ASKS) <= model.SPEC_ASKS_KEPT
    assert parse_pod(pod("again", {"cpu": "5m"})).requests["cpu"] == 5


def mounted(obj: dict[str, Any], volume: str) -> dict[str, Any]:
    """``obj`` as the apiserver returns it: each pod mounts its own service account token."""
    out = copy.deepcopy(obj)
    for c in out["spec"]["containers"]:
        c["volumeMounts"] = [{"name": volume, "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    return out


def test_pods_of_one_template_with_their_own_token_mounts_are_read_once() -> None:
    model._SPEC_ASKS.clear()
    template = pod("worker", {"cpu": "1", "nvidia.com/gpu": "2"})
    pods = [mounted(template, f"kube-api-access-{i:05x}") for i in range(50)]
    read = [parse_pod(p) for p in pods]
    assert len(model._SPEC_ASKS) == 1
    assert all(r.requests == fresh(p).requests for r, p in zip(read, pods, strict=True))


def test_a_sidecar_and_an_init_container_alike_but_for_their_restart_policy_are_read_apart() -> None:
    model._SPEC_ASKS.clear()
    init = next(o for o in KINDS if o["metadata"]["name"] == "init")
    sidecar = next(o for o in KINDS if o["metadata"]["name"] == "sidecar")
    # the init container runs first, alone; the sidecar keeps running beside the main one
    assert parse_pod(init).requests["cpu"] == 4000
    assert parse_pod(sidecar).requests["cpu"] == 5000
