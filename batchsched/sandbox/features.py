"""The Kubernetes features the sandbox's control plane runs with, in one place.

Every component of the sandbox (kube-apiserver, kube-controller-manager) and every
kube-scheduler the tests and the perf suite start get :data:`FEATURE_GATES`; the apiserver
also serves the API versions of :data:`RUNTIME_CONFIG`. In Kubernetes 1.37:

* ``GenericWorkload`` (beta, off by default): the Workload API, ``Workload`` and
  ``PodGroup`` of ``scheduling.k8s.io``, pods joining a group through
  ``spec.schedulingGroup``, and kube-scheduler's gang scheduling of such groups;
* ``TopologyAwareWorkloadScheduling`` (alpha): a PodGroup's topology constraints;
* ``PodGroupPreemptionPolicy`` (alpha): a PodGroup's ``priority`` and ``preemptionPolicy``;
* ``DRAWorkloadResourceClaims`` (beta, off by default): ResourceClaims at PodGroup level;
* ``WorkloadWithJob`` (alpha): kube-controller-manager's Job controller makes a Workload
  and a PodGroup for a Job it creates pods for (a gang of ``parallelism`` pods), and its
  pods join that group, so a batch/Job (one Kueue admits, for one) is placed whole.
  Dynamic resource allocation itself is GA and always on (``resource.k8s.io/v1`` is
  served by default).

The Workload API is beta, and beta APIs are not served unless asked for:
``scheduling.k8s.io/v1beta1`` is turned on with ``--runtime-config``.
"""

from __future__ import annotations

from collections.abc import Iterable

FEATURE_GATES = (
    "GenericWorkload=true",
    "TopologyAwareWorkloadScheduling=true",
    "PodGroupPreemptionPolicy=true",
    "DRAWorkloadResourceClaims=true",
    "WorkloadWithJob=true",
)
RUNTIME_CONFIG = ("scheduling.k8s.io/v1beta1=true",)

#: the flags whose values are comma-separated lists that :func:`merge_list_flags` joins
LIST_FLAGS = ("--feature-gates", "--runtime-config")


def merge_list_flags(args: Iterable[str]) -> list[str]:
    """``args`` with every ``--feature-gates=`` (and ``--runtime-config=``) joined into one
    flag at the place of its first occurrence; a later setting of the same key wins, as
    it would on a command line that named it twice in one flag."""
    merged: dict[str, dict[str, str]] = {}
    place: dict[str, int] = {}
    out: list[str] = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag not in LIST_FLAGS or not eq:
            out.append(arg)
            continue
        if flag not in merged:
            merged[flag] = {}
            place[flag] = len(out)
            out.append(flag)
        for item in filter(None, value.split(",")):
            key, _, setting = item.partition("=")
            merged[flag][key] = setting
    for flag, index in place.items():
        out[index] = f"{flag}=" + ",".join(f"{k}={v}" for k, v in merged[flag].items())
    return out

def control_plane_args(extra: Iterable[str] = ()) -> list[str]:
    """:data:`FEATURE_GATES` as a flag, then ``extra`` merged into it (a caller's
    ``--feature-gates=`` adds gates or overrides one)."""
    return merge_list_flags(["--feature-gates=" + ",".join(FEATURE_GATES), *extra])


def apiserver_args(extra: Iterable[str] = ()) -> list[str]:
    """The apiserver's gates and runtime config, with ``extra`` merged in."""
    return control_plane_args(["--runtime-config=" + ",".join(RUNTIME_CONFIG), *extra])


__all__ = ["FEATURE_GATES", "RUNTIME_CONFIG", "apiserver_args", "control_plane_args", "merge_list_flags"]
