"""Queues: the Queue CRD, the quota tree with borrowing and lending, fair order, and the
book that mirrors queues, namespaces and disruption budgets for the cycle."""

from batchsched.core.queues.assign import QueueProblem, assign_queue
from batchsched.core.queues.book import QueueBook, QueueInput, QueueSettings
from batchsched.core.queues.fair import FairOrder, UsageHistory
from batchsched.core.queues.spec import (
    API_VERSION,
    DEFAULT_QUEUE_LABEL,
    KIND,
    QUEUE_LABEL,
    QUEUE_STOPPED,
    Queue,
    QueueError,
    Quota,
    ReclaimPolicy,
    StopPolicy,
    WithinQueuePolicy,
    parse_queue,
)
from batchsched.core.queues.tree import (
    UNLIMITED,
    QueueName,
    QueueReport,
    QueueTree,
    QuotaBookkeepingError,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_QUEUE_LABEL",
    "KIND",
    "QUEUE_LABEL",
    "QUEUE_STOPPED",
    "UNLIMITED",
    "FairOrder",
    "Queue",
    "QueueBook",
    "QueueError",
    "QueueInput",
    "QueueName",
    "QueueProblem",
    "QueueReport",
    "QueueSettings",
    "QueueTree",
    "Quota",
    "QuotaBookkeepingError",
    "ReclaimPolicy",
    "StopPolicy",
    "UsageHistory",
    "WithinQueuePolicy",
    "assign_queue",
    "parse_queue",
]
