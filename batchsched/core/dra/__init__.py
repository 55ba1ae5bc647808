"""Dynamic Resource Allocation (``resource.k8s.io/v1``): the objects, CEL device
selectors and the structured allocator, pure and synchronous like the rest of the core."""
