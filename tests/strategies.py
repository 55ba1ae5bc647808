"""Hypothesis strategies for the objects batchsched reads, bad ones above all.

Each strategy draws a JSON object as the apiserver would return it (or, with
:func:`mangled`, as it never would: a value of the wrong type somewhere), so a test can push
it through the parsers (:func:`~batchsched.core.model.parse_pod`,
:func:`~batchsched.core.gangs.parse_podgroup`, :func:`~batchsched.core.queues.parse_queue`,
:func:`~batchsched.config.parse_config`) and through a whole scheduling session.

- :func:`pods`: pods of batchsched with odd requests and limits (huge, negative, zero,
  fractional, malformed quantities), GPU shares and the annotations batchsched reads,
  selectors, affinity, tolerations, spread constraints, priority, gates, volumes, queue
  and gang labels;
- :func:`podgroups`: PodGroups of both APIs (scheduler-plugins and Volcano) with odd
  ``minMember``, ``minResources``, ``minTaskMember``, timeouts, queues;
- :func:`queues`: Queues whose names come from a small pool, so parents that do not exist,
  parent cycles, self-parents and duplicates come up often;
- :func:`config_documents`: configuration documents, mostly wrong somewhere.

``apiserver=True`` (the default for pods) keeps every field the type the apiserver's schema
gives it, so the object could be stored; values may still be anything that type allows.
Names are drawn from small pools on purpose: collisions (a pod naming a gang that exists,
a queue named twice) are where bugs hide.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from batchsched.core.devices import (
    CARDS_ANNOTATION,
    ELASTIC_CONTAINER_PREFIX,
    ELASTIC_CORE,
    ELASTIC_MEMORY,
    KAI_CONTAINER,
    KAI_DEVICES,
    KAI_FRACTION,
    KAI_MEMORY,
    POLICY_ANNOTATION,
)
from batchsched.core.gangs import (
    ANNOTATION_GROUP,
    ANNOTATION_TASK,
    LABEL_VOLCANO,
    LABEL_XK8S,
    VOLCANO,
    XK8S,
)
from batchsched.core.gangs.podgroup import API_VERSIONS
from batchsched.core.placement.topology import TOPOLOGY_ANNOTATION, TOPOLOGY_PREFERRED_ANNOTATION
from batchsched.core.queues import QUEUE_LABEL
from batchsched.core.reservation import RUNTIME_ANNOTATION

__all__ = [
    "BAD_NAMESPACE",
    "GROUP_NAMES",
    "QUEUE_NAMES",
    "RESERVED_TAINT",
    "RESOURCES",
    "config_documents",
    "dns_names",
    "json_values",
    "mangled",
    "podgroups",
    "pods",
    "quantities",
    "queues",
    "stored_podgroups",
    "stored_pods",
    "stored_queues",
]

#: the namespace bad work lives in (valid work next to it lives elsewhere)
BAD_NAMESPACE = "fuzz"
#: a taint no drawn pod tolerates: nodes kept for the valid work next to the bad
RESERVED_TAINT = "fuzz.batchsched.io/valid-only"
GROUP_NAMES = ("g0", "g1", "g2")
QUEUE_NAMES = ("qa", "qb", "qc", "default")
RESOURCES = ("cpu", "memory", "nvidia.com/gpu", ELASTIC_CORE, ELASTIC_MEMORY, "example.com/widget", "pods",
             "ephemeral-storage", "hugepages-2Mi")

# -- values ---------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)
"""Any JSON value (the wrong type for most fields)."""

_quantity_texts = st.one_of(
    st.sampled_from([
        "0", "1", "2", "8", "100m", "0.5", "1.5", "250m", "1Gi", "512Mi", "16Gi", "1n", "1u",
        "0.0001", "1e3", "1E3", "1e-3", "1e30", "1e308", "1e400", "1Ei", "8Ei", "1125899906842624",
        "1125899906842623", "999999999999999999999", "1P", "1Pi", "+1", "-1", "-0", "-100m",
        "-1Gi", ".5", "5.", "0.0", "1.2.3", "abc", "", " ", "1e", "Ki", "1KiB", "1 Gi", " 1",
        "1e3Ki", "0x10", "∞", "１", "nan", "NaN", "inf", "-inf", "1_000",  # noqa: RUF001 - a fullwidth digit on purpose
    ]),
    st.from_regex(r"\A[+-]?[0-9]{1,20}(\.[0-9]{0,4})?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]{1,3})?\Z"),
)

#: quantities as the apiserver may hold them in a Pod: strings it parsed (negatives are
#: refused for requests by its validation, but the parser must not care)
quantities = _quantity_texts


def _any_quantity() -> st.SearchStrategy[Any]:
    """A quantity where a CRD or a careless writer puts it: strings, numbers, anything."""
    return st.one_of(
        _quantity_texts, st.integers(-(2**64), 2**64), st.floats(allow_nan=False, allow_infinity=False),
        st.just(None), st.booleans(), st.lists(st.integers(), max_size=2), st.just({"value": 1}),
    )


def dns_names(*, pool: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    """Names: from ``pool`` mostly, else DNS labels at and past their limits, unicode,
    and plain wrong ones."""
    odd = st.one_of(
        st.sampled_from(["a" * 63, "a" * 64, "a" * 253, "a" * 254, "Upper", "-lead", "trail-", "dot.ted",
                         "ünï", "名前", "x" * 300, "with space", "a/b", ""]),
        st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z"),
        st.text(max_size=20),
    )
    return st.one_of(st.sampled_from(pool), odd) if pool else odd


_label_values = st.one_of(
    st.sampled_from(["", "x", "a" * 63, "true"]), st.from_regex(r"\A[a-z0-9]([-a-z0-9_.]{0,10}[a-z0-9])?\Z"),
)


def _resource_map(draw: st.DrawFn, *, names: tuple[str, ...] = RESOURCES) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(names), max_size=4, unique=True))
    return {k: draw(quantities) for k in keys}


# -- pods -----------------------------------------------------------------------------------


@st.composite
def _container(draw: st.DrawFn, name: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "trainer:latest"}
    resources: dict[str, Any] = {}
    if draw(st.booleans()):
        resources["requests"] = _resource_map(draw)
    if draw(st.booleans()):
        resources["limits"] = _resource_map(draw)
    if resources:
        c["resources"] = resources
    return c


_operators = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Equals", ""])
_keys = st.sampled_from(["zone", "pool", "kubernetes.io/hostname", "topology.kubernetes.io/zone", "x" * 70, "", "ü"])


@st.composite
def _requirement(draw: st.DrawFn) -> dict[str, Any]:
    req: dict[str, Any] = {"key": draw(_keys), "operator": draw(_operators)}
    values = draw(st.lists(st.one_of(_label_values, st.sampled_from(["1", "-3", "99999999999999999999", "1.5"])),
                           max_size=3))
    if values or draw(st.booleans()):
        req["values"] = values
    return req


@st.composite
def _node_term(draw: st.DrawFn) -> dict[str, Any]:
    term: dict[str, Any] = {}
    if draw(st.booleans()):
        term["matchExpressions"] = draw(st.lists(_requirement(), max_size=2))
    if draw(st.booleans()):
        field = draw(st.sampled_from(["metadata.name", "metadata.uid", "spec.unschedulable"]))
        term["matchFields"] = [{"key": field, "operator": draw(_operators),
                                "values": draw(st.lists(dns_names(pool=("n0", "v0")), max_size=2))}]
    return term


@st.composite
def _selector(draw: st.DrawFn) -> dict[str, Any]:
    sel: dict[str, Any] = {}
    if draw(st.booleans()):
        sel["matchLabels"] = draw(st.dictionaries(st.sampled_from(["app", "role", "x"]), _label_values, max_size=2))
    if draw(st.booleans()):
        sel["matchExpressions"] = draw(st.lists(_requirement(), max_size=2))
    return sel


@st.composite
def _affinity(draw: st.DrawFn) -> dict[str, Any]:
    affinity: dict[str, Any] = {}
    if draw(st.booleans()):
        node: dict[str, Any] = {}
        if draw(st.booleans()):
            node["requiredDuringSchedulingIgnoredDuringExecution"] = {
                "nodeSelectorTerms": draw(st.lists(_node_term(), max_size=2))}
        if draw(st.booleans()):
            node["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": draw(st.integers(-5, 200)), "preference": draw(_node_term())}
                for _ in range(draw(st.integers(0, 2)))]
        affinity["nodeAffinity"] = node
    for kind in ("podAffinity", "podAntiAffinity"):
        if draw(st.booleans()):
            terms = []
            for _ in range(draw(st.integers(0, 2))):
                term: dict[str, Any] = {"topologyKey": draw(_keys)}
                if draw(st.booleans()):
                    term["labelSelector"] = draw(_selector())
                if draw(st.booleans()):
                    term["namespaces"] = draw(st.lists(dns_names(pool=(BAD_NAMESPACE, "other")), max_size=2))
                if draw(st.booleans()):
                    term["namespaceSelector"] = draw(_selector())
                if draw(st.booleans()):
                    term["matchLabelKeys"] = draw(st.lists(st.sampled_from(["app", "role"]), max_size=2))
                terms.append(term)
            affinity[kind] = {"requiredDuringSchedulingIgnoredDuringExecution": terms}
    return affinity


@st.composite
def _toleration(draw: st.DrawFn) -> dict[str, Any]:
    # never the reserved taint: an empty key with Exists would tolerate it, so not that either
    op = draw(st.sampled_from(["Equal", "Exists", "", "Bogus"]))
    key = draw(st.sampled_from(["gpu", "dedicated", "x" * 70, "ü"] + ([] if op == "Exists" else [""])))
    t: dict[str, Any] = {"key": key, "operator": op}
    if draw(st.booleans()):
        t["value"] = draw(_label_values)
    if draw(st.booleans()):
        t["effect"] = draw(st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute", "", "Sometimes"]))
    if draw(st.booleans()):
        t["tolerationSeconds"] = draw(st.integers(-(2**63), 2**63 - 1))
    return t


@st.composite
def _spread(draw: st.DrawFn) -> dict[str, Any]:
    c: dict[str, Any] = {
        "maxSkew": draw(st.integers(-3, 2**31)),
        "topologyKey": draw(_keys),
        "whenUnsatisfiable": draw(st.sampled_from(["DoNotSchedule", "ScheduleAnyway", "Maybe", ""])),
    }
    if draw(st.booleans()):
        c["labelSelector"] = draw(_selector())
    if draw(st.booleans()):
        c["minDomains"] = draw(st.integers(-3, 2**31))
    if draw(st.booleans()):
        c["nodeAffinityPolicy"] = draw(st.sampled_from(["Honor", "Ignore", "Whatever"]))
    if draw(st.booleans()):
        c["nodeTaintsPolicy"] = draw(st.sampled_from(["Honor", "Ignore", "Whatever"]))
    if draw(st.booleans()):
        c["matchLabelKeys"] = draw(st.lists(st.sampled_from(["app", "pod-template-hash", ""]), max_size=2))
    return c


_annotation_values: dict[str, st.SearchStrategy[str]] = {
    KAI_FRACTION: st.sampled_from(["0.5", "0", "1", "1.5", "-0.5", "0.0001", "abc", "NaN", "sNaN", "Infinity",
                                   "1e-400", "0.25", "", " 0.5 "]),
    KAI_MEMORY: st.one_of(quantities, st.sampled_from(["1024", "0"])),
    KAI_DEVICES: st.sampled_from(["1", "2", "0", "x", ""]),
    KAI_CONTAINER: st.sampled_from(["main", "c1", "nope", ""]),
    POLICY_ANNOTATION: st.sampled_from(["binpack", "spread", "fragmentation", "random", "bestfit", "BinPack", ""]),
    TOPOLOGY_ANNOTATION: st.sampled_from(["rack", "block", "RACK", " rack ", "zone", ""]),
    TOPOLOGY_PREFERRED_ANNOTATION: st.sampled_from(["rack", "block", "planet", ""]),
    RUNTIME_ANNOTATION: st.sampled_from(["30m", "1h30m", "90", "0", "-5", "1e400", "nan", "inf", "5x", "",
                                         "9999999999h", "1.5h", "µs"]),
    CARDS_ANNOTATION: st.sampled_from(["main=0", "main=0,1", "main=99", "main=", "=0", "main=0;main=1", "garbage",
                                       "main=-1", "main=0,0"]),
    ELASTIC_CONTAINER_PREFIX + "main": st.sampled_from(["0", "0,1", "99", "", "x", "-1", "0,0"]),
    ANNOTATION_TASK: st.sampled_from(["worker", "master", "", "t" * 70]),
}


@st.composite
def _annotations(draw: st.DrawFn) -> dict[str, str]:
    keys = draw(st.lists(st.sampled_from(sorted(_annotation_values)), max_size=3, unique=True))
    out = {k: draw(_annotation_values[k]) for k in keys}
    if draw(st.booleans()):
        out[ANNOTATION_GROUP] = draw(dns_names(pool=GROUP_NAMES))
    return out


@st.composite
def _labels(draw: st.DrawFn) -> dict[str, str]:
    out: dict[str, str] = {}
    if draw(st.booleans()):
        out[QUEUE_LABEL] = draw(st.one_of(st.sampled_from(QUEUE_NAMES), _label_values))
    gang = draw(st.sampled_from(["", LABEL_XK8S, LABEL_VOLCANO]))
    if gang:
        out[gang] = draw(st.one_of(st.sampled_from(GROUP_NAMES), _label_values))
    if draw(st.booleans()):
        out["app"] = draw(_label_values)
    return out


_volumes = st.lists(st.one_of(
    st.fixed_dictionaries({"name": st.just("data"), "persistentVolumeClaim": st.fixed_dictionaries(
        {"claimName": st.sampled_from(["missing-claim", "", "c" * 253])})}),
    st.fixed_dictionaries({"name": st.just("scratch"), "ephemeral": st.just({"volumeClaimTemplate": {"spec": {}}})}),
    st.just({"name": "empty", "emptyDir": {}}),
), max_size=2)


@st.composite
def pods(draw: st.DrawFn, *, namespace: str = BAD_NAMESPACE, uid: str | None = None) -> dict[str, Any]:
    """A pod of batchsched, as the apiserver could hold it (every field of its type), with
    odd values anywhere batchsched reads. Its name and uid are drawn unless ``uid`` is given."""
    name = draw(dns_names(pool=("p0", "p1", "p2", "p3")))
    meta: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": uid or f"uid-{draw(st.integers(0, 10**9))}",
        "creationTimestamp": draw(st.sampled_from(
            ["2027-01-15T07:00:00Z", "2027-01-15T07:59:59Z", "1970-01-01T00:00:00Z", "not a time", ""])),
        "resourceVersion": str(draw(st.integers(1, 10**6))),
    }
    labels = draw(_labels())
    if labels:
        meta["labels"] = labels
    annotations = draw(_annotations())
    if annotations:
        meta["annotations"] = annotations
    n = draw(st.integers(0, 3))
    spec: dict[str, Any] = {
        "schedulerName": draw(st.sampled_from(["batchsched", "batchsched", "batchsched", "default-scheduler"])),
        "containers": [draw(_container("main" if i == 0 else f"c{i}")) for i in range(n)],
    }
    if draw(st.booleans()):
        spec["initContainers"] = [{**draw(_container(f"init{i}")), **(
            {"restartPolicy": "Always"} if draw(st.booleans()) else {})} for i in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        spec["overhead"] = _resource_map(draw)
    if draw(st.integers(0, 3)) == 0:
        # pod-level resources: the apiserver takes cpu and memory only
        spec["resources"] = {"requests": _resource_map(draw, names=("cpu", "memory", "nvidia.com/gpu"))}
    if draw(st.integers(0, 3)) == 0:
        # set by the priority admission from priorityClassName; given by hand, refused
        spec["priority"] = draw(st.integers(-(2**31), 2**31 - 1))
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(st.dictionaries(_keys, _label_values, max_size=2))
    if draw(st.booleans()):
        spec["affinity"] = draw(_affinity())
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.lists(_toleration(), max_size=3))
    if draw(st.booleans()):
        spec["topologySpreadConstraints"] = draw(st.lists(_spread(), max_size=2))
    if draw(st.integers(0, 5)) == 0:
        spec["schedulingGates"] = [{"name": "example.com/gate"}]
    if draw(st.booleans()):
        spec["volumes"] = draw(_volumes)
    if draw(st.integers(0, 5)) == 0:
        spec["resourceClaims"] = [{"name": draw(st.sampled_from(["gpu", ""])), "resourceClaimName": "gpu-claim"}]
    if draw(st.booleans()):
        spec["activeDeadlineSeconds"] = draw(st.integers(-5, 2**63 - 1))
    if draw(st.integers(0, 6)) == 0:
        spec["nodeName"] = draw(st.sampled_from(["n0", "ghost-node"]))
    status: dict[str, Any] = {"phase": draw(st.sampled_from(["Pending", "Pending", "Running", "Unknown", ""]))}
    if draw(st.integers(0, 6)) == 0:
        status["nominatedNodeName"] = draw(st.sampled_from(["n0", "ghost-node", ""]))
    if draw(st.integers(0, 6)) == 0:
        meta["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


# -- PodGroups -------------------------------------------------------------------------------


@st.composite
def podgroups(draw: st.DrawFn, *, api: str | None = None, namespace: str = BAD_NAMESPACE) -> tuple[str, dict[str, Any]]:
    """``(api, PodGroup)`` of either API (or ``api``), its spec odd anywhere batchsched reads."""
    api = api or draw(st.sampled_from([XK8S, VOLCANO]))
    name = draw(dns_names(pool=GROUP_NAMES))
    spec: dict[str, Any] = {}
    if draw(st.integers(0, 5)):
        spec["minMember"] = draw(st.one_of(st.integers(-3, 12), st.integers(2**31 - 1, 2**33), json_values))
    if draw(st.booleans()):
        spec["minResources"] = draw(st.one_of(
            st.dictionaries(st.sampled_from(RESOURCES), _any_quantity(), max_size=3), json_values))
    if draw(st.booleans()):
        spec["scheduleTimeoutSeconds"] = draw(st.one_of(st.integers(-5, 2**40), json_values))
    if api == VOLCANO or draw(st.integers(0, 4)) == 0:
        if draw(st.booleans()):
            spec["queue"] = draw(st.one_of(st.sampled_from(QUEUE_NAMES), dns_names(), json_values))
        if draw(st.booleans()):
            spec["minTaskMember"] = draw(st.one_of(
                st.dictionaries(st.sampled_from(["worker", "master", ""]),
                                st.one_of(st.integers(-3, 2**31), json_values), max_size=2), json_values))
        if draw(st.booleans()):
            spec["priorityClassName"] = draw(st.one_of(st.sampled_from(["high", "missing", ""]), json_values))
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-pg-{api}-{name}",
                            "creationTimestamp": "2027-01-15T07:00:00Z", "resourceVersion": "1"}
    if draw(st.booleans()):
        meta["annotations"] = {draw(st.sampled_from([TOPOLOGY_ANNOTATION, TOPOLOGY_PREFERRED_ANNOTATION])):
                               draw(_annotation_values[TOPOLOGY_ANNOTATION])}
    if draw(st.booleans()):
        meta["labels"] = {QUEUE_LABEL: draw(st.one_of(st.sampled_from(QUEUE_NAMES), _label_values))}
    obj: dict[str, Any] = {"apiVersion": API_VERSIONS[api], "kind": "PodGroup", "metadata": meta,
                           "spec": draw(st.one_of(st.just(spec), st.just(spec), st.just(spec), json_values))}
    if draw(st.integers(0, 3)) == 0:
        obj["status"] = draw(st.one_of(json_values, st.fixed_dictionaries({
            "phase": json_values, "running": json_values, "conditions": st.lists(json_values, max_size=2),
            "scheduleStartTime": json_values})))
    return api, obj


# -- Queues ---------------------------------------------------------------------------------


@st.composite
def _quota_entry(draw: st.DrawFn) -> Any:
    entry: dict[str, Any] = {"name": draw(st.one_of(st.sampled_from(RESOURCES[:4]), st.just(""), json_values))}
    for key in ("nominal", "borrowingLimit", "lendingLimit"):
        if draw(st.booleans()):
            entry[key] = draw(_any_quantity())
    return draw(st.one_of(st.just(entry), st.just(entry), st.just(entry), json_values))


@st.composite
def queues(draw: st.DrawFn) -> dict[str, Any]:
    """A Queue named from :data:`QUEUE_NAMES` (mostly), its parent from the same pool: cycles,
    self-parents, unknown parents and parents that hold work all come up."""
    name = draw(dns_names(pool=QUEUE_NAMES))
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["parent"] = draw(st.one_of(st.sampled_from(QUEUE_NAMES), dns_names(), json_values))
    if draw(st.booleans()):
        spec["weight"] = draw(st.one_of(st.sampled_from([0, -1, 0.5, 1, 1e308, "2", "x", "1e400", "nan"]), json_values))
    if draw(st.booleans()):
        spec["resources"] = draw(st.one_of(st.lists(_quota_entry(), max_size=3), json_values))
    if draw(st.booleans()):
        spec["preemption"] = draw(st.one_of(
            st.fixed_dictionaries({"withinQueue": st.sampled_from(["Never", "LowerPriority", "Sometimes", None]),
                                   "reclaimWithinCohort": st.sampled_from(["Any", "Never", 3, None])}),
            json_values))
    meta: dict[str, Any] = {"name": name, "uid": f"uid-q-{name}", "resourceVersion": "1"}
    return {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": meta,
            "spec": draw(st.one_of(st.just(spec), st.just(spec), st.just(spec), json_values))}


# -- configuration documents ------------------------------------------------------------------

_CONFIG_KEYS: dict[str, Any] = {
    "schedulerNames": None, "metricsAddress": None, "debugSnapshot": None, "identity": None,
    "scoring": ("type", "resources", "shape"),
    "binder": ("concurrency", "retries", "assumedTimeoutSeconds"),
    "status": ("concurrency", "scheduledEvents"),
    "leaderElection": ("enabled", "namespace", "leaseName", "leaseDurationSeconds", "renewDeadlineSeconds",
                       "retryPeriodSeconds"),
    "cycle": ("retryUnschedulableSeconds", "minIntervalSeconds"),
    "gang": ("defaultScheduleTimeoutSeconds", "initialBackoffSeconds", "maxBackoffSeconds", "reportDelaySeconds",
             "evictionConcurrency"),
    "queues": ("defaultQueue", "maxWaitSeconds", "history", "statusIntervalSeconds"),
    "preemption": ("enabled", "nominationTimeoutSeconds", "maxSearchesPerCycle", "maxSearchSecondsPerCycle"),
    "reservation": ("enabled", "perQueue", "maxHoldSeconds"),
    "topology": ("levels",),
    "gpuSharing": ("policy", "scope", "seed"),
}

_config_values = st.one_of(
    json_values,
    st.sampled_from([0, -1, 1, 2, 0.5, 1e308, 10**400, float("inf"), float("-inf"), float("nan"), "1", "", "x",
                     [], {}, [{"name": "nvidia.com/gpu", "weight": 1}], [{"utilization": 0, "score": 0}],
                     [{"name": "x", "weight": float("inf")}], [{"utilization": float("nan"), "score": 1}],
                     ["rack", "rack"], ["a" * 64], "binpack", "all", "127.0.0.1:99999", "::1:80"]),
)


@st.composite
def config_documents(draw: st.DrawFn) -> Any:
    """A configuration document as YAML could give it: known keys with values of any
    type, unknown keys, and documents that are not a mapping at all. NaN and infinity are
    in (YAML writes them ``.nan`` and ``.inf``), and integers past any float."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    doc: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(_CONFIG_KEYS)), max_size=4, unique=True)):
        inner = _CONFIG_KEYS[key]
        if inner is None or draw(st.integers(0, 5)) == 0:
            doc[key] = draw(_config_values)
            continue
        section: dict[str, Any] = {}
        for sub in draw(st.lists(st.sampled_from(inner), max_size=3, unique=True)):
            section[sub] = draw(_config_values)
        doc[key] = section
    if draw(st.integers(0, 5)) == 0:
        doc[draw(st.text(max_size=6))] = draw(json_values)
    return doc


