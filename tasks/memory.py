"""What a stage leaves behind in memory, handed back to the machine when the stage ends.

A release runs its stages one after another in one process, so the process's peak is the largest stage's
working set plus whatever the earlier stages left held. Measured at 1,000,000 census rows (`mst-eps1`,
docs/measurements.md) that was two things, neither of them rows:

* freed memory glibc keeps: the allocator returns a heap's free pages to the system only from its top,
  so the many small objects of a stage (frames of text columns, scikit-learn's and Prefect's objects)
  leave free pages behind the live ones, held for good (about 250 MB after training);
  `malloc_trim(0)` hands every free page back (glibc only; elsewhere nothing is done);
* jax's compiled programs: private-pgm (MST, AIM) compiles many small programs, kept by jax for the
  life of the process (about 300 MB) though no later stage runs them (sampling is numpy). They are
  dropped; a later fit in the same process compiles again, to the same results.

The cycle collection at a stage's end scans only the objects the stage made: what was alive when the
stage began (every imported module's objects: Prefect's, MLflow's, Great Expectations', torch's) is
frozen (`gc.freeze`) while the stage runs. A full collection of that heap costs about half a second of
CPU, and a release ends about 40 stages (each model-selection run is one): they added 19 CPU s to the
smoke release test's 62.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import sys
import threading
from collections.abc import Iterator


@functools.cache
def _glibc_malloc_trim():
    """glibc's `malloc_trim`, or None on another C library."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl, macOS: no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_frozen_lock = threading.Lock()
_stages_running = 0  # stages that run now, in this process (nested or side by side in threads)


@contextlib.contextmanager
def heap_frozen_during_stage() -> Iterator[None]:
    """Freeze what is alive when the first running stage begins; thaw it when the last one ends, so that
    `return_freed_memory` inside collects among the stage's own objects only (see the module notes).
    Frozen objects are never freed in between; they were alive at the start, and a stage that drops one
    leaves it to the next ordinary collection after the thaw."""
    global _stages_running
    with _frozen_lock:
        if _stages_running == 0:
            gc.freeze()
        _stages_running += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _stages_running -= 1
            if _stages_running == 0:
                gc.unfreeze()


def return_freed_memory() -> None:
    """Drop jax's compiled programs (if jax is loaded), collect cycles, and hand the allocator's free
    pages back to the system (see the module notes). Results never change: only caches and free memory go."""
    if "jax" in sys.modules:
        from dpsynth.models.generators.graphical.jax_runtime import drop_compiled_programs

        drop_compiled_programs()
    gc.collect()
    trim = _glibc_malloc_trim()
    if trim is not None:
        trim(0)
