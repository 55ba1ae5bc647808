"""Preemption and reclaim: who may be evicted and the victim search."""

from batchsched.core.preemption.victims import (
    NoPreemption,
    Preemption,
    Preemptor,
    select_victims,
)

__all__ = ["NoPreemption", "Preemption", "Preemptor", "select_victims"]