# -- wrong types -------------------------------------------------------------------------------


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_paths(v, (*prefix, i)))
    return out


@st.composite
def mangled(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """An object of ``base`` with one value (not its name, namespace or uid) replaced by one
    of another type: a list where a map goes, a number for a string, null, a map for a list."""
    obj = copy.deepcopy(draw(base))
    keep = {("metadata",), ("metadata", "name"), ("metadata", "namespace"), ("metadata", "uid"), ()}
    paths = [p for p in _paths(obj) if p not in keep]
    if not paths:
        return obj
    path = draw(st.sampled_from(paths))
    target: Any = obj
    for step in path[:-1]:
        target = target[step]
    old = target[path[-1]]
    if isinstance(old, dict):
        new = draw(st.sampled_from([[], [old], "map", 1, None]))
    elif isinstance(old, list):
        new = draw(st.sampled_from([{}, {"0": old[0] if old else 1}, "list", 3, None]))
    elif isinstance(old, str):
        new = draw(st.sampled_from([1, 1.5, -1, [old], {"v": old}, None, True]))
    else:
        new = draw(st.sampled_from([str(old), [old], {}, None]))
    target[path[-1]] = new
    return obj


# -- what an apiserver stores ------------------------------------------------------------------
#
# The strategies above draw much that the apiserver refuses (its validation runs first). The
# ones below draw only what it stores, bad for batchsched in what it means, not its shape:
# quantities past what batchsched counts, queues and gangs that do not exist or cannot hold
# work, annotations it cannot honour, constraints no node meets.

_dns_label = st.from_regex(r"\A[a-z]([-a-z0-9]{0,12}[a-z0-9])?\Z")
_stored_quantity = st.one_of(
    st.sampled_from(["0", "1", "2", "100m", "1500m", "1Gi", "1e3", "1e30", "1e18", "8Ei", "1125899906842624",
                     "999999999999999999999", "0.5", "1P"]),
    st.from_regex(r"\A[0-9]{1,20}(\.[0-9]{1,3})?(m|k|M|G|Ki|Mi|Gi|Ti|Pi|Ei)?\Z"),
)
_stored_whole = st.one_of(st.sampled_from(["0", "1", "2", "8", "9", "33", "1e30", "1125899906842624", "8E"]),
                          st.from_regex(r"\A[1-9][0-9]{0,18}\Z"))
_extended = ("nvidia.com/gpu", ELASTIC_CORE, ELASTIC_MEMORY, "example.com/widget")


@st.composite
def _stored_container(draw: st.DrawFn, name: str) -> dict[str, Any]:
    requests = {k: draw(_stored_quantity) for k in draw(st.lists(st.sampled_from(["cpu", "memory"]), unique=True))}
    extended = {k: draw(_stored_whole) for k in draw(st.lists(st.sampled_from(_extended), max_size=2, unique=True))}
    resources: dict[str, Any] = {}
    if requests or extended:
        resources["requests"] = {**requests, **extended}
    if extended:
        resources["limits"] = dict(extended)  # an extended resource's limit is its request
    return {"name": name, "image": "trainer:latest", "resources": resources}


_stored_requirement = st.sampled_from([
    {"key": "zone", "operator": "In", "values": ["a"]}, {"key": "zone", "operator": "NotIn", "values": ["a"]},
    {"key": "zone", "operator": "In", "values": ["nowhere"]}, {"key": "gpu", "operator": "Exists"},
    {"key": "gpu", "operator": "DoesNotExist"}, {"key": "rank", "operator": "Gt", "values": ["3"]},
    {"key": "rank", "operator": "Lt", "values": ["99999999999999999999"]},
    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["ghost-node"]},
])


