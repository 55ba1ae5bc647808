"""What must never happen, judged from the apiserver's state as the harness watched it.

The :class:`Mirror` is what the recorder (:mod:`perf.chaos.recorder`) keeps from its own
watches: every pod uid of the world's namespace with every node it was ever seen bound to
and when, its deletion and finish, whether it was told why it waits; the pool's nodes with
when each was deleted, cordoned or tainted; the PodGroups, Queues and Events. A
:class:`Checker` samples it (every second and on each change, not only at the end) and
keeps what it found in a :class:`Verdict`:

- **partial gangs**: a PodGroup (scheduler-plugins' or Kubernetes' own, :data:`GROUP_APIS`)
  with some, but fewer than its quorum (``minMember``, ``minCount``), of its unfinished
  members bound, for longer than ``partial_grace`` (binding a gang takes a moment; a gang
  that lost members to a fault is partial until batchsched places the replacements or
  evicts it whole after its ``scheduleTimeoutSeconds``, which the grace must cover; time
  the control plane was down, when nothing could be bound or evicted, is not counted). The
  longest time each gang was partial is reported.
- **bound twice**: a pod uid seen bound to two nodes; or two pods of one job member (a
  replacement and the pod it replaced) bound and unfinished at the same moment.
- **bound to a deleted node**: a bind seen to a node that did not exist at that moment, or
  seen more than ``bind_slack`` after the node was deleted, cordoned or tainted (a Binding
  already sent may land just after the change; nothing decided after it may).
- **lost**: a pod that exists, is unbound and not being deleted, and has neither a
  ``PodScheduled=False`` condition nor an Event saying why, for longer than ``lost_after``
  (time the control plane was down, when nobody could tell it anything, not counted).
- **quota exceeded**: a team queue whose bound pods ask more ``batchsched.io/gpu`` than its
  nominal plus borrowing limit, or a cohort whose bound pods ask more than its teams'
  nominal together.
- **over-committed**: a node whose bound, unfinished pods ask more GPUs (whole cards plus
  the cards their shares sit on) or pods than it has.

Each check is a plain function of the mirror, so a test can hand it a mirror it built.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
XK8S_API = "scheduling.x-k8s.io"
K8S_API = "scheduling.k8s.io"
#: the PodGroup APIs a world's gangs are written in: API group -> its version's path
#: (scheduler-plugins' pods carry :data:`GROUP_LABEL`; Kubernetes' own name their group in
#: ``spec.schedulingGroup.podGroupName``)
GROUP_APIS = {XK8S_API: "/apis/scheduling.x-k8s.io/v1alpha1", K8S_API: "/apis/scheduling.k8s.io/v1beta1"}
QUEUE_LABEL = "batchsched.io/queue"
#: on every object of a world: its namespace (Queues are cluster-scoped)
WORLD_LABEL = "chaos.batchsched.io/world"
#: the job a pod belongs to, and the member it plays (kept by a replacement pod)
JOB_LABEL = "chaos.batchsched.io/job"
MEMBER_LABEL = "chaos.batchsched.io/member"
GPU = "nvidia.com/gpu"
SHARE_ANNOTATION = "gpu-fraction"
CARDS_ANNOTATION = "batchsched.io/gpu-cards"
QUOTA_RESOURCE = "batchsched.io/gpu"

KINDS = ("partial_gangs", "bound_twice", "bound_to_deleted_node", "lost", "quota_exceeded", "overcommitted")


# -- what the recorder keeps ------------------------------------------------------------


@dataclass(slots=True)
class PodRecord:
    uid: str
    name: str
    job: str
    member: str
    group: str | None
    queue: str | None
    created: float
    obj: dict[str, Any]
    #: (time first seen bound there, node), one entry per distinct node
    binds: list[tuple[float, str]] = field(default_factory=list)
    #: first seen with a deletionTimestamp
    deleting: float | None = None
    #: first seen missing (deleted from the apiserver)
    gone: float | None = None
    #: first seen Succeeded or Failed
    finished: float | None = None
    #: first seen with PodScheduled=False (told why it waits)
    told: float | None = None
    #: first seen unbound again after a change of the cluster, for the lost check
    waiting_since: float | None = None

    @property
    def node(self) -> str | None:
        return self.binds[-1][1] if self.binds else None

    @property
    def live(self) -> bool:
        """Exists, not being deleted, not finished."""
        return self.gone is None and self.deleting is None and self.finished is None

    @property
    def holds(self) -> bool:
        """Holds room on its node: bound, exists and not finished (terminating still holds)."""
        return bool(self.binds) and self.gone is None and self.finished is None


@dataclass(slots=True)
class NodeRecord:
    name: str
    created: float
    obj: dict[str, Any]
    deleted: float | None = None
    #: (from, until) each time it was seen cordoned or with a NoSchedule / NoExecute taint
    closed_spans: list[tuple[float, float | None]] = field(default_factory=list)


@dataclass(slots=True)
class Mirror:
    pods: dict[str, PodRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    #: node name -> every (created, deleted) span, for nodes deleted and created again
    node_spans: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: involved pod uid (or name when no uid) -> first time an Event about it was seen
    told_by_event: dict[str, float] = field(default_factory=dict)
    #: job name -> when the harness retired it (its pods deleted on purpose)
    retired: dict[str, float] = field(default_factory=dict)
    #: last time a pod was seen bound or its binding gone
    last_change: float = 0.0
    #: (from, until) when the control plane was down (nobody could tell a pod anything)
    outages: list[tuple[float, float | None]] = field(default_factory=list)
    gpus_per_node: int = 8


# -- reading pods and groups ----------------------------------------------------------------


def podgroups_path(api: str, namespace: str) -> str:
    """The collection of ``api``'s PodGroups in ``namespace``."""
    return f"{GROUP_APIS[api]}/namespaces/{namespace}/podgroups"


