"""What batchsched tells people: the text of conditions and Events about units.

Every sentence a user reads about why a unit waits, what preempted it, or what became of
its gang is built here, from plain values, so that the wording is in one place and the
policies that decide it (the cycle, preemption, the session) stay free of prose. Messages
about one node's fit (``0/40 nodes fit: ...``) are built next to the node filters in
:mod:`batchsched.core.placement.predicates`, and those about a PodGroup's own fields
next to its parser.

Messages are stable: tests assert their exact text, and users grep for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from batchsched.core.quantity import format_units


def _nodes(names: Iterable[str]) -> str:
    return ", ".join(sorted(set(names)))


# -- a unit that did not get placed ---------------------------------------------------------


def invalid_pod(pod_key: str, why: str) -> str:
    return f"pod {pod_key} cannot be scheduled: {why}"


def elastic_member(why: str) -> str:
    return f"elastic member beyond the gang's quorum: {why}"


def queue_full(queue: str) -> str:
    return f"queue {queue} has no room for it"


QUEUE_FULL_ANY = "its queue has no room for it"


def members_missing(present: int, required: int) -> str:
    return f"waiting for pods: {present} of {required} required members exist"


def gang_short(quorum: int, needs: Mapping[str, int], placeable: int, member: str, detail: str) -> str:
    """A gang's quorum does not fit: what it needs in all, how many fit, and why the first
    member that did not fit failed."""
    need = ", ".join(f"{format_units(k, v)} {k}" for k, v in sorted(needs.items()))
    return (
        f"gang needs {quorum} pods ({need}) placed together; "
        f"only {placeable} fit now. Member {member}: {detail}"
    )


def no_node_has(total_nodes: int, missing: Iterable[str]) -> str:
    return f"0/{total_nodes} nodes fit: no node has any {', '.join(missing)}."


def stays_in_domain(domain: str, detail: str) -> str:
    return f"its gang is placed in {domain} and must stay there: {detail}"


def rest_in_domain(domain: str, why: str) -> str:
    return f"its placed members are in {domain}, where the rest must go: {why}"


def with_preemption(reason: str, why: str, *, never: bool = False) -> str:
    """A unit's message, with why preemption did not help when a search was made; with
    ``never`` (its ``preemptionPolicy`` is ``Never``), ``why`` says whom it would evict
    (:func:`never_preempts`)."""
    if not why:
        return reason
    if never:
        return f"{reason.rstrip('.')}; {why}"
    return f"{reason.rstrip('.')}; preemption does not help: {why}"


def never_preempts(pods: int, whom: Iterable[str], reclaim: bool) -> str:
    """A unit whose ``preemptionPolicy`` is ``Never``, for which the victim search found a
    set: it waits instead (``reclaim``: some of them run on its queue's lent quota)."""
    what = "reclaim its queue's nominal quota from" if reclaim else "preempt"
    return (
        f"it would {what} {pods} pod(s) of {', '.join(whom)}, but its preemptionPolicy is Never: "
        "it waits for capacity to free"
    )


def like_gang(other: str, message: str) -> str:
    """A gang of the same shape as ``other`` (same quorum, members, priority and queue)
    waits for the same reason, found once for both."""
    return f"same shape as gang {other}, which does not fit: {message}"


def behind(other: str) -> str:
    """A pod or gang of the same shape as ``other`` (``pod ns/name``, ``gang ns/name``),
    which holds a reservation: it goes first."""
    return f"same shape as {other}, which holds a reservation and goes first"


# -- preemption ------------------------------------------------------------------------------


def waiting_for_victims(left: int, nodes: Iterable[str]) -> str:
    return f"waiting for {left} preempted pod(s) to terminate; node(s) {_nodes(nodes)} are held for it"


def preempting(pods: int, whom: Iterable[str], quorum: int, nodes: Iterable[str]) -> str:
    """The preemptor's Event: whom it evicts and where its quorum goes."""
    return (
        f"preempting {pods} pod(s) of {', '.join(whom)} to place its {quorum} pod(s) "
        f"on node(s) {_nodes(nodes)}"
    )


def preempted(
    *,
    preemptor: str,
    priority: int,
    nodes: Iterable[str],
    reclaim_for: str | None,
    borrowed: str,
    victim_priority: int,
    victim_queue: str | None,
    extras: int | None,
) -> str:
    """What a victim's pods and group are told (Event and ``DisruptionTarget`` condition).

    ``reclaim_for``: the preemptor's queue when this is a reclaim (``borrowed``: the
    resource the victim's queue was borrowing); ``extras``: the number of elastic pods
    evicted when only those go."""
    who = f"Preempted by {preemptor} (priority {priority})"
    part = "" if extras is None else f" (only its {extras} elastic extra pod(s))"
    if reclaim_for is not None:
        return (
            f"{who} to give queue {reclaim_for} back its nominal quota: "
            f"queue {victim_queue} was borrowing {borrowed}{part}"
        )
    if victim_priority < priority:
        why = f"its priority {victim_priority} is lower"
    else:
        why = f"it has the same priority {victim_priority} and is newer"
    where = f" in queue {victim_queue}" if victim_queue is not None else ""
    return f"{who} to make room on node(s) {_nodes(nodes)}: {why}{where}{part}"


def preemption_blocked(victim: str, *, budget: bool, error: str) -> str:
    why = "a PodDisruptionBudget allows no disruption of it now" if budget else f"the eviction failed: {error}"
    return f"could not preempt {victim} ({why}); the preemption is given up and retried later"


def nomination_expired(nodes: Iterable[str], timeout: float) -> str:
    return (
        f"gave up the capacity held for it on node(s) {_nodes(nodes)} "
        f"after {timeout:g} s; it is tried again as usual"
    )


def nomination_stopped(nodes: Iterable[str], queue: str, policy: str) -> str:
    """A preemptor's held capacity given up because its queue was stopped meanwhile."""
    return (
        f"gave up the capacity held for it on node(s) {_nodes(nodes)}: queue {queue} is stopped "
        f"(stopPolicy {policy}); it is tried again once its queue admits work"
    )


# -- reservations ------------------------------------------------------------------------------


def about(seconds: float) -> str:
    """A duration as people say it: ``40s``, ``12m``, ``2.5h``."""
    if seconds < 90:
        return f"{max(1, round(seconds) if seconds < 10 else 10 * round(seconds / 10))}s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)}m"
    return f"{seconds / 3600:.1f}".rstrip("0").rstrip(".") + "h"


def reserved(why: str, nodes: Iterable[str], start_in: float | None, ending: int) -> str:
    """A unit that holds a reservation: why it does not fit now, then where it holds and
    when it should start (``start_in`` None when no running work on those nodes declares
    when it ends)."""
    held = f"{why.rstrip('.')}; holds a reservation on node(s) {_nodes(nodes)}"
    if start_in is None:
        return f"{held}; start time unknown (running work on those nodes declares no end)"
    return f"{held}; expected to start in about {about(start_in)} (when {ending} running pod(s) end)"


def behind_reservation(message: str, holder: str, nodes: Iterable[str]) -> str:
    return f"{message.rstrip('.')}; capacity on node(s) {_nodes(nodes)} is reserved for {holder}, which waits longer"


def reservation_dropped(message: str, held: float) -> str:
    return (
        f"{message.rstrip('.')}; it held a reservation for more than {about(held)}, which was dropped for as "
        f"long again"
    )


# -- gangs -------------------------------------------------------------------------------------


def gang_placed(*, quorum: int, min_member: int, extra: int, where: str) -> str:
    """The PodGroup's ``Scheduled`` Event. ``where``: see :func:`placed_where`."""
    what = f"{quorum} members as one gang (quorum {min_member})" if quorum else "elastic members"
    more = f" and {extra} elastic member(s)" if quorum and extra > 0 else ""
    return f"placed {what}{more}{where}"


def placed_where(domain: str, *, fell_back: bool, level_name: str) -> str:
    """`` within rack r-3``: the end of a placed gang's message; ``fell_back``: a preferred
    topology found no single domain (``level_name``: rack, block...)."""
    if not fell_back:
        return f" within {domain}"
    return f" across the cluster (no single {level_name} had room for it)"


def member_evicted(member: str, node: str, why: str) -> str:
    return f"evicted member {member} from node {node}: {why}"


def member_eviction_failed(member: str, error: str) -> str:
    return f"could not evict member {member} (will retry): {error}"


def unreadable_allocatable(node: str, why: Mapping[str, str]) -> str:
    reasons = "; ".join(why[name] for name in sorted(why))
    return (
        f"node {node}: {', '.join(sorted(why))} treated as unusable, its allocatable cannot be "
        f"read: {reasons}"
    )


def unreadable_object(kind: str, why: str) -> str:
    return f"batchsched cannot read this {kind} and ignores it until it changes: {why}"


def min_resources_short(group: str, short: Iterable[tuple[str, int, int, int]]) -> str:
    """Why a gang's ``minResources`` cannot be met: per resource (name, missing, free,
    preemptible for it); empty when nothing is short."""
    short = list(short)
    if not short:
        return ""
    if not any(p for _, _, _, p in short):
        parts = [f"{format_units(r, m)} {r} (free: {format_units(r, f)})" for r, m, f, _ in short]
        return f"gang {group} needs minResources the cluster does not have free: " + ", ".join(parts)
    parts = [
        f"{format_units(r, m)} {r} (free: {format_units(r, f)}, preemptible for it: {format_units(r, p)})"
        for r, m, f, p in short
    ]
    return f"gang {group} needs minResources the cluster cannot free for it: " + ", ".join(parts)


def binding_refused(node: str, error: str) -> str:
    """A pod whose Binding the apiserver refused (``error``: its reason, when it gave one)."""
    why = f" ({error})" if error else ""
    return f"the Binding to node {node} was refused{why}; the pod will be placed again"


def gang_evicting(group: str, count: int) -> str:
    return (f"gang {group} waits for its {count} member(s) being evicted to go before any member is "
            "placed again, so that it restarts whole")


def invalid_group(group: str, why: str) -> str:
    """``group``: as :attr:`PodGroup.described` names it."""
    return f"{group} is invalid, its pods are not scheduled: {why}"


def mixed_schedulers(foreign: int) -> str:
    """A ``scheduling.k8s.io`` PodGroup whose members name different schedulers."""
    return (f"{foreign} of its member(s) name another scheduler (spec.schedulerName); all members of a "
            "pod group must name the same scheduler, or none could keep the gang whole")


def group_placed_again() -> str:
    """A ``scheduling.k8s.io`` group's ``DisruptionTarget`` turned False: it runs again."""
    return "its quorum is placed again after the disruption"


# -- GPU cards ------------------------------------------------------------------------------

CARDS_WHOLE_SHORT = "too few whole cards free"
CARDS_MEMORY_SHORT = "insufficient gpu-memory on any card"


def cards_compute_short(share_milli: int) -> str:
    """A node where no card has room for a share of ``share_milli`` thousandths."""
    return f"no card with {share_milli / 10:g}% free"


# -- suspended jobs and stopped queues ---------------------------------------------------------


def suspended(group: str) -> str:
    return (
        f"PodGroup {group} is suspended (annotation batchsched.io/suspend: \"true\"); "
        "remove the annotation to resume it"
    )


def suspended_eviction(group: str) -> str:
    return f"its PodGroup {group} was suspended"


def queue_stopped(queue: str, policy: str) -> str:
    return f"queue {queue} is stopped (stopPolicy {policy}): it admits no new work until its stopPolicy is None"


def capacity_withheld(amounts: Mapping[str, int]) -> str:
    """A root queue's nominal that healthy nodes cannot back (see ``QueueTree.withhold``)."""
    parts = ", ".join(f"{format_units(r, v)} {r}" for r, v in sorted(amounts.items()))
    return (f"{parts} of its nominal is withheld: the nodes that could back it failed their GPU "
            "health checks; its queues are admitted, and lend, that much less until they recover")


def withheld_note(root: str, amount: int, resource: str) -> str:
    return f"{format_units(resource, amount)} {resource} of {root}'s nominal is withheld for nodes that failed GPU health checks"


def drained_eviction(queue: str) -> str:
    return f"its queue {queue} is drained (stopPolicy HoldAndDrain)"


# -- explanations and views (batchsched explain, jobs, queues, the web view) --------------------

#: a unit's state, in plain words
STATE_WORDS = {
    "running": "running: every required member is bound",
    "placing": "partly placed: the rest of its required members are being placed",
    "queued": "queued: waiting for room",
    "reserved": "holding a reservation: later work may not delay its start",
    "preempting": "waiting for the pods it preempted to terminate",
    "gated": "gated: a scheduling gate holds its pods",
    "suspended": "suspended: held until it is resumed",
    "queue-stopped": "held: its queue is stopped",
    "invalid": "invalid: it cannot be placed until its spec is fixed",
    "incomplete": "waiting for its members to exist",
    "backoff": "backing off after its gang timed out",
}


def queue_position(position: int, of: int, queue: str | None) -> str:
    where = f"queue {queue}" if queue else "unqueued work"
    return f"{position} of {of} waiting in {where} (by priority, then age)"


def estimate_known(when_in: float, basis: str) -> str:
    return f"expected to start in about {about(when_in)}" + (f", {basis}" if basis else "")


def estimate_unknown(why: str) -> str:
    return f"no start estimate: {why}"


ESTIMATE_FITS_NOW = "it fits now: it starts in the next cycle"
ESTIMATE_NEVER_ENDS = "it waits for running pods that declare no end (activeDeadlineSeconds or batchsched.io/expected-runtime) and whose like was never seen to end"
ESTIMATE_BEYOND = "it does not start within the simulated horizon"
ESTIMATE_HELD = "it is held until a person acts (suspended, its queue stopped, or invalid)"


def estimate_budget(reached: float, steps: int) -> str:
    return (f"later than in about {about(reached)} (the forward run stopped there, after {steps} "
            "cycles: explain.estimateMaxSteps and estimateBudgetSeconds allow more)")


def estimate_basis(declared: int, observed: int, unknown: int) -> str:
    """What the ends a start estimate rests on came from."""
    parts = []
    if declared:
        parts.append(f"{declared} declared by activeDeadlineSeconds or batchsched.io/expected-runtime")
    if observed:
        parts.append(f"{observed} from the run times of like pods that ended")
    if unknown:
        parts.append(f"{unknown} with no known end (taken to run on)")
    return "from the ends of the pods it waits for: " + "; ".join(parts) if parts else ""


# -- whole-job restart --------------------------------------------------------------------------


def whole_job_restart(placed: int, quorum: int, bound: int) -> str:
    return (f"a running member was lost: {placed} of {quorum} required members remain; evicting the "
            f"{bound} bound member(s) so the whole job restarts together (batchsched.io/whole-job-restart)")


def whole_job_restart_eviction() -> str:
    return "its job restarts whole after a member was lost"


# -- Kueue ---------------------------------------------------------------------------------------

KUEUE_DECIDES = "managed by Kueue, which decides when it stops"


# -- node health ----------------------------------------------------------------------------------


def health_eviction(node: str, label: str, value: str) -> str:
    return f"node {node}'s GPUs are marked {label}={value}: the job restarts elsewhere"


# -- dynamic resource allocation (batchsched.core.dra) -----------------------------------


def claim_not_made(entry: str, template: str) -> str:
    return (f"waiting for its ResourceClaim {entry!r} to be made from ResourceClaimTemplate "
            f"{template} (kube-controller-manager makes it)")


def claim_missing(key: str) -> str:
    return f"ResourceClaim {key} does not exist yet"


def no_devices_anywhere(total_nodes: int, why: str) -> str:
    """No node has devices its claims could get, even on an empty cluster."""
    return f"its ResourceClaims cannot be allocated on any of {total_nodes} nodes: {why or 'no node has devices'}"


def devices_refused(pod_key: str, node: str, why: str) -> str:
    return f"the ResourceClaims of {pod_key} cannot be allocated on node {node} now: {why}"


def extended_too_many(devices: int, most: int) -> str:
    return (f"its extended resources ask {devices} DRA devices of one pod; a ResourceClaim holds "
            f"at most {most}")


def devices_refused_on(node: str, why: str) -> str:
    """A reason counted over nodes: pods like this one were refused their devices there."""
    return f"node(s) could not allocate its ResourceClaims (on {node}: {why})"


# -- pods of a job that asked for no gang ------------------------------------------------------


#: the reason of the Event on such a pod and on the RayCluster that made it
NO_POD_GROUP = "NoPodGroup"


def ray_pod_by_pod(cluster: str) -> str:
    """The pods of RayCluster ``cluster`` (``namespace/name``) name no PodGroup: what that
    means, and what to change."""
    return (
        f"RayCluster {cluster} has no PodGroup, so its pods are placed one by one, as room appears, "
        "and it may run partly placed; to have it placed whole, create it with the label "
        "ray.io/gang-scheduling-enabled: \"true\" (KubeRay, run with --batch-scheduler=scheduler-plugins, "
        "then makes its PodGroup)"
    )


def with_note(message: str, note: str) -> str:
    """A pod's condition message followed by a note about the pod itself."""
    return f"{message.rstrip()} {note}" if message.rstrip().endswith(".") else f"{message}. {note}"