@st.composite
def stored_pods(draw: st.DrawFn, *, namespace: str = BAD_NAMESPACE) -> dict[str, Any]:
    """A pod of batchsched the apiserver stores, asking for what batchsched cannot give or
    cannot read: absurd quantities, GPU shares and annotations out of range, unknown queues
    and gangs, node constraints no node meets, claims that do not exist."""
    meta: dict[str, Any] = {"name": draw(_dns_label), "namespace": namespace}
    labels = draw(_labels())
    if labels:
        meta["labels"] = labels
    annotations = draw(_annotations())
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {
        "schedulerName": "batchsched",
        "containers": [draw(_stored_container("main" if i == 0 else f"c{i}")) for i in range(draw(st.integers(1, 3)))],
    }
    if draw(st.integers(0, 3)) == 0:
        spec["initContainers"] = [{**draw(_stored_container("init0")),
                                   **({"restartPolicy": "Always"} if draw(st.booleans()) else {})}]
    if draw(st.integers(0, 3)) == 0:
        spec["nodeSelector"] = {"zone": draw(st.sampled_from(["a", "nowhere"]))}
    if draw(st.integers(0, 3)) == 0:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": draw(st.lists(_stored_requirement, min_size=1, max_size=2))}]}}}
    if draw(st.integers(0, 4)) == 0:
        spec["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if draw(st.integers(0, 4)) == 0:
        spec["topologySpreadConstraints"] = [{
            "maxSkew": draw(st.integers(1, 2**31 - 1)), "topologyKey": draw(st.sampled_from(["zone", "nowhere"])),
            "whenUnsatisfiable": draw(st.sampled_from(["DoNotSchedule", "ScheduleAnyway"])),
            "labelSelector": {"matchLabels": {"app": "x"}}}]
    if draw(st.integers(0, 4)) == 0:
        kind = draw(st.sampled_from(["podAffinity", "podAntiAffinity"]))
        spec["affinity"] = {**spec.get("affinity", {}), kind: {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "nobody"}},
            **({"namespaceSelector": {}} if draw(st.booleans()) else {})}]}}
    if draw(st.integers(0, 5)) == 0:
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "missing-claim"}}]
    if draw(st.integers(0, 5)) == 0:
        spec["activeDeadlineSeconds"] = draw(st.integers(1, 2**62))
    if draw(st.integers(0, 7)) == 0:
        spec["schedulingGates"] = [{"name": "example.com/gate"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@st.composite
def stored_podgroups(draw: st.DrawFn, *, namespace: str = BAD_NAMESPACE) -> tuple[str, dict[str, Any]]:
    """``(api, PodGroup)`` the apiserver stores (its schema holds types and int32 ranges), odd
    in what it asks: no quorum, negative quorum, quantities past what batchsched counts."""
    api = draw(st.sampled_from([XK8S, VOLCANO]))
    name = draw(st.one_of(st.sampled_from(GROUP_NAMES), _dns_label))
    spec: dict[str, Any] = {}
    if draw(st.integers(0, 4)):
        spec["minMember"] = draw(st.one_of(st.integers(-3, 12), st.just(2**31 - 1)))
    if draw(st.booleans()):
        spec["minResources"] = {k: draw(st.one_of(_stored_quantity, st.sampled_from(["-1", "-100m"])))
                                for k in draw(st.lists(st.sampled_from(RESOURCES[:4]), max_size=2, unique=True))}
    if draw(st.booleans()):
        spec["scheduleTimeoutSeconds"] = draw(st.integers(-5, 2**31 - 1))
    if api == VOLCANO:
        if draw(st.booleans()):
            spec["queue"] = draw(st.sampled_from([*QUEUE_NAMES, "nowhere"]))
        if draw(st.booleans()):
            spec["minTaskMember"] = {draw(st.sampled_from(["worker", "master"])): draw(st.integers(-3, 9))}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-pg-{api}-{name}"}
    if draw(st.integers(0, 3)) == 0:
        meta["annotations"] = {draw(st.sampled_from([TOPOLOGY_ANNOTATION, TOPOLOGY_PREFERRED_ANNOTATION])):
                               draw(_annotation_values[TOPOLOGY_ANNOTATION])}
    if draw(st.integers(0, 3)) == 0:
        meta["labels"] = {QUEUE_LABEL: draw(st.sampled_from([*QUEUE_NAMES, "nowhere"]))}
    return api, {"apiVersion": API_VERSIONS[api], "kind": "PodGroup", "metadata": meta, "spec": spec}


@st.composite
def stored_queues(draw: st.DrawFn) -> dict[str, Any]:
    """A Queue the apiserver stores: parents that do not exist or form a cycle, cohorts
    named by work, nominals past what batchsched counts, lending above nominal."""
    name = draw(st.sampled_from(QUEUE_NAMES))
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["parent"] = draw(st.sampled_from([q for q in (*QUEUE_NAMES, "nowhere") if q != name]))
    if draw(st.booleans()):
        spec["weight"] = draw(st.sampled_from([0.001, 1, 2.5, 1e300]))
    entries = []
    for res in draw(st.lists(st.sampled_from(RESOURCES[:3]), max_size=2, unique=True)):
        entry: dict[str, Any] = {"name": res, "nominal": draw(_stored_quantity)}
        if draw(st.booleans()):
            entry["lendingLimit"] = draw(_stored_quantity)
        if draw(st.booleans()):
            entry["borrowingLimit"] = draw(_stored_quantity)
        entries.append(entry)
    if entries:
        spec["resources"] = entries
    return {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec}
