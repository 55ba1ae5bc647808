"""The PodGroup APIs users already run, read into one value, and how a pod names its group.

The ways a pod says it belongs to a gang, all recognised without changing the job:

- Kubernetes' own ``scheduling.k8s.io/v1beta1`` PodGroup (1.36+); pods name it in
  ``spec.schedulingGroup.podGroupName`` (:mod:`batchsched.core.gangs.upstream` reads its spec);
- scheduler-plugins ``scheduling.x-k8s.io/v1alpha1`` PodGroup; pods labelled
  ``scheduling.x-k8s.io/pod-group: NAME`` (the Kubeflow training operator's non-volcano
  path, Kubeflow Trainer's coscheduling plugin, KubeRay);
- Volcano ``scheduling.volcano.sh/v1beta1`` PodGroup; pods annotated
  ``scheduling.k8s.io/group-name: NAME`` or labelled ``scheduling.volcano.sh/group-name``;
- the old kube-batch annotation ``scheduling.k8s.io/group-name`` alone, resolved against
  the PodGroup of that name in the pod's namespace: Volcano's if there is one, else
  scheduler-plugins';
- Kueue's plain pod groups: pods labelled ``kueue.x-k8s.io/pod-group-name: NAME`` and
  annotated ``kueue.x-k8s.io/pod-group-total-count: N``. There is no PodGroup object: the
  group is read from its pods (:func:`kueue_group`), its size is the total count, and what
  batchsched says of it goes to the pods and, as Events, to the Workload Kueue made for it
  (named after the group), never to a status of its own.

:func:`parse_podgroup` reads any PodGroup API into a :class:`PodGroup` and never raises
on an object the apiserver accepted; :func:`group_ref` reads which group a pod names. The
book (:mod:`batchsched.core.gangs.book`) joins the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NewType

from batchsched.core.gangs.upstream import K8S, UpstreamPolicy, read_conditions, read_spec
from batchsched.core.model import Pod, arrival_of, parse_time
from batchsched.core.plan import ObjectRef
from batchsched.core.quantity import QuantityError, QuantityRangeError, to_units

__all__ = [
    "ANNOTATION_GROUP",
    "ANNOTATION_KUEUE_TOTAL",
    "ANNOTATION_TASK",
    "API_VERSIONS",
    "K8S",
    "KUEUE",
    "LABEL_KUEUE_GROUP",
    "LABEL_VOLCANO",
    "LABEL_XK8S",
    "VOLCANO",
    "XK8S",
    "GroupKey",
    "GroupStatus",
    "PodGroup",
    "group_key",
    "group_ref",
    "kueue_group",
    "parse_podgroup",
]

GroupKey = NewType("GroupKey", str)

XK8S = "scheduling.x-k8s.io"
VOLCANO = "scheduling.volcano.sh"
#: Kueue's plain pod groups (no PodGroup object; see :func:`kueue_group`)
KUEUE = "kueue.x-k8s.io"
API_VERSIONS = {
    XK8S: f"{XK8S}/v1alpha1", VOLCANO: f"{VOLCANO}/v1beta1", KUEUE: f"{KUEUE}/v1beta2", K8S: f"{K8S}/v1beta1",
}
_SHORT = {XK8S: "x-k8s", VOLCANO: "volcano", KUEUE: "kueue", K8S: "k8s"}

LABEL_XK8S = "scheduling.x-k8s.io/pod-group"
LABEL_VOLCANO = "scheduling.volcano.sh/group-name"
ANNOTATION_GROUP = "scheduling.k8s.io/group-name"
ANNOTATION_TASK = "volcano.sh/task-spec"
LABEL_KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
ANNOTATION_KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
#: a PodGroup annotated ``"true"`` is suspended: none of its pods is placed, and members
#: already running are evicted, the whole gang (the job holds, as Kueue's ``suspend``)
SUSPEND_ANNOTATION = "batchsched.io/suspend"
#: ``"true"``: when a running gang loses a member (it failed, or its node went away) and
#: falls below its quorum, the rest is evicted at once so the whole job restarts together;
#: ``"false"``: the gang waits out its schedule timeout for the member to come back (the
#: default, unless ``gang.wholeJobRestart`` in the config says otherwise)
WHOLE_JOB_RESTART_ANNOTATION = "batchsched.io/whole-job-restart"

_ANY = "any"  # a kube-batch annotation: Volcano's group, else scheduler-plugins'
_INT32_MAX = 2**31 - 1

#: the condition types batchsched reads and writes, per API
_COND_XK8S = "PodGroupScheduled"
_COND_VOLCANO_OK = "Scheduled"
_COND_VOLCANO_WAIT = "Unschedulable"


# -- the PodGroup value -------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class GroupStatus:
    """What a PodGroup's status says, in the terms batchsched writes it (times aside)."""

    phase: str = ""
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    schedule_start: str = ""
    #: the condition batchsched owns: placed (True) or not, why, and a message for people
    scheduled: bool = False
    reason: str = ""
    message: str = ""
    #: why the group is being preempted (a ``scheduling.k8s.io`` group's ``DisruptionTarget``)
    disruption: str = ""


