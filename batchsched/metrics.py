"""Prometheus metrics, all named ``batchsched_*``, on a registry passed in (never global).

The dashboard and alert rules in ``manifests/overlays/with-monitoring/`` name only metrics defined here;
a test holds them to a running scheduler's ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: waits from a second to a day
_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
#: estimate error relative to the wait that was estimated (0.2: 20% off)
_RATIO_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pending_pods = Gauge(
            "batchsched_pending_pods", "Pods of ours waiting for a node (gated pods included).", registry=r
        )
        self.assumed_pods = Gauge(
            "batchsched_assumed_pods", "Pods decided by a cycle whose binding is not yet confirmed.", registry=r
        )
        self.pods_untold = Gauge(
            "batchsched_pods_untold",
            "Waiting pods told why they wait whose condition and Event are not queued for writing yet "
            "(a burst beyond the status queue's room, fed to it as it drains).", registry=r,
        )
        self.nodes = Gauge("batchsched_nodes", "Nodes in the mirror.", registry=r)
        self.gpu_cards = Gauge("batchsched_gpu_cards", "GPU cards on the nodes in the mirror.", registry=r)
        self.gpu_allocated = Gauge(
            "batchsched_gpu_allocated_cards",
            "GPU card compute held by pods, in cards (a share of a card counts its fraction).", registry=r,
        )
        self.gpu_free_cards = Gauge(
            "batchsched_gpu_free_cards", "GPU cards nobody holds any share of.", registry=r
        )
        self.workload_mix = Gauge(
            "batchsched_workload_mix", "The kinds of pods GPU fragmentation is measured against, each "
            "its share of the workload mix (0-1): cpu in cores, gpus whole cards, gpu_share a fraction of "
            "one card (both 0: a pod without GPU).", ["cpu", "gpus", "gpu_share"], registry=r,
        )
        self.gpu_allocation_ratio = Gauge(
            "batchsched_gpu_allocation_ratio",
            "GPU compute held over the cards of the mirror: kind=all, whole (cards held whole) "
            "or shared (fractions of cards held by shares).", ["kind"], registry=r,
        )
        self.cycle_duration = Histogram(
            "batchsched_cycle_duration_seconds", "Time of one scheduling cycle.", ["phase"],
            buckets=_CYCLE_BUCKETS, registry=r,
        )
        self.binds = Counter("batchsched_binds_total", "Bindings by result.", ["result"], registry=r)
        self.attempts = Counter(
            "batchsched_schedule_attempts_total", "Placement attempts of pods by result.", ["result"], registry=r
        )
        self.leader = Gauge("batchsched_leader", "1 while this replica holds the lease.", registry=r)
        self.watch_events = Counter(
            "batchsched_watch_events_total", "Watch events applied, by resource.", ["resource"], registry=r
        )
        # -- queues
        self.queue_pending = Gauge(
            "batchsched_queue_pending_units", "Units (gangs or single pods) waiting in each queue.",
            ["queue"], registry=r,
        )
        self.queue_admitted = Gauge(
            "batchsched_queue_admitted_units", "Units running in each queue.", ["queue"], registry=r,
        )
        self.queue_nominal = Gauge(
            "batchsched_queue_nominal", "Each queue's nominal quota, by resource (cards for GPUs, "
            "cores for CPU, bytes for memory).", ["queue", "resource"], registry=r,
        )
        self.queue_used = Gauge(
            "batchsched_queue_used", "What each queue's running work holds, by resource (units of "
            "batchsched_queue_nominal).", ["queue", "resource"], registry=r,
        )
        self.queue_borrowed = Gauge(
            "batchsched_queue_borrowed", "What each queue holds beyond its nominal, borrowed from its "
            "cohort, by resource.", ["queue", "resource"], registry=r,
        )
        self.queue_stopped = Gauge(
            "batchsched_queue_stopped", "1 while a queue's stopPolicy holds new work (Hold or HoldAndDrain).",
            ["queue"], registry=r,
        )
        self.wait = Histogram(
            "batchsched_pod_wait_seconds", "From a pod's creation to its Binding, by queue and priority.",
            ["queue", "priority"], buckets=_WAIT_BUCKETS, registry=r,
        )
        # -- what the cycle decided
        self.reservations = Gauge(
            "batchsched_reservations", "Units holding a reservation or a nomination after the last cycle.",
            registry=r,
        )
        self.evictions = Counter(
            "batchsched_evictions_total", "Pods evicted, by why: preempted, reclaimed, gang-timeout, "
            "restart (whole-job restart), suspended, drained.", ["reason"], registry=r,
        )
        self.suspended = Gauge(
            "batchsched_suspended_units", "Units held because they or their queue are suspended.", registry=r,
        )
        # -- start-time estimates
        self.estimate_error = Histogram(
            "batchsched_start_estimate_error_seconds",
            "Actual start minus the first estimated start, for units that started (negative: early).",
            buckets=(-3600, -600, -120, -30, -5, 5, 30, 120, 600, 3600), registry=r,
        )
        self.estimate_relative_error = Histogram(
            "batchsched_start_estimate_relative_error",
            "|actual start - estimated start| over the wait the estimate foresaw.",
            buckets=_RATIO_BUCKETS, registry=r,
        )
        self.estimate_duration = Histogram(
            "batchsched_estimate_duration_seconds", "Time of one forward simulation for start-time estimates.",
            buckets=_CYCLE_BUCKETS, registry=r,
        )
