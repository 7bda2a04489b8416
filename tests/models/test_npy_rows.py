"""Rows of a `.npy` file read by position (models/data/npy_rows.py): the same rows as the array, and a
batch of rows spread over the file costs the rows, not the file (a memory map's reads mapped all of it)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dpsynth.models.data.npy_rows import RowFile
from tests.conftest import ROOT


def test_rows_and_runs_are_the_arrays(tmp_path):
    array = np.random.default_rng(0).standard_normal((500, 9)).astype(np.float32)
    np.save(tmp_path / "rows.npy", array)
    rows = RowFile(tmp_path / "rows.npy")
    assert rows.shape == (500, 9) and rows.dtype == np.float32 and len(rows) == 500
    for positions in ([3, 4, 5, 6, 200, 7, 7, 499, 0], np.arange(500), [], np.arange(100, 0, -3)):
        np.testing.assert_array_equal(rows.rows(np.array(positions, dtype=np.int64)), array[positions])
    np.testing.assert_array_equal(rows.run(480, 600), array[480:])
    assert rows.run(600, 700).shape == (0, 9)
    with pytest.raises(IndexError):
        rows.rows(np.array([500]))


def test_a_file_that_is_not_a_row_matrix_or_ends_early_is_refused(tmp_path):
    np.save(tmp_path / "fortran.npy", np.asfortranarray(np.ones((4, 3), dtype=np.float32)))
    with pytest.raises(ValueError, match="C-ordered 2-d"):
        RowFile(tmp_path / "fortran.npy")
    np.save(tmp_path / "whole.npy", np.ones((100, 3), dtype=np.float32))
    cut = (tmp_path / "whole.npy").read_bytes()[:-120]
    (tmp_path / "cut.npy").write_bytes(cut)
    with pytest.raises(OSError, match="ends before"):
        RowFile(tmp_path / "cut.npy").rows(np.array([99]))


# Reads 1,000 rows spread over a 128 MB file in a fresh process; prints how far the peak rose.
SCATTERED_READ = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from dpsynth.models.data.npy_rows import RowFile
    path, how = sys.argv[1], sys.argv[2]
    positions = np.sort(np.random.default_rng(1).choice(250_000, 1_000, replace=False))
    def peak_kb():
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
        return int(line.split()[1])
    Path("/proc/self/clear_refs").write_text("5")
    before = peak_kb()
    rows = RowFile(path).rows(positions) if how == "file" else np.load(path, mmap_mode="r")[positions]
    print(json.dumps({"grown_kb": peak_kb() - before, "rows_kb": rows.nbytes // 1024}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="resets Linux's peak-memory counter")
def test_a_scattered_batch_costs_its_rows_not_the_file(tmp_path):
    path = tmp_path / "rows.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(250_000, 128))  # 128 MB
    for start in range(0, 250_000, 50_000):  # every page written, so in the page cache as after a prepare
        out[start : start + 50_000] = 1.0
    out.flush()
    del out

    def grown(how: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", SCATTERED_READ, str(path), how], capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    read = grown("file")
    assert read["grown_kb"] < read["rows_kb"] + 4_096, read  # the rows (512 KB) and a little
    mapped = grown("map")  # what the test sees of a memory map's read: most of the file
    assert mapped["grown_kb"] > 4 * (read["rows_kb"] + 4_096), mapped