@dataclass(slots=True, frozen=True)
class PodGroup:
    api: str
    namespace: str
    name: str
    uid: str = ""
    created: float = 0.0
    min_member: int = 1
    min_resources: Mapping[str, int] = field(default_factory=dict)
    min_task_member: Mapping[str, int] = field(default_factory=dict)
    #: seconds a partly placed group may wait to become whole; None = the configured default
    schedule_timeout: float | None = None
    #: Volcano's ``spec.queue`` (scheduler-plugins' PodGroup has none)
    queue: str = ""
    priority_class: str = ""
    resource_version: str = ""
    #: its place in line among groups created in the same second: the resourceVersion it
    #: was first seen with, as an integer (the book keeps the first across status writes,
    #: which change the version, and numbers groups whose version is not an integer in the
    #: order they came); a Kueue group's is its oldest member's
    arrival: int = 0
    #: why the group cannot be used (it is reported, its pods are never placed)
    invalid: str = ""
    observed: GroupStatus = field(default_factory=GroupStatus)
    labels: Mapping[str, str] = field(default_factory=dict)
    #: ``metadata.annotations`` (the gang's topology policy is read from them)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: what a ``scheduling.k8s.io`` PodGroup asks beyond its quorum (None for other APIs)
    upstream: UpstreamPolicy | None = None
    #: the object that made the group, its ``ownerReferences`` entry marked ``controller``
    #: (a PyTorchJob, a RayCluster, a JobSet...): where its users look, so Events about the
    #: gang go there too; None when no controller owns it
    owner: ObjectRef | None = None

    #: the group's key (:func:`group_key`), made once: every step asks it of every group
    key: GroupKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", group_key(self.api, self.namespace, self.name))

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def suspended(self) -> bool:
        return self.annotations.get(SUSPEND_ANNOTATION, "").strip().lower() == "true"

    def restarts_whole(self, default: bool) -> bool:
        """Whether the job restarts whole when a running member is lost (a
        ``scheduling.k8s.io`` group's ``disruptionMode: all`` says so whatever the annotation)."""
        if self.upstream is not None and self.upstream.disruption_all:
            return True
        value = self.annotations.get(WHOLE_JOB_RESTART_ANNOTATION, "").strip().lower()
        return default if value not in ("true", "false") else value == "true"

    @property
    def api_version(self) -> str:
        return API_VERSIONS.get(self.api, self.api)

    @property
    def described(self) -> str:
        """How messages name it: ``PodGroup ns/name``, or ``Kueue pod group ns/name``."""
        return f"{'Kueue pod group' if self.from_pods else 'PodGroup'} {self.display}"

    @property
    def from_pods(self) -> bool:
        """A group read from its pods' labels (Kueue's): it has no object to write status to."""
        return self.api == KUEUE


