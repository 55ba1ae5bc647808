"""KubeRay's pods that name no gang: the rule that tells them apart.

The KubeRay operator run with ``--batch-scheduler=scheduler-plugins`` gives every pod it
makes the scheduler's name, but makes a PodGroup (and labels the pods with it) only for a
RayCluster labelled ``ray.io/gang-scheduling-enabled``. The pods of any other RayCluster
reach batchsched as single pods: they are placed one by one, as room appears, and a
cluster can be left partly placed, holding GPUs it cannot use while its other pods wait.

batchsched does not guess a gang for them: a gang needs its size, which only the
RayCluster says (replicas clamped to the autoscaling bounds, times hosts), and the user
who left the label off asked KubeRay for no gang. It says so instead, where a user looks:
an Event on each such pod and on its RayCluster, and a note in the condition of the pods
that wait (:mod:`batchsched.core.books.told`). :func:`ray_cluster_without_group` is the
one place that decides which pods these are; the text is in :mod:`batchsched.core.explain`.
"""

from __future__ import annotations

from batchsched.core.gangs.podgroup import group_ref
from batchsched.core.model import Pod
from batchsched.core.plan import ObjectRef

__all__ = ["GANG_LABEL", "RAY_API_GROUP", "RAY_CLUSTER", "ray_cluster_without_group"]

#: the API group of KubeRay's objects
RAY_API_GROUP = "ray.io"
RAY_CLUSTER = "RayCluster"
#: the RayCluster label (any value) that makes KubeRay create the cluster's PodGroup
GANG_LABEL = "ray.io/gang-scheduling-enabled"


def ray_cluster_without_group(pod: Pod) -> ObjectRef | None:
    """The RayCluster that made ``pod`` (its controller ownerReference) when the pod names
    no gang of any API; None for every other pod (a gang's member, a pod of another maker)."""
    owner = pod.controller
    if owner is None or owner.kind != RAY_CLUSTER or owner.api_version.split("/", 1)[0] != RAY_API_GROUP:
        return None
    if group_ref(pod) is not None:
        return None
    return ObjectRef(kind=RAY_CLUSTER, api_version=owner.api_version, namespace=pod.namespace,
                     name=owner.name, uid=owner.uid)
