"""Preemption and reclaim: who may be evicted, the victim search, a cycle's attempts
and the nominations it holds."""

from batchsched.core.preemption.attempt import CyclePreemption, Walk
from batchsched.core.preemption.candidates import Candidates
from batchsched.core.preemption.nominations import Held, Terminating, held_nominations
from batchsched.core.preemption.victims import (
    NoPreemption,
    Preemption,
    Preemptor,
    select_victims,
)

__all__ = [
    "Candidates",
    "CyclePreemption",
    "Held",
    "NoPreemption",
    "Preemption",
    "Preemptor",
    "Terminating",
    "Walk",
    "held_nominations",
    "select_victims",
]
