"""Dynamic Resource Allocation (``resource.k8s.io/v1``): devices a pod's ResourceClaims ask for.

Pure and synchronous like the rest of the core: the objects as parsed values, the CEL device
selectors of DeviceClasses and claims, and the structured allocator that picks a node's devices
for one pod's claims. The kube edge lists the objects and writes the allocations.
"""
