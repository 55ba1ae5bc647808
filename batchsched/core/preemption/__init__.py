"""Preemption and reclaim: who may be evicted, the victim search, a cycle's attempts
and the nominations it holds."""

from batchsched.core.preemption.attempt import CyclePreemption, Verdict
from batchsched.core.preemption.candidates import (
    Candidates,
    Claim,
    Claimant,
    entitled,
    eviction_kind,
)
from batchsched.core.preemption.nominations import (
    Held,
    held_nominations,
    restored_nominations,
)
from batchsched.core.preemption.room import Room
from batchsched.core.preemption.victims import (
    NoPreemption,
    Offers,
    Preemption,
    Preemptor,
    select_victims,
)

__all__ = [
    "Candidates",
    "Claim",
    "Claimant",
    "CyclePreemption",
    "Held",
    "NoPreemption",
    "Offers",
    "Preemption",
    "Preemptor",
    "Room",
    "Verdict",
    "entitled",
    "eviction_kind",
    "held_nominations",
    "restored_nominations",
    "select_victims",
]