def group_key(api: str, namespace: str, name: str) -> GroupKey:
    """The key of the group of ``api`` named ``namespace/name`` (:attr:`PodGroup.key`)."""
    return GroupKey(f"{_SHORT.get(api, api)}:{namespace}/{name}")


def _positive_int(value: Any, what: str) -> tuple[int, str]:
    if value is None:
        return 0, f"{what} must be a positive integer, got none"
    if isinstance(value, bool) or not isinstance(value, int):
        return 0, f"{what} must be a positive integer, got {value!r}"
    if not 0 < value <= _INT32_MAX:
        return 0, f"{what} must be a positive integer, got {value}"
    return value, ""


def _observed(status: Mapping[str, Any]) -> GroupStatus:
    def count(name: str) -> int:
        v = status.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    scheduled, reason, message = False, "", ""
    for c in status.get("conditions") or []:
        if not isinstance(c, Mapping):
            continue
        ctype = c.get("type")
        if ctype in (_COND_XK8S, _COND_VOLCANO_OK, _COND_VOLCANO_WAIT):
            scheduled = ctype != _COND_VOLCANO_WAIT and c.get("status") == "True"
            reason, message = str(c.get("reason") or ""), str(c.get("message") or "")
            break
    start = status.get("scheduleStartTime")
    return GroupStatus(
        phase=str(status.get("phase") or ""),
        running=count("running"),
        succeeded=count("succeeded"),
        failed=count("failed"),
        schedule_start=str(start) if isinstance(start, str) else "",
        scheduled=scheduled,
        reason=reason,
        message=message,
    )


