"""Preemption and reclaim: who may be evicted and the victim search."""

from batchsched.core.preemption.candidates import Candidates
from batchsched.core.preemption.victims import (
    NoPreemption,
    Preemption,
    Preemptor,
    select_victims,
)

__all__ = ["Candidates", "NoPreemption", "Preemption", "Preemptor", "select_victims"]