def group_of(pod: Mapping[str, Any]) -> str | None:
    """The name of the PodGroup a pod joins, in either API."""
    label = ((pod.get("metadata") or {}).get("labels") or {}).get(GROUP_LABEL)
    if label:
        return str(label)
    named = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    return str(named) if named else None


def api_of(group: Mapping[str, Any]) -> str:
    """A PodGroup's API group (from its ``apiVersion``)."""
    return str(group.get("apiVersion") or "").split("/", 1)[0]


def quorum(group: Mapping[str, Any]) -> int:
    """Members a PodGroup needs bound together: ``minMember``, or ``schedulingPolicy.gang.minCount``
    (1 for the basic policy)."""
    spec = group.get("spec") or {}
    if "minMember" in spec:
        return int(spec.get("minMember") or 1)
    gang = (spec.get("schedulingPolicy") or {}).get("gang") or {}
    return int(gang.get("minCount") or 1)



def cards_asked(pod: Mapping[str, Any]) -> float:
    """GPU cards a pod asks: whole ``nvidia.com/gpu`` plus a KAI-style share."""
    whole = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        req = ((c.get("resources") or {}).get("requests")) or {}
        with _suppress():
            whole += int(req.get(GPU, 0))
    return whole + share_of(pod)


def bound_by(pod: Mapping[str, Any]) -> str:
    """The replica that bound a pod, as its Binding recorded it."""
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get("batchsched.io/bound-by") or "")


def share_of(pod: Mapping[str, Any]) -> float:
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(SHARE_ANNOTATION)
    if not text:
        return 0.0
    try:
        return float(Decimal(text))
    except InvalidOperation:
        return 0.0


