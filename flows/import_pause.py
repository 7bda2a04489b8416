"""Start-up imports with Python's cycle collector paused (bench/startup.py measures the start-up).

Importing a library makes hundreds of thousands of objects that live as long as the process, and the
collector, run after every 700 new objects, scans them again and again while they load: about a fifth of
the CPU seconds of a flow command's imports before its first stage (the accountant's SciPy, Great
Expectations, the flow's Prefect) and of its server process's (Prefect's server code). Paused around
imports only, never around work on rows: a table check makes its garbage row group by row group and has
it collected as it goes.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cycle collection in the block; at its end everything alive, chiefly the modules just imported,
    is frozen (`gc.freeze`: later collections skip it rather than scan it once more; a stage's end thaws
    it, tasks/memory.py) and collection resumes. A collector already off (the caller's choice) stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
