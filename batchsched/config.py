"""The configuration file (``config/batchsched.yaml``), parsed and validated in one place.

Every key is known: an unknown key, a value of the wrong type or out of range is a
:class:`ConfigError` whose one-line message names the key, e.g.
``config: scoring.shape[1].score: must be between 0 and 10, got 11``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from batchsched.core.devices import MILLI, MixKind
from batchsched.core.mirror import MIX_WINDOW
from batchsched.core.nodehealth import NodeHealthSettings
from batchsched.core.placement.cards import CardPolicy
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.placement.topology import TopologyLevels
from batchsched.core.quantity import QuantityError, to_units
from batchsched.core.queues import QueueSettings
from batchsched.core.reservation import ReservationSettings
from batchsched.core.settings import FIRST_WALK_BUDGET, WALK_BUDGET, SessionSettings

#: status writers (one task each) at most
MAX_STATUS_WRITERS = 1024


class ConfigError(ValueError):
    """The configuration is not valid; the message names the offending key."""


# The default of every key the core applies is the core's own (one place for each): a key
# left out of the file means what a setting left out of SessionSettings(...) means.
_SESSION = SessionSettings()
_QUEUES = QueueSettings()
_RESERVATION = ReservationSettings()
_CARDS = CardPolicy()
_HEALTH = NodeHealthSettings()
_SCORING = ScoringConfig()


@dataclass(slots=True, frozen=True)
class ScoringSection:
    type: str = _SCORING.strategy
    #: batchsched.io/gpu is the card compute of the device model: whole elasticgpu.io cards
    #: are packed by it (they do not request nvidia.com/gpu)
    resources: tuple[dict[str, Any], ...] = tuple({"name": n, "weight": w} for n, w in _SCORING.resources)
    shape: tuple[dict[str, Any], ...] = tuple({"utilization": u, "score": p} for u, p in _SCORING.shape)


@dataclass(slots=True, frozen=True)
class BinderSection:
    concurrency: int = 128
    retries: int = 5
    assumed_timeout_seconds: float = _SESSION.assumed_timeout


@dataclass(slots=True, frozen=True)
class StatusSection:
    concurrency: int = 16
    scheduled_events: bool = _SESSION.scheduled_events


@dataclass(slots=True, frozen=True)
class LeaderElectionSection:
    enabled: bool = True
    #: where the kustomize base runs the scheduler and the chart's README installs it: the
    #: Lease sits next to its Deployment, and `batchsched explain` looks here by default
    namespace: str = "batchsched-system"
    lease_name: str = "batchsched"
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0


@dataclass(slots=True, frozen=True)
class CycleSection:
    #: retry an unschedulable pod at least this often even if nothing relevant changed
    retry_unschedulable_seconds: float = _SESSION.retry_unschedulable
    #: the shortest time between two cycles (events arriving closer are batched)
    min_interval_seconds: float = 0.02
    #: a cycle that has placed something stops walking after this long and sends its
    #: Bindings; the next cycle, at once, tries the units left
    walk_budget_seconds: float = WALK_BUDGET
    #: the same for the first cycle (after the lists, or on becoming the leader): short, so
    #: a large first walk stops at its first unit or run of alike pods placed and the first
    #: Bindings leave at once
    first_walk_budget_seconds: float = FIRST_WALK_BUDGET


@dataclass(slots=True, frozen=True)
class GangSection:
    #: how long a gang placed below its quorum may wait to become whole, when its
    #: PodGroup does not say (``scheduleTimeoutSeconds``)
    default_schedule_timeout_seconds: float = _SESSION.gang_default_timeout
    #: the back-off of a gang after its timeout, doubled at each further timeout
    initial_backoff_seconds: float = _SESSION.gang_initial_backoff
    max_backoff_seconds: float = _SESSION.gang_max_backoff
    #: how long a gang may wait (for its members, its PodGroup...) before its pods are told
    report_delay_seconds: float = _SESSION.gang_report_delay
    #: evictions in flight at once (gangs that timed out)
    eviction_concurrency: int = 8
    #: a running gang that loses a member below its quorum (the member failed, its node went
    #: away) is evicted whole at once, so the job restarts together, instead of holding its
    #: GPUs for the schedule timeout; a PodGroup's annotation batchsched.io/whole-job-restart
    #: ("true"/"false") overrides it
    whole_job_restart: bool = _SESSION.gang_whole_job_restart


@dataclass(slots=True, frozen=True)
class HistorySection:
    #: how fast past usage is forgotten; 0 turns the usage history off
    half_life_seconds: float = _QUEUES.history_half_life
    #: how much past usage weighs in a queue's share, next to its current usage
    weight: float = _QUEUES.history_weight


@dataclass(slots=True, frozen=True)
class QueuesSection:
    #: the queue of work that names none (no label, PodGroup queue or namespace default);
    #: empty: such work is unqueued (no quota limits it)
    default_queue: str = _QUEUES.default_queue
    #: a unit waiting longer than this goes first in its queue, whatever its priority; 0: never
    max_wait_seconds: float = _QUEUES.max_wait
    history: HistorySection = field(default_factory=HistorySection)
    #: the shortest time between two writes of the Queue statuses
    status_interval_seconds: float = _SESSION.queue_status_interval


@dataclass(slots=True, frozen=True)
class PreemptionSection:
    #: evict running work for a unit that does not fit (priority within a queue, reclaim of
    #: borrowed quota, lower-priority unqueued work)
    enabled: bool = _QUEUES.preemption
    #: how long capacity freed by a preemption is held for its preemptor
    nomination_timeout_seconds: float = _QUEUES.nomination_timeout
    #: victim searches per cycle at most (the rest are retried in the next cycle)
    max_searches_per_cycle: int = _QUEUES.max_searches
    #: seconds of victim search per cycle at most (the rest are retried in the next cycle:
    #: a search walks the running work, so a large cluster reaches this before the count)
    max_search_seconds_per_cycle: float = _QUEUES.max_search_seconds


@dataclass(slots=True, frozen=True)
class ReservationSection:
    #: the head of a queue that does not fit holds the nodes where it will fit soonest;
    #: later work may use them only if it cannot delay it (see batchsched.core.reservation)
    enabled: bool = _RESERVATION.enabled
    #: units per queue (unqueued work counts as one queue) that may hold a reservation
    per_queue: int = _RESERVATION.per_queue
    #: a unit holding a reservation longer than this loses it for as long again
    max_hold_seconds: float = _RESERVATION.max_hold


@dataclass(slots=True, frozen=True)
class GpuSharingSection:
    #: where GPU shares go: fragmentation (least increase of the cluster's GPU
    #: fragmentation against the mix of requests), binpack, spread or random; a pod may
    #: choose with the annotation batchsched.io/gpu-placement
    policy: str = _CARDS.policy
    #: "sharing": the policy places pods that ask for a share of a card; "all": whole-card
    #: pods too (else they are scored by scoring.strategy, as any pod)
    scope: str = _CARDS.scope
    #: seed of the random policy
    seed: int = _CARDS.seed
    #: fragmentation: milli-GPU of fragmentation change (weighted by the mix) within which
    #: nodes rank alike, the fullest first; 0 ranks by the exact change
    band: int = _CARDS.band
    #: fragmentation: % of the GPU a kind of share could take on a node but the node's CPU
    #: could not host that counts as lost; 0 is the FGD paper's measure
    cpu_short: int = _CARDS.cpu_short
    #: the workload mix a new cluster starts from, before its own pods are seen: kinds of
    #: pods, each ``{cpu: "8", gpus: 1, weight: 10}`` (whole cards), ``{cpu: "4",
    #: gpuShare: "0.5", weight: 30}`` (a share of one card) or ``{cpu: "2", weight: 5}``
    #: (no card); a weight counts as that many pods arrived, and fades as real ones do
    mix: tuple[dict[str, Any], ...] = ()


@dataclass(slots=True, frozen=True)
class TopologySection:
    #: node label keys of the topology levels, narrowest first; gangs name a level by the
    #: key's last segment (``batchsched.io/topology: rack``)
    levels: tuple[str, ...] = TopologyLevels().keys


@dataclass(slots=True, frozen=True)
class NodeHealthSection:
    #: the node label saying how a node's GPUs tested (IBM Autopilot's); empty: off
    label: str = _HEALTH.label
    #: values whose node takes no new GPU work (a NoSchedule taint only GPU pods feel)
    no_gpu_work: tuple[str, ...] = _HEALTH.no_gpu_work
    #: values whose node is less preferred for GPU work (a PreferNoSchedule taint)
    lower_score: tuple[str, ...] = _HEALTH.lower_score
    #: values whose running GPU work is evicted, whole gangs, to restart elsewhere
    evict: tuple[str, ...] = _HEALTH.evict


@dataclass(slots=True, frozen=True)
class KueueSection:
    #: pods Kueue manages (label kueue.x-k8s.io/managed: "true", or kueue.x-k8s.io/podset)
    #: are placed but charged to no Queue of ours; false: batchsched's preemption neither
    #: evicts them nor lets them evict others (Kueue decides); true: they take part in it as
    #: unqueued work
    preemptible: bool = _QUEUES.kueue_preemptible


@dataclass(slots=True, frozen=True)
class ViewsTlsSection:
    #: the views' serving certificate (PEM, with any intermediates after it) and its key,
    #: e.g. tls.crt and tls.key of a cert-manager Certificate's Secret mounted in the pod;
    #: both empty: the scheduler makes a CA and a serving certificate at start
    cert_file: str = ""
    key_file: str = ""
    #: the CA the CLI is to trust, published on the Lease (a cert-manager Secret's ca.crt);
    #: empty with cert_file: the certificates of cert_file are published
    ca_file: str = ""
    #: the name clients check the certificate against, when it names none of the pods'
    #: addresses (a cert-manager Certificate's dnsNames entry); published on the Lease as
    #: kubeconfig's tls-server-name is; empty: the host of the address connected to
    server_name: str = ""


@dataclass(slots=True, frozen=True)
class ExplainSection:
    #: the views (/debug/jobs, /debug/explain, the web view at /ui/) need a token that the
    #: cluster accepts and RBAC lets get the path (ClusterRole batchsched-viewer)
    enabled: bool = True
    #: start estimates are made again when older than this (a forward run of the session)
    estimate_ttl_seconds: float = 30.0
    #: estimates are made this often even when nobody asks, so their error is measured
    #: (batchsched_start_estimate_*); 0: only when asked
    estimate_interval_seconds: float = 300.0
    #: cycles a forward run may take at most
    estimate_max_steps: int = 400
    #: seconds a forward run may take at most (it runs in a thread of the scheduler's process)
    estimate_budget_seconds: float = 10.0
    #: host:port where the views are served, over HTTPS only; empty: the metrics
    #: address's host, any free port (the Lease says which)
    address: str = ""
    #: the address written on the Lease for `batchsched explain` to find the leader
    #: (https://host:port); empty: the views address, with the pod's IP (env POD_IP) for
    #: an unspecified host
    advertise_address: str = ""
    #: the views' certificate (none given: made at start)
    tls: ViewsTlsSection = field(default_factory=ViewsTlsSection)


@dataclass(slots=True, frozen=True)
class Config:
    scheduler_names: tuple[str, ...] = _SESSION.scheduler_names
    scoring: ScoringSection = field(default_factory=ScoringSection)
    binder: BinderSection = field(default_factory=BinderSection)
    status: StatusSection = field(default_factory=StatusSection)
    leader_election: LeaderElectionSection = field(default_factory=LeaderElectionSection)
    cycle: CycleSection = field(default_factory=CycleSection)
    gang: GangSection = field(default_factory=GangSection)
    queues: QueuesSection = field(default_factory=QueuesSection)
    preemption: PreemptionSection = field(default_factory=PreemptionSection)
    reservation: ReservationSection = field(default_factory=ReservationSection)
    topology: TopologySection = field(default_factory=TopologySection)
    gpu_sharing: GpuSharingSection = field(default_factory=GpuSharingSection)
    explain: ExplainSection = field(default_factory=ExplainSection)
    kueue: KueueSection = field(default_factory=KueueSection)
    node_health: NodeHealthSection = field(default_factory=NodeHealthSection)
    metrics_address: str = "127.0.0.1:10351"
    #: serve /debug/snapshot on the metrics address: every object the scheduler reads, to
    #: anyone who can reach that address (off unless turned on)
    debug_snapshot: bool = False
    identity: str = ""

    def scoring_config(self) -> ScoringConfig:
        return _scoring(self.scoring)

    def topology_levels(self) -> TopologyLevels:
        try:
            return TopologyLevels(self.topology.levels)
        except ValueError as exc:
            raise ConfigError(f"config: topology.levels: {exc}") from None

    def card_policy(self) -> CardPolicy:
        g = self.gpu_sharing
        policy = CardPolicy(policy=g.policy, scope=g.scope, seed=g.seed, band=g.band, cpu_short=g.cpu_short)
        try:
            policy.validate()
        except ValueError as exc:
            raise ConfigError(f"config: {exc}") from None
        return policy

    def mix_prior(self) -> tuple[tuple[MixKind, int], ...]:
        """``gpuSharing.mix`` as counts of kinds (see :func:`_mix_kind`)."""
        return tuple(_mix_entry(entry, f"gpuSharing.mix[{i}]") for i, entry in enumerate(self.gpu_sharing.mix))

    def queue_settings(self) -> QueueSettings:
        q, p = self.queues, self.preemption
        return QueueSettings(
            default_queue=q.default_queue,
            max_wait=q.max_wait_seconds,
            history_half_life=q.history.half_life_seconds,
            history_weight=q.history.weight,
            preemption=p.enabled,
            nomination_timeout=p.nomination_timeout_seconds,
            max_searches=p.max_searches_per_cycle,
            max_search_seconds=p.max_search_seconds_per_cycle,
            kueue_preemptible=self.kueue.preemptible,
        )

    def session_settings(self) -> SessionSettings:
        """What the scheduling session applies, from this file."""
        gang = self.gang
        return SessionSettings(
            scheduler_names=tuple(self.scheduler_names),
            scoring=self.scoring_config(),
            levels=self.topology_levels(),
            queues=self.queue_settings(),
            retry_unschedulable=self.cycle.retry_unschedulable_seconds,
            walk_budget=self.cycle.walk_budget_seconds,
            first_walk_budget=self.cycle.first_walk_budget_seconds,
            assumed_timeout=self.binder.assumed_timeout_seconds,
            gang_default_timeout=gang.default_schedule_timeout_seconds,
            gang_initial_backoff=gang.initial_backoff_seconds,
            gang_max_backoff=gang.max_backoff_seconds,
            gang_whole_job_restart=gang.whole_job_restart,
            gang_report_delay=gang.report_delay_seconds,
            queue_status_interval=self.queues.status_interval_seconds,
            scheduled_events=self.status.scheduled_events,
            reservation=ReservationSettings(
                enabled=self.reservation.enabled, per_queue=self.reservation.per_queue,
                max_hold=self.reservation.max_hold_seconds,
            ),
            cards=self.card_policy(),
            mix_prior=self.mix_prior(),
            node_health=NodeHealthSettings(
                label=self.node_health.label, no_gpu_work=tuple(self.node_health.no_gpu_work),
                lower_score=tuple(self.node_health.lower_score), evict=tuple(self.node_health.evict),
            ),
        )

    def document(self) -> dict[str, Any]:
        """This configuration as the YAML document :func:`parse_config` reads (camelCase
        keys): what a snapshot records, so a replay applies the same settings."""
        out = _document(self)
        assert isinstance(out, dict)
        return out


def _document(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {_camel(f.name): _document(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_document(v) for v in value]
    if isinstance(value, dict):
        return {k: _document(v) for k, v in value.items()}
    return value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _scoring(section: ScoringSection) -> ScoringConfig:
    try:
        resources = tuple((str(r["name"]), int(r["weight"])) for r in section.resources)
        shape = tuple((int(p["utilization"]), int(p["score"])) for p in section.shape)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"config: scoring: each resource needs name and weight, each shape point utilization and score ({exc})") from None
    cfg = ScoringConfig(strategy=section.type, resources=resources, shape=shape)
    try:
        cfg.validate()
    except ValueError as exc:
        raise ConfigError(f"config: scoring: {exc}") from None
    return cfg


#: whole cards one kind of the prior mix may ask for at most (a typo of a few zeros is refused)
MAX_MIX_GPUS = 64
#: CPUs one kind of the prior mix may ask for at most
MAX_MIX_CPU = 4096
_MIX_KEYS = ("cpu", "gpus", "gpuShare", "weight")


def _mix_entry(entry: dict[str, Any], where: str) -> tuple[MixKind, int]:
    """One kind of ``gpuSharing.mix``: ``((cpu milli, whole cards, share milli), weight)``."""
    unknown = sorted(str(k) for k in entry if k not in _MIX_KEYS)
    if unknown:
        raise ConfigError(f"config: unknown key {where}.{unknown[0]!r} (known: {', '.join(_MIX_KEYS)})")
    if "weight" not in entry:
        raise ConfigError(f"config: {where}.weight: missing (how many pods this kind counts as)")
    weight = entry["weight"]
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MIX_WINDOW:
        raise ConfigError(f"config: {where}.weight: must be a whole number from 1 to {MIX_WINDOW}, got {weight!r}")
    cpu = _mix_quantity(entry.get("cpu", 0), "cpu", f"{where}.cpu")
    gpus = entry.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_MIX_GPUS:
        raise ConfigError(f"config: {where}.gpus: must be a whole number of cards from 0 to {MAX_MIX_GPUS}, got {gpus!r}")
    share = 0
    if "gpuShare" in entry:
        if gpus:
            raise ConfigError(f"config: {where}: gives both gpus and gpuShare (whole cards or a share of one, not both)")
        share = _mix_quantity(entry["gpuShare"], "cpu", f"{where}.gpuShare")  # thousandths, as milli-CPU
        if not 0 < share < MILLI:
            raise ConfigError(f"config: {where}.gpuShare: must be above 0 and below 1 (a share of one card), "
                              f"got {entry['gpuShare']!r}")
    if cpu == 0 and gpus == 0 and share == 0:
        raise ConfigError(f"config: {where}: asks for nothing (give cpu, gpus or gpuShare)")
    return (cpu, gpus, MILLI if gpus else share), weight


def _mix_quantity(value: Any, resource: str, where: str) -> int:
    """A quantity of the prior mix (``"8"``, ``"500m"``, ``0.5``) in thousandths."""
    try:
        units = to_units(resource, value)
    except QuantityError as exc:
        raise ConfigError(f"config: {where}: {exc}") from None
    if units < 0:
        raise ConfigError(f"config: {where}: must not be negative, got {value!r}")
    if units > MAX_MIX_CPU * MILLI:
        raise ConfigError(f"config: {where}: must be at most {MAX_MIX_CPU}, got {value!r}")
    return units


def _check(value: Any, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    if dataclasses.is_dataclass(typ) and isinstance(typ, type):
        if value is None:
            return typ()
        if not isinstance(value, dict):
            raise ConfigError(f"config: {where or 'top level'}: expected a mapping, got {type(value).__name__}")
        return _section(typ, value, where)
    if origin is tuple:
        (inner, _ellipsis) = typing.get_args(typ)
        if not isinstance(value, list):
            raise ConfigError(f"config: {where}: expected a list, got {type(value).__name__}")
        return tuple(_check(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict,) or typ is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config: {where}: expected a mapping, got {type(value).__name__}")
        return value
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config: {where}: expected true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config: {where}: expected a whole number, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"config: {where}: expected a number, got {value!r}")
        # YAML reads .nan and .inf, and whole numbers past any float: none is a setting
        if (isinstance(value, int) and abs(value) > 2**53) or (isinstance(value, float) and not math.isfinite(value)):
            raise ConfigError(f"config: {where}: expected a finite number, got {value!r}")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"config: {where}: expected a string, got {value!r}")
        return value
    if isinstance(typ, types.UnionType):
        return value
    return value


def _section(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {_camel(f.name): f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in known:
            raise ConfigError(f"config: unknown key {path!r} (known: {', '.join(sorted(known))})")
        f = known[key]
        kwargs[f.name] = _check(value, hints[f.name], path)
    return cls(**kwargs)


def _validate(cfg: Config) -> None:
    def positive(value: float, where: str) -> None:
        if value <= 0:
            raise ConfigError(f"config: {where}: must be greater than 0, got {value}")

    if not cfg.scheduler_names or any(not n for n in cfg.scheduler_names):
        raise ConfigError("config: schedulerNames: needs at least one non-empty name")
    positive(cfg.binder.concurrency, "binder.concurrency")
    if cfg.binder.retries < 0:
        raise ConfigError(f"config: binder.retries: must not be negative, got {cfg.binder.retries}")
    positive(cfg.binder.assumed_timeout_seconds, "binder.assumedTimeoutSeconds")
    positive(cfg.status.concurrency, "status.concurrency")
    if cfg.status.concurrency > MAX_STATUS_WRITERS:
        # one writer task each, started at once: a typo of a few zeros would exhaust memory
        raise ConfigError(
            f"config: status.concurrency: must be at most {MAX_STATUS_WRITERS}, got {cfg.status.concurrency}"
        )
    le = cfg.leader_election
    positive(le.lease_duration_seconds, "leaderElection.leaseDurationSeconds")
    positive(le.retry_period_seconds, "leaderElection.retryPeriodSeconds")
    if not le.retry_period_seconds < le.renew_deadline_seconds < le.lease_duration_seconds:
        raise ConfigError(
            "config: leaderElection: needs retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds"
        )
    positive(cfg.cycle.retry_unschedulable_seconds, "cycle.retryUnschedulableSeconds")
    positive(cfg.cycle.walk_budget_seconds, "cycle.walkBudgetSeconds")
    if cfg.cycle.first_walk_budget_seconds < 0:
        raise ConfigError("config: cycle.firstWalkBudgetSeconds: must not be negative")
    if cfg.cycle.min_interval_seconds < 0:
        raise ConfigError("config: cycle.minIntervalSeconds: must not be negative")
    positive(cfg.gang.default_schedule_timeout_seconds, "gang.defaultScheduleTimeoutSeconds")
    positive(cfg.gang.initial_backoff_seconds, "gang.initialBackoffSeconds")
    if cfg.gang.max_backoff_seconds < cfg.gang.initial_backoff_seconds:
        raise ConfigError("config: gang.maxBackoffSeconds: must not be below gang.initialBackoffSeconds")
    if cfg.gang.report_delay_seconds < 0:
        raise ConfigError("config: gang.reportDelaySeconds: must not be negative")
    positive(cfg.gang.eviction_concurrency, "gang.evictionConcurrency")
    q = cfg.queues
    if q.max_wait_seconds < 0:
        raise ConfigError("config: queues.maxWaitSeconds: must not be negative (0 turns aging off)")
    if q.history.half_life_seconds < 0:
        raise ConfigError("config: queues.history.halfLifeSeconds: must not be negative (0 turns it off)")
    if q.history.weight < 0:
        raise ConfigError("config: queues.history.weight: must not be negative")
    positive(q.status_interval_seconds, "queues.statusIntervalSeconds")
    positive(cfg.preemption.nomination_timeout_seconds, "preemption.nominationTimeoutSeconds")
    positive(cfg.preemption.max_searches_per_cycle, "preemption.maxSearchesPerCycle")
    positive(cfg.preemption.max_search_seconds_per_cycle, "preemption.maxSearchSecondsPerCycle")
    positive(cfg.reservation.per_queue, "reservation.perQueue")
    positive(cfg.reservation.max_hold_seconds, "reservation.maxHoldSeconds")
    positive(cfg.explain.estimate_ttl_seconds, "explain.estimateTtlSeconds")
    positive(cfg.explain.estimate_max_steps, "explain.estimateMaxSteps")
    positive(cfg.explain.estimate_budget_seconds, "explain.estimateBudgetSeconds")
    if cfg.explain.estimate_interval_seconds < 0:
        raise ConfigError("config: explain.estimateIntervalSeconds: must not be negative")
    adv = cfg.explain.advertise_address
    if adv and not adv.startswith("https://"):
        raise ConfigError(f"config: explain.advertiseAddress: expected https://host:port (the views are "
                          f"served over HTTPS only), got {adv!r}")
    _address(cfg.metrics_address, "metricsAddress")
    if cfg.explain.address:
        _address(cfg.explain.address, "explain.address")
        if cfg.explain.address == cfg.metrics_address and not cfg.explain.address.endswith(":0"):
            raise ConfigError("config: explain.address: must differ from metricsAddress (the views are "
                              "served over HTTPS, /metrics over plain HTTP)")
    tls = cfg.explain.tls
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError("config: explain.tls: give both certFile and keyFile, or neither (the scheduler "
                          "then makes its own certificate)")
    if tls.ca_file and not tls.cert_file:
        raise ConfigError("config: explain.tls.caFile: only with certFile and keyFile (a certificate the "
                          "scheduler makes publishes its own CA)")
    cfg.scoring_config()
    cfg.topology_levels()
    cfg.card_policy()
    cfg.mix_prior()


def _address(value: str, key: str) -> None:
    host, _, port = value.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(f"config: {key}: expected host:port, got {value!r}")


def parse_config(data: Any) -> Config:
    """A validated :class:`Config` from the parsed YAML document (``None`` = all defaults)."""
    cfg: Config = _check(data, Config, "")
    _validate(cfg)
    return cfg


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return parse_config(None)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config: {path} is not valid YAML{where}") from None
    return parse_config(data)