def share_cards(pod: Mapping[str, Any]) -> set[str]:
    """The cards a share was given, from the assignment batchsched writes before binding."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(CARDS_ANNOTATION) or ""
    return {c.strip() for c in text.split(",") if c.strip()}


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (ValueError, TypeError))  # type: ignore[arg-type]


def node_closed(node: Mapping[str, Any]) -> bool:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return True
    return any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or []
               if not str(t.get("key", "")).startswith("node.kubernetes.io/"))


def queue_limits(queues: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """(team -> nominal + borrowing limit, cohort -> total nominal, team -> cohort) in cards."""
    limit: dict[str, float] = {}
    total: dict[str, float] = defaultdict(float)
    parent: dict[str, str] = {}
    for name, q in queues.items():
        spec = q.get("spec") or {}
        for r in spec.get("resources") or []:
            if r.get("name") != QUOTA_RESOURCE:
                continue
            nominal = float(Decimal(str(r.get("nominal", 0))))
            borrow = r.get("borrowingLimit")
            limit[name] = math.inf if borrow is None else nominal + float(Decimal(str(borrow)))
            if spec.get("parent"):
                parent[name] = str(spec["parent"])
                total[parent[name]] += nominal
    return limit, dict(total), parent


# -- the verdict ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Finding:
    kind: str
    key: str
    first: float
    last: float
    example: str
    #: when a sample first flagged it (``first`` is when the condition began)
    found: float = 0.0

    @property
    def duration(self) -> float:
        return self.last - self.first


@dataclass(slots=True)
class Verdict:
    """What the checks found: per kind, each distinct finding (a gang, a pod, a node...)."""

    findings: dict[str, dict[str, Finding]] = field(default_factory=lambda: {k: {} for k in KINDS})
    samples: int = 0
    #: the longest time each gang was partial (seconds), findings or not
    partial_seconds: dict[str, float] = field(default_factory=dict)

    def count(self, kind: str) -> int:
        return len(self.findings[kind])

    @property
    def counts(self) -> dict[str, int]:
        return {k: self.count(k) for k in KINDS}

    @property
    def clean(self) -> bool:
        return not any(self.counts.values())

    def examples(self, kind: str, n: int = 3) -> list[str]:
        return [f.example for f in list(self.findings[kind].values())[:n]]

    def since(self, t: float) -> Verdict:
        """The findings first flagged at or after ``t`` (one that lasts is counted once, by
        the fault it appeared under)."""
        out = Verdict(samples=self.samples)
        for kind, items in self.findings.items():
            out.findings[kind] = {k: f for k, f in items.items() if f.found >= t}
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "counts": self.counts,
            "examples": {k: self.examples(k, 5) for k in KINDS if self.count(k)},
            "longest_partial_s": round(max(self.partial_seconds.values(), default=0.0), 2),
        }

    def summary(self) -> str:
        bad = [f"{k}={v} ({'; '.join(self.examples(k, 2))})" for k, v in self.counts.items() if v]
        return ", ".join(bad) if bad else "clean"


@dataclass(slots=True)
class Limits:
    #: a gang may be partial this long before it is a finding (binding, a fault's losses)
    partial_grace: float = 30.0
    #: a Binding already in flight may land this long after its node changed
    bind_slack: float = 5.0
    #: an unbound pod must be told why within this
    lost_after: float = 30.0


class Checker:
    """Samples a mirror; keeps a :class:`Verdict` and how long each gang has been partial."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.verdict = Verdict()
        self._partial_since: dict[str, float] = {}

    def _found(self, kind: str, key: str, now: float, example: str, first: float | None = None) -> None:
        items = self.verdict.findings[kind]
        f = items.get(key)
        if f is None:
            items[key] = Finding(kind=kind, key=key, first=first if first is not None else now, last=now,
                                 example=example, found=now)
        else:
            f.last = now
            f.example = example

    def sample(self, m: Mirror, now: float) -> None:
        self.verdict.samples += 1
        self._partial(m, now)
        self._twice(m, now)
        self._deleted_nodes(m, now)
        self._lost(m, now)
        self._quota(m, now)
        self._overcommit(m, now)

    # -- each check -------------------------------------------------------------------------

    def _partial(self, m: Mirror, now: float) -> None:
        bound_by_group: dict[str, int] = defaultdict(int)
        for p in m.pods.values():
            if p.group and p.live and p.binds:
                bound_by_group[p.group] += 1
        seen: set[str] = set()
        for name, group in m.groups.items():
            if name in m.retired:
                continue
            want = quorum(group)
            got = bound_by_group.get(name, 0)
            if 0 < got < want:
                seen.add(name)
                since = self._partial_since.setdefault(name, now)
                lasted = now - since - _overlap(m.outages, since, now)
                self.verdict.partial_seconds[name] = max(self.verdict.partial_seconds.get(name, 0.0), lasted)
                if lasted > self.limits.partial_grace:
                    self._found("partial_gangs", name, now, f"{name}: {got} of {want} bound for {lasted:.0f} s", since)
        for name in list(self._partial_since):
            if name not in seen:
                del self._partial_since[name]

    def _twice(self, m: Mirror, now: float) -> None:
        holding: dict[str, list[PodRecord]] = defaultdict(list)
        for p in m.pods.values():
            if len({n for _, n in p.binds}) > 1:
                self._found("bound_twice", p.uid, now, f"{p.name} ({p.uid[:8]}) bound to {', '.join(n for _, n in p.binds)}")
            if p.binds and p.live:
                holding[p.member].append(p)
        for member, pods in holding.items():
            if len(pods) > 1:
                self._found("bound_twice", f"member:{member}", now,
                            f"member {member} bound as {', '.join(f'{p.name} on {p.node}' for p in pods)}")

    def _deleted_nodes(self, m: Mirror, now: float) -> None:
        slack = self.limits.bind_slack
        for p in m.pods.values():
            for t, node in p.binds:
                spans = m.node_spans.get(node)
                if not spans:
                    self._found("bound_to_deleted_node", p.uid, now, f"{p.name} bound to {node}, which never existed")
                    continue
                if not any(start - slack <= t and (end is None or t <= end + slack) for start, end in spans):
                    self._found("bound_to_deleted_node", p.uid, now, f"{p.name} bound to {node} after it was deleted")
                    continue
                rec = m.nodes.get(node)
                for start, end in rec.closed_spans if rec is not None else ():
                    if start + slack < t and (end is None or t < end):
                        self._found("bound_to_deleted_node", p.uid, now,
                                    f"{p.name} bound to {node} {t - start:.0f} s after it was cordoned or tainted")

    def _lost(self, m: Mirror, now: float) -> None:
        for p in m.pods.values():
            if not p.live or p.binds:
                continue
            if p.job in m.retired:
                continue
            told = p.told is not None or p.uid in m.told_by_event or p.name in m.told_by_event
            since = p.waiting_since if p.waiting_since is not None else p.created
            waited = now - since - _overlap(m.outages, since, now)
            if not told and waited > self.limits.lost_after:
                self._found("lost", p.uid, now, f"{p.name}: unbound and told nothing for {waited:.0f} s", since)

    def _quota(self, m: Mirror, now: float) -> None:
        limit, total, parent = queue_limits(m.queues)
        used = cards_used(m)
        cohort_used: dict[str, float] = defaultdict(float)
        for q, u in used.items():
            if q in limit and u > limit[q] + 1e-9:
                self._found("quota_exceeded", q, now, f"queue {q}: {u:g} cards bound, limit {limit[q]:g}")
            if q in parent:
                cohort_used[parent[q]] += u
        for c, u in cohort_used.items():
            if u > total.get(c, math.inf) + 1e-9:
                self._found("quota_exceeded", c, now, f"cohort {c}: {u:g} cards bound, total {total[c]:g}")

    def _overcommit(self, m: Mirror, now: float) -> None:
        whole: dict[str, int] = defaultdict(int)
        shared: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        pods: dict[str, list[PodRecord]] = defaultdict(list)
        for p in m.pods.values():
            if not p.holds or p.node is None:
                continue
            node = p.node
            pods[node].append(p)
            share = share_of(p.obj)
            whole[node] += int(cards_asked(p.obj) - share)
            if share:
                for card in share_cards(p.obj) or {f"?{p.uid}"}:
                    shared[node][card] += share
        for node, rec in m.nodes.items():
            if rec.deleted is not None:
                continue
            alloc = (rec.obj.get("status") or {}).get("allocatable") or {}
            gpus = int(alloc.get(GPU, m.gpus_per_node))
            max_pods = int(alloc.get("pods", 110))
            over_card = [c for c, s in shared[node].items() if s > 1 + 1e-9]
            cards = whole[node] + len(shared[node])
            if cards > gpus or over_card or len(pods[node]) > max_pods:
                held = ", ".join(f"{p.name}:{cards_asked(p.obj):g}" + (f"@{','.join(sorted(share_cards(p.obj)))}" if share_of(p.obj) else "")
                                 + f"+{p.binds[-1][0] - rec.created:.1f}s" + (f" by {b}" if (b := bound_by(p.obj)) else "")
                                 for p in sorted(pods[node], key=lambda p: p.binds[-1][0]))
                self._found("overcommitted", node, now,
                            f"{node}: {whole[node]} whole + {len(shared[node])} shared cards of {gpus}"
                            + (f", card {over_card[0]} over 100%" if over_card else "") + f" [{held}]")


