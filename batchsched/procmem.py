"""Give freed heap memory back to the system.

A large step (the first after a restart with a big backlog: a condition per pending pod)
allocates and frees hundreds of megabytes of small objects; glibc keeps the freed pages in
its arenas, so the process's resident size stays at its peak although Python no longer
holds the memory. :func:`trim` asks glibc to return them (``malloc_trim``); elsewhere it
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

__all__ = ["trim"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def trim() -> bool:
    """Return freed heap pages to the system; False where that is not possible."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
