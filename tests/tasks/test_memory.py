"""A stage's end hands back what it left behind (tasks/memory.py): glibc's free heap pages, and jax's
compiled programs."""

from __future__ import annotations

import ctypes.util
import platform
from pathlib import Path

import numpy as np
import pytest

from dpsynth.tasks.stage import run_stage

STATM = Path("/proc/self/statm")


def _resident_bytes() -> int:
    import resource

    return int(STATM.read_text().split()[1]) * resource.getpagesize()


@pytest.mark.skipif(
    not STATM.exists() or platform.libc_ver()[0] != "glibc" or ctypes.util.find_library("c") is None,
    reason="glibc's heap on Linux",
)
def test_a_stage_end_hands_the_freed_heap_back(tmp_path):
    def work(directory: Path) -> tuple[dict, dict]:
        # 200 MB in blocks under glibc's mmap threshold (on the heap), all freed but the last one, which
        # keeps the heap's top in use: glibc by itself returns none of the free pages below it.
        blocks = [np.ones(12_000) for _ in range(2_000)]
        kept.append(blocks[-1])
        del blocks
        held.append(_resident_bytes())
        return {}, {}

    kept: list[np.ndarray] = []
    held: list[int] = []
    run_stage(tmp_path, "heavy", {}, {}, work)
    assert held[0] - _resident_bytes() > 100 * 1024 * 1024, (held[0], _resident_bytes())


def test_a_stage_end_drops_jax_compiled_programs(tmp_path):
    from dpsynth.models.generators.graphical.jax_runtime import load_jax

    jax = load_jax()
    doubled = jax.jit(lambda x: 2 * x)

    def work(directory: Path) -> tuple[dict, dict]:
        doubled(jax.numpy.ones(3)).block_until_ready()
        assert doubled._cache_size() == 1
        return {}, {}

    run_stage(tmp_path, "fit", {}, {}, work)
    assert doubled._cache_size() == 0
    assert float(doubled(jax.numpy.ones(3))[0]) == 2.0  # compiled again when used again


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_stage_end_collects_its_own_cycles_without_scanning_the_heap_it_started_with(tmp_path):
    import gc
    import weakref

    made: list[weakref.ref] = []
    frozen_inside: list[int] = []

    def inner(directory: Path) -> tuple[dict, dict]:
        frozen_inside.append(gc.get_freeze_count())
        return {}, {}

    def work(directory: Path) -> tuple[dict, dict]:
        frozen_inside.append(gc.get_freeze_count())
        made.append(weakref.ref(_Cycle()))  # garbage only a cycle collection frees
        run_stage(tmp_path / "inner", "inner", {}, {}, inner)  # a stage inside a stage keeps the heap frozen
        frozen_inside.append(gc.get_freeze_count())
        made.append(weakref.ref(_Cycle()))
        return {}, {}

    gc.disable()  # no automatic collection: only the stage's own may free the cycles
    try:
        run_stage(tmp_path, "outer", {}, {}, work)
        assert all(ref() is None for ref in made)
    finally:
        gc.enable()
    assert min(frozen_inside) > 1000, frozen_inside  # the modules' objects, at least
    assert gc.get_freeze_count() == 0  # thawed when the last stage ended


def test_a_failed_stage_thaws_the_heap(tmp_path):
    import gc

    def work(directory: Path) -> tuple[dict, dict]:
        raise RuntimeError("stage failed")

    with pytest.raises(RuntimeError):
        run_stage(tmp_path, "failing", {}, {}, work)
    assert gc.get_freeze_count() == 0
