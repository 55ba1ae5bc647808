"""Which queue a pod or a gang belongs to.

Queue assignment (:func:`assign_queue`): the label ``batchsched.io/queue``, else the Volcano
PodGroup's ``spec.queue``, else the namespace label ``batchsched.io/default-queue``, else the
configured default queue; none at all means *unqueued* work, which no quota limits. A name
that is not a valid leaf is a :class:`QueueProblem`, never a silent default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from batchsched.core.plan import QueueName
from batchsched.core.queues.spec import DEFAULT_QUEUE_LABEL, QUEUE_LABEL, VOLCANO_DEFAULT_QUEUE
from batchsched.core.queues.tree import QueueTree

__all__ = ["QueueProblem", "assign_queue"]


@dataclass(slots=True, frozen=True)
class QueueProblem:
    """Work names a queue it cannot use: an Event and a condition on the pod or group.

    ``reason`` is a condition reason: ``QueueNotFound``, ``QueueInvalid`` or ``QueueNotLeaf``.
    """

    queue: str
    source: str
    reason: str
    message: str


def assign_queue(
    *,
    labels: Mapping[str, str],
    podgroup_queue: str | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    default_queue: str | None = None,
    tree: QueueTree,
) -> QueueName | QueueProblem | None:
    """The queue of a pod or group: its label, its Volcano PodGroup's ``spec.queue``, its
    namespace's default-queue label, the configured default, in that order.

    None means unqueued work (nothing names a queue). A name that the tree does not hold
    as a valid leaf is a :class:`QueueProblem`, whichever source gave it. Volcano defaults
    a PodGroup's ``spec.queue`` to ``default``: that value counts as unset unless a Queue
    named ``default`` exists (or failed to parse).
    """
    if podgroup_queue == VOLCANO_DEFAULT_QUEUE and tree.leaf_problem(podgroup_queue) == (
        "QueueNotFound", f"queue {VOLCANO_DEFAULT_QUEUE} does not exist",
    ):
        podgroup_queue = None
    candidates = (
        (labels.get(QUEUE_LABEL), f"label {QUEUE_LABEL}"),
        (podgroup_queue, "PodGroup spec.queue"),
        ((namespace_labels or {}).get(DEFAULT_QUEUE_LABEL), f"namespace label {DEFAULT_QUEUE_LABEL}"),
        (default_queue, "the configured default queue"),
    )
    for name, source in candidates:
        if not name:
            continue
        problem = tree.leaf_problem(name)
        if problem is None:
            return QueueName(name)
        reason, text = problem
        return QueueProblem(queue=name, source=source, reason=reason, message=f"{text} (named by {source})")
    return None