def parse_podgroup(api: str, obj: Mapping[str, Any]) -> PodGroup:
    """A PodGroup of either API; never raises on an object the apiserver accepted.

    A malformed spec (``minMember`` missing, zero, negative or not an integer; a
    ``minResources`` quantity that does not parse; a negative ``minTaskMember``), or a
    suspend or whole-job-restart annotation that is neither ``"true"`` nor ``"false"``
    (a job meant to hold must not run because of a typo), makes the group
    :attr:`PodGroup.invalid`.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    problems: list[str] = []
    if not isinstance(spec, Mapping):
        spec, problems = {}, ["spec is not an object"]
    status = status if isinstance(status, Mapping) else {}
    upstream: UpstreamPolicy | None = None
    if api == K8S:
        min_member, upstream, found = read_spec(spec)
        problems.extend(found)
        observed = _observed_upstream(status)
    else:
        min_member, problem = _positive_int(spec.get("minMember"), "spec.minMember")
        if problem:
            problems.append(problem)
        observed = _observed(status)
    min_resources: dict[str, int] = {}
    raw = spec.get("minResources") or {}
    if not isinstance(raw, Mapping):
        problems.append("spec.minResources must map resource names to quantities")
    else:
        for name, value in raw.items():
            try:
                units = to_units(str(name), value)
            except QuantityRangeError as exc:
                problems.append(f"spec.minResources.{name}: {exc}")
                continue
            except QuantityError:
                problems.append(f"spec.minResources.{name}: {value!r} is not a quantity")
                continue
            if units < 0:
                problems.append(f"spec.minResources.{name}: {value!r} is negative")
            elif units:
                min_resources[str(name)] = units
    min_task: dict[str, int] = {}
    if api == VOLCANO:
        raw_tasks = spec.get("minTaskMember") or {}
        if not isinstance(raw_tasks, Mapping):
            problems.append("spec.minTaskMember must map task names to counts")
        else:
            for task, value in raw_tasks.items():
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    problems.append(f"spec.minTaskMember.{task} must be a whole number >= 0, got {value!r}")
                elif value:
                    min_task[str(task)] = value
    timeout: float | None = None
    raw_timeout = spec.get("scheduleTimeoutSeconds")
    if raw_timeout is not None:
        if isinstance(raw_timeout, bool) or not isinstance(raw_timeout, int):
            problems.append(f"spec.scheduleTimeoutSeconds must be an integer, got {raw_timeout!r}")
        elif raw_timeout > 0:
            timeout = float(raw_timeout)
    annotations = _strings(meta.get("annotations"))
    for name in (SUSPEND_ANNOTATION, WHOLE_JOB_RESTART_ANNOTATION):
        value = annotations.get(name)
        if value is not None and value.strip().lower() not in ("true", "false"):
            problems.append(f"annotation {name} must be \"true\" or \"false\", got {value!r}")
    return PodGroup(
        api=api,
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        created=parse_time(meta.get("creationTimestamp")),
        min_member=min_member or 1,
        min_resources=min_resources,
        min_task_member=min_task,
        schedule_timeout=timeout,
        queue=str(spec.get("queue") or ""),
        priority_class=str(spec.get("priorityClassName") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        arrival=arrival_of(str(meta.get("resourceVersion") or "")),
        invalid="; ".join(problems),
        observed=observed,
        labels=_strings(meta.get("labels")),
        annotations=annotations,
        upstream=upstream,
        owner=controller_of(meta),
    )


def controller_of(meta: Mapping[str, Any]) -> ObjectRef | None:
    """The object's controller: its ``ownerReferences`` entry with ``controller: true``
    (the API allows one at most), in the object's namespace (owners of namespaced objects
    are in the same one); None when there is none or it lacks its kind, version, name or
    uid (an Event must name its object exactly for ``kubectl describe`` to show it)."""
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if not isinstance(ref, Mapping) or ref.get("controller") is not True:
            continue
        fields = [ref.get(k) for k in ("kind", "apiVersion", "name", "uid")]
        if not all(isinstance(f, str) and f for f in fields):
            return None
        kind, api_version, name, uid = (str(f) for f in fields)
        return ObjectRef(kind=kind, api_version=api_version, namespace=str(meta.get("namespace") or ""),
                         name=name, uid=uid)
    return None


def _observed_upstream(status: Mapping[str, Any]) -> GroupStatus:
    scheduled, reason, message, disruption = read_conditions(status)
    return GroupStatus(scheduled=scheduled, reason=reason, message=message, disruption=disruption)


def _strings(raw: Any) -> dict[str, str]:
    """A string map of the metadata (labels, annotations); anything else is no map."""
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def group_ref(pod: Pod) -> tuple[str, str] | None:
    """``(api or "any", group name)`` the pod names, or None for a pod of no group.

    The scheduler-plugins label wins over Volcano's label, which wins over the kube-batch
    annotation (shared by Volcano and the old kube-batch, resolved when the groups are known).
    A pod's ``spec.schedulingGroup`` (Kubernetes' own pod groups) comes before them all.
    """
    if pod.scheduling_group:
        return K8S, pod.scheduling_group
    name = pod.labels.get(LABEL_XK8S)
    if name:
        return XK8S, name
    name = pod.labels.get(LABEL_VOLCANO)
    if name:
        return VOLCANO, name
    name = pod.annotations.get(ANNOTATION_GROUP)
    if name:
        return _ANY, name
    name = pod.labels.get(LABEL_KUEUE_GROUP)
    if name:
        return KUEUE, name
    return None


def kueue_group(pod: Pod) -> PodGroup:
    """The Kueue pod group ``pod`` is a member of, as the pod describes it: its size is the
    pod's ``kueue.x-k8s.io/pod-group-total-count`` (Kueue gives every member the same one),
    its age the pod's. A count that is missing or not a positive integer makes it invalid."""
    raw = pod.annotations.get(ANNOTATION_KUEUE_TOTAL)
    count: Any = raw
    if raw is not None and raw.strip().isdigit():
        count = int(raw.strip())
    size, problem = _positive_int(count, f"annotation {ANNOTATION_KUEUE_TOTAL} of pod {pod.name}")
    return PodGroup(
        api=KUEUE, namespace=pod.namespace, name=pod.labels[LABEL_KUEUE_GROUP], created=pod.created,
        arrival=pod.arrival, min_member=size or 1, invalid=problem,
    )

