"""The process's memory: the cyclic collector paused over bursts, freed pages given back.

Python's cyclic collector runs after every few hundred allocations, and each of its full
passes walks every tracked object: with a mirror of 100,000 pods, a step that allocates a
condition per waiting pod ran its passes dozens of times over the whole mirror, half the
step's time (measured with ``python -m perf.backlog``). The objects a step or a list makes
rarely form cycles (dataclasses and dicts freed by their reference counts), so
:func:`collector_paused` holds the collector over such a burst and lets it run once after.

A large step (the first after a restart with a big backlog: a condition per pending pod)
allocates and frees hundreds of megabytes of small objects; glibc keeps the freed pages in
its arenas, so the process's resident size stays at its peak although Python no longer
holds the memory. :func:`trim` asks glibc to return them (``malloc_trim``); elsewhere it
does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable, Iterator

__all__ = ["collector_paused", "trim"]


@contextlib.contextmanager
def collector_paused(*, kept: bool = False) -> Iterator[None]:
    """The cyclic collector held over the block (a step, a list's intake), as it was after:
    one young-generation pass then collects what the block left in cycles.

    ``kept``: what the block made lives on (a list's objects, the mirror read from them),
    so it is moved out of the collector's reach (:func:`gc.freeze`) instead: the young pass
    would walk every one of them (a second per list of 26,000 pods), and the passes of
    older generations again later, to find no cycle. Frozen objects are still freed by
    their reference counts; only a cycle among them is never collected."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if kept:
            gc.freeze()
        if enabled:
            gc.enable()


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
