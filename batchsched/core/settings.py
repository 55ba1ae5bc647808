"""What the scheduling session applies: the config file's sections, as one value.

:mod:`batchsched.config` reads and validates the file and builds these
(:meth:`batchsched.config.Config.session_settings`); tests and the replay build them
directly. The defaults here (and in the settings values of the queues, reservations, cards,
node health, scoring and topology) are the configuration file's defaults: it reads them from
these classes, so a key left out of the file and a setting left out of a test mean the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchsched.core.devices import MixKind
from batchsched.core.nodehealth import NodeHealthSettings
from batchsched.core.placement.cards import CardPolicy
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.placement.topology import TopologyLevels
from batchsched.core.queues import QueueSettings
from batchsched.core.reservation import ReservationSettings

__all__ = ["FIRST_WALK_BUDGET", "FIRST_WALK_HEADS", "WALK_BUDGET", "SessionSettings"]

#: the walk budget of a cycle, in seconds (:attr:`SessionSettings.walk_budget`)
WALK_BUDGET = 0.3
#: the walk budget of a scheduler's first cycle, in seconds (the configuration's
#: ``cycle.firstWalkBudgetSeconds``, :attr:`SessionSettings.first_walk_budget`)
FIRST_WALK_BUDGET = 0.05
#: the gangs of each queue, and members of each class, a first walk with a budget is handed
#: (:attr:`SessionSettings.first_walk_heads`)
FIRST_WALK_HEADS = 16


@dataclass(slots=True, frozen=True)
class SessionSettings:
    """What the session applies (the config file's sections, see :mod:`batchsched.config`)."""

    scheduler_names: tuple[str, ...] = ("batchsched",)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    levels: TopologyLevels = field(default_factory=TopologyLevels)
    queues: QueueSettings = field(default_factory=QueueSettings)
    #: a unit that did not fit is tried again after this long even if nothing changed
    retry_unschedulable: float = 60.0
    #: a binding the watch has not confirmed after this long is read again
    assumed_timeout: float = 60.0
    #: how long a gang placed below its quorum may wait to become whole, when its PodGroup
    #: does not say (``scheduleTimeoutSeconds``)
    gang_default_timeout: float = 300.0
    #: the back-off of a gang after its timeout, doubled at each further timeout up to the max
    gang_initial_backoff: float = 10.0
    gang_max_backoff: float = 300.0
    #: a running gang that loses a member below its quorum is evicted whole at once (its
    #: PodGroup's batchsched.io/whole-job-restart annotation overrides this)
    gang_whole_job_restart: bool = False
    #: a gang blocked before placement (members or its PodGroup still arriving) is told so
    #: only after this long
    gang_report_delay: float = 1.0
    #: Queue statuses are written at most this often
    queue_status_interval: float = 2.0
    #: write a ``Scheduled`` Event for each bound pod
    scheduled_events: bool = True
    reservation: ReservationSettings = field(default_factory=ReservationSettings)
    #: how GPU shares are placed on cards
    cards: CardPolicy = field(default_factory=CardPolicy)
    #: the workload mix a new cluster starts from (``gpuSharing.mix``): counts of kinds
    #: ``(cpu milli, whole cards, share milli)``, which fade as real pods arrive; a mix kept
    #: from before a restart takes their place (:meth:`ClusterState.restore_mix`)
    mix_prior: tuple[tuple[MixKind, int], ...] = ()
    #: GPU node health labels (IBM Autopilot's): see :mod:`batchsched.core.nodehealth`
    node_health: NodeHealthSettings = field(default_factory=NodeHealthSettings)
    #: seconds after which a cycle that has placed something stops walking, its Bindings
    #: sent while the next cycle, at once, tries the units left (the first cycle over a
    #: large backlog binds early; at most one walk stops so in 10 s). None: every unit
    #: handed over is tried in one cycle, as a simulation or a replay of one step wants
    #: (:mod:`batchsched.simulate` sets None: its result must not depend on the machine)
    walk_budget: float | None = WALK_BUDGET
    #: the same for the session's first cycle, after the lists of a start or of a replica
    #: that became the leader: FIRST_WALK_BUDGET (0.05 s) stops a large first walk at its
    #: first unit (or run of alike pods) placed, as its fair order alone takes longer, so
    #: the first Bindings leave while the next cycle, at once, walks on (a restart over a
    #: large backlog binds a run of pods, not the 0.3 s walk's thousands, before its first
    #: Binding); a small cluster's first walk still ends within it. None: ``walk_budget``,
    #: as a session built alone (a test, a replay) walks; the scheduler's configuration
    #: sets FIRST_WALK_BUDGET. Ignored when ``walk_budget`` is None
    first_walk_budget: float | None = None
    #: how many gangs of each queue (in its order), and members of each class of alike
    #: single pods, that first walk is handed when ``first_walk_budget`` is set: building
    #: every waiting gang would cost more than the walk, which stops at its first placement
    #: (the next step, at once, is handed everything; see :mod:`batchsched.core.queues.heads`)
    first_walk_heads: int = FIRST_WALK_HEADS
