"""A Binding that carries a card assignment: the pod is annotated first, then bound, as one
step; stale assignments are cleaned up with a null-ing merge patch. Against the in-memory
FakeKube, which applies merge patches to the pods it keeps and refuses a patch naming
another UID as the apiserver does (422 on ``metadata.uid``)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from batchsched.app import Scheduler
from batchsched.config import load_config
from batchsched.core.decisions import Decisions
from batchsched.core.plan import Binding, ObjectRef
from batchsched.kube.binder import Binder
from batchsched.kube.cleanup import CleanupWriter, uid_refused
from batchsched.kube.errors import (
    ConflictError,
    InvalidError,
    KubeError,
    NotFoundError,
    TemporaryError,
)
from batchsched.kube.fake import Call, FakeKube, FakeSleep

POD_PATH = "/api/v1/namespaces/ns/pods/p"
BIND_PATH = f"{POD_PATH}/binding"
CARDS = "batchsched.io/gpu-cards"
POLICY = "batchsched.io/gpu-policy"
CARD_LABEL = "batchsched.io/cards-assigned"

PLAIN = Binding(uid="u1", namespace="ns", name="p", node="n1", unit="ns/p")
CARDED = dataclasses.replace(
    PLAIN, cards=((0, 3),), annotations=((CARDS, "0,3"), (POLICY, "pack")), labels=((CARD_LABEL, "true"),)
)
POD = ObjectRef(kind="Pod", api_version="v1", namespace="ns", name="p", uid="u1")


def fast(writer: Any, sleep: FakeSleep) -> None:
    writer.retry = dataclasses.replace(writer.retry, sleep=sleep, draw=lambda: 0.0)


def stored_pod(kube: FakeKube, *, uid: str = "u1", annotations: dict[str, str] | None = None,
               labels: dict[str, str] | None = None) -> None:
    kube.objects[POD_PATH] = {"metadata": {
        "name": "p", "namespace": "ns", "uid": uid,
        "annotations": dict(annotations or {"owner": "team-a"}),
        "labels": dict(labels or {"app": "train"}),
    }}


def outcomes(kube: FakeKube, binding: Binding, *, retries: int = 2,
             sleep: FakeSleep | None = None) -> list[tuple[str, KubeError | None]]:
    results: list[tuple[str, KubeError | None]] = []

    async def main() -> None:
        binder = Binder(kube, retries=retries, on_result=lambda b, o, err: results.append((o, err)))
        fast(binder, sleep or FakeSleep())
        binder.submit(binding)
        assert await binder.drain(1.0)

    asyncio.run(main())
    return results


def requests(kube: FakeKube) -> list[tuple[str, str]]:
    return [(c.method, c.path) for c in kube.calls]


# -- the binder ---------------------------------------------------------------------------


def test_the_assignment_is_patched_on_the_pod_before_the_binding() -> None:
    kube = FakeKube()
    stored_pod(kube)
    assert [o for o, _ in outcomes(kube, CARDED)] == ["bound"]
    assert requests(kube) == [("PATCH", POD_PATH), ("POST", BIND_PATH)]
    patch = kube.calls[0]
    assert patch.kind == "merge"
    assert patch.body == {"metadata": {
        "uid": "u1",
        "annotations": {CARDS: "0,3", POLICY: "pack"},
        "labels": {CARD_LABEL: "true"},
    }}
    assert kube.calls[1].body["metadata"]["uid"] == "u1"
    meta = kube.objects[POD_PATH]["metadata"]
    assert meta["annotations"] == {"owner": "team-a", CARDS: "0,3", POLICY: "pack"}
    assert meta["labels"] == {"app": "train", CARD_LABEL: "true"}


def test_annotations_alone_are_patched_without_a_labels_field() -> None:
    kube = FakeKube()
    binding = dataclasses.replace(CARDED, labels=())
    assert [o for o, _ in outcomes(kube, binding)] == ["bound"]
    assert kube.calls[0].body == {"metadata": {"uid": "u1", "annotations": {CARDS: "0,3", POLICY: "pack"}}}


def test_a_binding_without_an_assignment_is_one_request_as_before() -> None:
    kube = FakeKube()
    stored_pod(kube)
    assert [o for o, _ in outcomes(kube, PLAIN)] == ["bound"]
    assert requests(kube) == [("POST", BIND_PATH)]


REPLACED = InvalidError(422, "Invalid", 'Pod "p" is invalid: metadata.uid: Invalid value: "u1": field is immutable')


@pytest.mark.parametrize(
    ("errors", "outcome", "delays"),
    [
        ([NotFoundError(404, "NotFound", 'pods "p" not found')], "gone", []),
        ([ConflictError(409, "Conflict", "the object has been modified")], "conflict", []),
        ([REPLACED], "conflict", []),
        ([KubeError(422, "Invalid", "")], "failed", []),
        ([InvalidError(422, "Invalid", "metadata.labels: Invalid value: \"x y\"")], "failed", []),
        ([TemporaryError(503, "ServiceUnavailable", "")] * 3, "unknown", [0.2, 0.4]),
        ([KubeError(403, "Forbidden", "")], "failed", []),
    ],
)
def test_a_failed_patch_sends_no_binding_and_reports_as_a_binding_would(
    errors: list[KubeError], outcome: str, delays: list[float]
) -> None:
    kube = FakeKube()
    kube.fail[f"PATCH {POD_PATH}"] = list(errors)
    sleep = FakeSleep()
    [(got, err)] = outcomes(kube, CARDED, sleep=sleep)
    assert got == outcome
    assert err is not None
    assert sleep.delays == delays
    assert kube.paths("POST") == []
    assert kube.paths("PATCH") == [POD_PATH] * (len(delays) + 1)


def test_a_patch_is_retried_under_the_binding_policy_then_the_binding_follows() -> None:
    kube = FakeKube()
    kube.fail[f"PATCH {POD_PATH}"] = [TemporaryError(500, "", "")] * 2
    sleep = FakeSleep()
    assert [o for o, _ in outcomes(kube, CARDED, sleep=sleep)] == ["bound"]
    assert sleep.delays == [0.2, 0.4]
    assert requests(kube) == [("PATCH", POD_PATH)] * 3 + [("POST", BIND_PATH)]


def test_a_pod_replaced_under_its_name_refuses_the_patch_and_is_a_conflict() -> None:
    kube = FakeKube()
    stored_pod(kube, uid="u2")  # the pod we placed (u1) was deleted and created again
    [(outcome, err)] = outcomes(kube, CARDED)
    assert outcome == "conflict"
    assert isinstance(err, InvalidError) and uid_refused(err)
    assert requests(kube) == [("PATCH", POD_PATH)]
    assert CARDS not in kube.objects[POD_PATH]["metadata"]["annotations"]


def test_when_the_binding_fails_after_the_patch_its_own_outcome_is_reported() -> None:
    kube = FakeKube()
    stored_pod(kube)
    kube.fail[BIND_PATH] = [ConflictError(409, "Conflict", "pod p is already assigned to node n2")]
    assert [o for o, _ in outcomes(kube, CARDED)] == ["conflict"]
    assert requests(kube) == [("PATCH", POD_PATH), ("POST", BIND_PATH)]
    # the stale assignment stays until the core asks for its cleanup
    assert kube.objects[POD_PATH]["metadata"]["annotations"][CARDS] == "0,3"


def test_the_patch_and_the_binding_each_take_a_place_in_the_budget() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.gate = asyncio.Event()
        binder = Binder(kube, concurrency=2, on_result=lambda b, o, err: None)
        for i in range(5):
            binder.submit(dataclasses.replace(CARDED, name=f"p{i}"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert kube.peak_total == 2
        kube.gate.set()
        assert await binder.drain(1.0)
        assert len(kube.paths("PATCH")) == len(kube.paths("POST")) == 5

    asyncio.run(main())


# -- cleanups -----------------------------------------------------------------------------


def run_cleanups(kube: FakeKube, *items: tuple[ObjectRef, tuple[str, ...], tuple[str, ...]],
                 sleep: FakeSleep | None = None) -> CleanupWriter:
    async def main() -> CleanupWriter:
        writer = CleanupWriter(kube)
        fast(writer, sleep or FakeSleep())
        for ref, stale_annotations, stale_labels in items:
            writer.submit(ref, stale_annotations, stale_labels)
        assert await writer.drain(1.0)
        return writer

    return asyncio.run(main())


def test_a_cleanup_nulls_the_stale_keys_and_keeps_the_others() -> None:
    kube = FakeKube()
    stored_pod(kube, annotations={"owner": "team-a", CARDS: "0,3", POLICY: "pack"},
               labels={"app": "train", CARD_LABEL: "true"})
    writer = run_cleanups(kube, (POD, (CARDS, POLICY), (CARD_LABEL,)))
    [patch] = kube.calls
    assert (patch.method, patch.path, patch.kind) == ("PATCH", POD_PATH, "merge")
    assert patch.body == {"metadata": {
        "uid": "u1", "annotations": {CARDS: None, POLICY: None}, "labels": {CARD_LABEL: None},
    }}
    meta = kube.objects[POD_PATH]["metadata"]
    assert (meta["annotations"], meta["labels"]) == ({"owner": "team-a"}, {"app": "train"})
    assert (writer.written, writer.dropped, writer.in_flight) == (1, 0, 0)


def test_a_cleanup_of_annotations_only_sends_no_labels() -> None:
    kube = FakeKube()
    run_cleanups(kube, (POD, (CARDS,), ()))
    assert kube.calls == [Call("PATCH", POD_PATH, {"metadata": {"uid": "u1", "annotations": {CARDS: None}}}, "merge")]


def test_a_cleanup_with_no_keys_sends_nothing() -> None:
    kube = FakeKube()
    run_cleanups(kube, (POD, (), ()))
    assert kube.calls == []


@pytest.mark.parametrize(
    ("errors", "tries"),
    [
        ([NotFoundError(404, "NotFound", 'pods "p" not found')], 1),
        ([ConflictError(409, "Conflict", "")], 1),
        ([REPLACED], 1),
        ([KubeError(403, "Forbidden", "")], 1),
        ([TemporaryError(503, "", "")] * 4, 4),
    ],
)
def test_a_failed_cleanup_is_logged_and_dropped_never_raised(errors: list[KubeError], tries: int) -> None:
    kube = FakeKube()
    kube.fail[POD_PATH] = list(errors)
    writer = run_cleanups(kube, (POD, (CARDS,), (CARD_LABEL,)))
    assert kube.paths() == [POD_PATH] * tries
    assert (writer.written, writer.dropped, writer.in_flight) == (0, 1, 0)


def test_a_cleanup_of_a_replaced_pod_leaves_the_new_pod_alone() -> None:
    kube = FakeKube()
    stored_pod(kube, uid="u2", annotations={CARDS: "5"})
    writer = run_cleanups(kube, (POD, (CARDS,), ()))
    assert kube.objects[POD_PATH]["metadata"]["annotations"] == {CARDS: "5"}
    assert writer.dropped == 1


def test_a_binding_waits_for_a_cleanup_of_its_pod_still_in_flight() -> None:
    """The cleanup must not land after the new assignment and erase it."""

    async def main() -> None:
        kube = FakeKube()
        stored_pod(kube, annotations={CARDS: "1"})
        kube.gate = asyncio.Event()
        cleanups = CleanupWriter(kube)
        binder = Binder(kube, on_result=lambda b, o, err: None, cleanups=cleanups)
        cleanups.submit(POD, (CARDS,), ())
        binder.submit(CARDED)
        binder.submit(dataclasses.replace(PLAIN, uid="u9", name="q"))  # another pod: not held
        for _ in range(20):
            await asyncio.sleep(0)
        assert requests(kube) == [("PATCH", POD_PATH), ("POST", "/api/v1/namespaces/ns/pods/q/binding")]
        kube.gate.set()
        assert await cleanups.drain(1.0)
        assert await binder.drain(1.0)
        assert requests(kube)[2:] == [("PATCH", POD_PATH), ("POST", BIND_PATH)]
        assert kube.objects[POD_PATH]["metadata"]["annotations"][CARDS] == "0,3"

    asyncio.run(main())


# -- the wiring ---------------------------------------------------------------------------


def test_the_scheduler_sends_a_steps_cleanups_before_its_bindings() -> None:
    async def main() -> None:
        kube = FakeKube()
        sched = Scheduler(kube, load_config(None))  # type: ignore[arg-type]
        sched.binder.on_result = lambda b, o, err: None  # no session behind this step
        sched.fence.extend(float("inf"))  # as a replica that leads
        other = dataclasses.replace(POD, name="old", uid="u7")
        sched._apply(Decisions(binds=[CARDED], cleanups=[(other, (CARDS,), (CARD_LABEL,)), (POD, (CARDS,), ())]))
        assert await sched.binder.drain(1.0)
        assert await sched.cleanups.drain(1.0)
        patches = [(c.path, c.body["metadata"]) for c in kube.calls if c.method == "PATCH"]
        assert patches == [
            ("/api/v1/namespaces/ns/pods/old",
             {"uid": "u7", "annotations": {CARDS: None}, "labels": {CARD_LABEL: None}}),
            (POD_PATH, {"uid": "u1", "annotations": {CARDS: None}}),
            (POD_PATH, {"uid": "u1", "annotations": {CARDS: "0,3", POLICY: "pack"}, "labels": {CARD_LABEL: "true"}}),
        ]
        assert kube.paths("POST") == [BIND_PATH]

    asyncio.run(main())
