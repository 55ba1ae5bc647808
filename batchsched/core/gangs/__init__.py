"""Gangs: PodGroups of scheduler-plugins, Volcano and kube-batch, their members, quorum,
timeouts and status."""

from batchsched.core.gangs.book import GangCheck, GroupBook, GroupNotice, Room, free_capacity
from batchsched.core.gangs.podgroup import (
    ANNOTATION_GROUP,
    ANNOTATION_TASK,
    LABEL_VOLCANO,
    LABEL_XK8S,
    SUSPEND_ANNOTATION,
    VOLCANO,
    WHOLE_JOB_RESTART_ANNOTATION,
    XK8S,
    GroupKey,
    GroupStatus,
    PodGroup,
    group_ref,
    parse_podgroup,
)
from batchsched.core.gangs.status import Tally, condition_type, desired_status

__all__ = [
    "ANNOTATION_GROUP",
    "ANNOTATION_TASK",
    "LABEL_VOLCANO",
    "LABEL_XK8S",
    "SUSPEND_ANNOTATION",
    "VOLCANO",
    "WHOLE_JOB_RESTART_ANNOTATION",
    "XK8S",
    "GangCheck",
    "GroupBook",
    "GroupKey",
    "GroupNotice",
    "GroupStatus",
    "PodGroup",
    "Room",
    "Tally",
    "condition_type",
    "desired_status",
    "free_capacity",
    "group_ref",
    "parse_podgroup",
]