def _overlap(spans: Iterable[tuple[float, float | None]], start: float, end: float) -> float:
    """Seconds of ``spans`` (an open one runs until ``end``) inside ``[start, end]``."""
    return sum(max(0.0, min(end, e if e is not None else end) - max(start, s)) for s, e in spans)


# -- settled ----------------------------------------------------------------------------------


def free_cards(m: Mirror) -> dict[str, int]:
    """Whole cards free on each open node (a card holding any share is not free)."""
    whole: dict[str, int] = defaultdict(int)
    shared: dict[str, set[str]] = defaultdict(set)
    for p in m.pods.values():
        if p.holds and p.node:
            share = share_of(p.obj)
            whole[p.node] += int(cards_asked(p.obj) - share)
            if share:
                shared[p.node] |= share_cards(p.obj) or {p.uid}
    out = {}
    for name, rec in m.nodes.items():
        if rec.deleted is None and not node_closed(rec.obj):
            alloc = (rec.obj.get("status") or {}).get("allocatable") or {}
            out[name] = int(alloc.get(GPU, m.gpus_per_node)) - whole[name] - len(shared[name])
    return out


def settled(m: Mirror, *, now: float, quiet: float, jobs: Mapping[str, Any] | None = None,
            limits: Limits | None = None) -> list[str]:
    """Why the cluster has not settled yet (empty: it has). Settled: no bind or unbind for
    ``quiet`` seconds; no gang partly bound; every waiting pod told why; and no waiting
    pod or gang that surely fits (whole free cards on open nodes, room in its queue and
    cohort; shares and preemption are not reckoned, so this errs towards "settled")."""
    reasons: list[str] = []
    if now - m.last_change < quiet:
        reasons.append(f"a bind {now - m.last_change:.1f} s ago")
    checker = Checker(limits or Limits(partial_grace=-1.0, lost_after=-1.0))
    checker._partial(m, now)
    checker._lost(m, now)
    for kind in ("partial_gangs", "lost"):
        reasons.extend(checker.verdict.examples(kind, 3))
    free = free_cards(m)
    limit, total, parent = queue_limits(m.queues)
    used = cards_used(m)
    cohort_used: dict[str, float] = defaultdict(float)
    for q, u in used.items():
        if q in parent:
            cohort_used[parent[q]] += u
    waiting: dict[str, list[PodRecord]] = defaultdict(list)
    for p in m.pods.values():
        if p.live and not p.binds and p.job not in m.retired:
            waiting[p.job].append(p)
    for job, pods in waiting.items():
        ask = cards_asked(pods[0].obj)
        if share_of(pods[0].obj) or ask <= 0:
            continue
        group = m.groups.get(pods[0].group or "") if pods[0].group else None
        if pods[0].group and group is None:
            continue  # no PodGroup: waits for it by design
        need = len(pods)
        if group is not None:
            want = quorum(group)
            bound = sum(1 for p in m.pods.values() if p.group == pods[0].group and p.live and p.binds)
            if bound + len(pods) < want:
                continue  # fewer members than its quorum exist: it waits by design
            need = max(0, want - bound)
            if need == 0:
                continue
            need = min(need, len(pods))
        q = pods[0].queue
        if q is not None:
            if q not in limit:
                continue  # an unknown queue: waits by design
            if used[q] + need * ask > limit[q] + 1e-9:
                continue
            c = parent.get(q)
            if c is not None and cohort_used[c] + need * ask > total.get(c, math.inf) + 1e-9:
                continue
        allowed = _hostnames(pods[0].obj)
        room = free if allowed is None else {n: f for n, f in free.items() if n in allowed}
        if _fits(room, int(ask), need):
            reasons.append(f"{job} waits ({need} x {ask:g} GPU) though it fits")
    return reasons


def _hostnames(pod: Mapping[str, Any]) -> set[str] | None:
    """The nodes a pod's required node affinity names by hostname (None: any node)."""
    terms = ((((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    names: set[str] = set()
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") != "kubernetes.io/hostname" or expr.get("operator") != "In":
                return None
            names.update(expr.get("values") or [])
    return names if terms else None


def cards_used(m: Mirror) -> dict[str, float]:
    """GPU cards held by bound, unfinished pods, per queue."""
    used: dict[str, float] = defaultdict(float)
    for p in m.pods.values():
        if p.holds and p.queue:
            used[p.queue] += cards_asked(p.obj)
    return used


def _fits(free: Mapping[str, int], ask: int, count: int) -> bool:
    slots = sum(f // ask for f in free.values() if f >= ask)
    return slots >= count


def merge(verdicts: Iterable[Verdict]) -> Verdict:
    out = Verdict()
    for v in verdicts:
        out.samples += v.samples
        for kind, items in v.findings.items():
            out.findings[kind].update(items)
        for k, s in v.partial_seconds.items():
            out.partial_seconds[k] = max(out.partial_seconds.get(k, 0.0), s)
    return out
