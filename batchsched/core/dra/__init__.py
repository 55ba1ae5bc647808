"""Dynamic Resource Allocation (``resource.k8s.io/v1``): the devices a pod's ResourceClaims ask for.

Pure and synchronous like the rest of the core: the objects as parsed values
(:mod:`.objects`), the CEL device selectors of DeviceClasses and claims (:mod:`.cel`), the
structured allocator that picks a node's devices for one pod's claims (:mod:`.allocator`),
and the book that shows devices to placement and allocates claims in the cycle
(:mod:`.book`). The kube edge lists the objects and writes the allocations
(:mod:`batchsched.kube.claims`).
"""
