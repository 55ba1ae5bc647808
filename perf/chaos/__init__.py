"""The chaos suite: batchsched under faults, judged from the apiserver's state.

A run brings up a sandbox (a real etcd, kube-apiserver, kube-controller-manager and kwok on
loopback), two teams' queues in one cohort with borrowing, and a workload of gangs (several
sizes, whole GPUs and shares of a card) and single pods, scheduled by batchsched replicas
run as processes. Faults are injected on a schedule: the control plane killed, the network
slowed or cut, watches expired, another scheduler binding behind our back, nodes deleted
or tainted, objects recreated, the scheduler itself killed or partitioned. The harness keeps
its own watch of everything (:mod:`perf.chaos.world`'s ``Recorder``) and checks, all along
and at the end, what must never happen (:mod:`perf.chaos.checks`): a gang partly bound, a
pod bound twice or to a node that is gone, a pod left waiting with no reason given, a queue
above its quota, a node over-committed. After each fault it times how long the cluster
takes to settle again.

    python -m perf chaos [--nodes N] [--faults a,b] [--out DIR]

Modules: ``world`` (the cluster, the workload, the scheduler processes, the recorder),
``proxy`` (a fault-injecting proxy between a replica and the apiserver), ``checks`` (the
invariants), ``faults_cluster`` (faults from outside the scheduler), ``faults_scheduler``
(faults of the scheduler process, when present), ``run`` (the schedule and the table).
"""
