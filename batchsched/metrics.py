"""Prometheus metrics, all named ``batchsched_*``, on a registry passed in (never global)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
        self.nodes = Gauge("batchsched_nodes", "Nodes in the mirror.", registry=r)
        self.gpu_cards = Gauge("batchsched_gpu_cards", "GPU cards on the nodes in the mirror.", registry=r)
        self.gpu_allocated = Gauge(
            "batchsched_gpu_allocated_cards",
            "GPU card compute held by pods, in cards (a share of a card counts its fraction).", registry=r,
        )
        self.gpu_free_cards = Gauge(
            "batchsched_gpu_free_cards", "GPU cards nobody holds any share of.", registry=r
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
