"""A stage run in a fresh child process, so that the memory it takes goes back to the machine when it ends.

A Python process keeps the memory its stages freed (glibc's arenas; `malloc_trim` returns little), so a
release run in one process ratchets up stage by stage: each memory-heavy stage costs its own peak on top of
what the earlier ones left behind. Run in a child, a stage costs its peak only while it runs.

The child is started with the 'spawn' context (a fresh interpreter: it shares no pages, threads or locks with
the release process, Prefect's included). It gets the stage's arguments pickled and gives back its result;
what a stage writes goes to its run folder as before, and its randomness comes from the seed and the run's
secret file, so the outputs are the same files. An error in the child comes back as the same exception (a
`DpsynthError` still reads as its message, without a traceback); a child that dies (killed, out of memory)
raises `BrokenProcessPool` in the release, and the stages completed before it keep their manifests.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def in_child_process(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`fn(*args, **kwargs)` in a fresh child process: its result, or its exception raised here."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args, **kwargs).result()
