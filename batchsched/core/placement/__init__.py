"""Placement: the placement problem (one value, :mod:`.problem`), the numba kernels that
solve it and their plain-Python twins, scoring, node filters and topology domains."""
