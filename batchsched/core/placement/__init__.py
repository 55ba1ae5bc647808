"""Placement: the numba kernels and their plain-Python twins, scoring, node filters and
topology domains."""
