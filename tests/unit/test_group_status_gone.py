"""A scheduler-plugins PodGroup deleted while its status write waits: the 404 of its
``/status`` means the group is gone, not that the CRD lacks the subresource. The object
itself is not patched (a request batchsched's role does not allow: the suite's RBAC check
saw it refused when a chaos fault deleted PodGroups), and later groups keep their
subresource."""

from __future__ import annotations

import asyncio

from batchsched.core.gangs import VOLCANO, XK8S, GroupStatus, PodGroup
from batchsched.kube.errors import NotFoundError
from batchsched.kube.fake import FakeKube
from batchsched.kube.groupstatus import GroupStatusWriter
from tests.unit.test_fence import writing

XK8S_PATH = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups"
VOLCANO_PATH = "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups"
WAITING = GroupStatus(phase="Pending", reason="Unschedulable", message="no room")


def test_a_deleted_scheduler_plugins_group_is_not_patched_on_the_object() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.fail[f"PATCH {XK8S_PATH}/gone/status"] = [NotFoundError(404, "NotFound", "gone")]
        writer = GroupStatusWriter(kube)
        writer.update(PodGroup(api=XK8S, namespace="ns", name="gone", uid="u1"), WAITING)
        await writing(writer.run, writer.drain)
        assert kube.paths("PATCH") == [f"{XK8S_PATH}/gone/status"]
        writer.update(PodGroup(api=XK8S, namespace="ns", name="next", uid="u2"), WAITING)
        await writing(writer.run, writer.drain)
        assert kube.paths("PATCH")[-1] == f"{XK8S_PATH}/next/status"

    asyncio.run(main())


def test_a_volcano_group_is_patched_on_the_object() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.fail[f"PATCH {VOLCANO_PATH}/g/status"] = [NotFoundError(404, "NotFound", "no route")]
        writer = GroupStatusWriter(kube)
        writer.update(PodGroup(api=VOLCANO, namespace="ns", name="g", uid="u1"), WAITING)
        await writing(writer.run, writer.drain)
        assert kube.paths("PATCH") == [f"{VOLCANO_PATH}/g/status", f"{VOLCANO_PATH}/g"]

    asyncio.run(main())
