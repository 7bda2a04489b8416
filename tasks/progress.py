"""One progress display for the long stages: pretraining, training, sampling and model selection.

Each update is a line on standard error (standard output carries only the command's result):

    pretraining k1000: 45% (900/2000 iterations), 2.6 iterations/s, 5:47 left

at most every few seconds, plus the first and the last update. On a terminal the line is rewritten in
place; anywhere else (a log file, CI, a worker process sharing the terminal with another) every update
is a line of its own, so logs stay readable. The mode travels in the environment, not in a Python
setting, because the experiment flow runs stages in worker processes that inherit the environment:

    DPSYNTH_PROGRESS=off      nothing (what `--json` sets: standard error then carries errors only)
    DPSYNTH_PROGRESS=lines    one line per update, never rewritten in place
    DPSYNTH_PROGRESS_SECONDS  the least time between two updates (default 1 on a terminal, 10 elsewhere)
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from typing import Self, TextIO

MODE_ENV = "DPSYNTH_PROGRESS"
SECONDS_ENV = "DPSYNTH_PROGRESS_SECONDS"
IN_PLACE_SECONDS = 1.0
LINES_SECONDS = 10.0
_CLEAR_TO_END = "\x1b[K"


def format_duration(seconds: float) -> str:
    """0:07, 12:34, 1:02:03."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_rate(per_second: float, unit: str) -> str:
    """Units per second, or seconds per unit when slower than one a second (one selection run takes
    seconds: "0.2 runs/s" reads worse than "4.9 s per run")."""
    if per_second >= 100:
        return f"{per_second:,.0f} {unit}s/s"
    if per_second >= 1:
        return f"{per_second:.1f} {unit}s/s"
    return f"{1 / per_second:.1f} s per {unit}"


def format_line(
    stage: str,
    done: int,
    total: int,
    unit: str,
    per_second: float | None = None,
    elapsed: float | None = None,
    note: str = "",
) -> str:
    """The display's line. With `elapsed` it is the closing line (time taken); otherwise, with a rate,
    it says the time left at that rate."""
    percent = math.floor(100 * done / total) if total > 0 else 100
    parts = [f"{stage}: {percent}% ({done}/{total} {unit}s)"]
    if elapsed is not None:
        parts[0] += f" in {format_duration(elapsed)}"
    if per_second is not None and per_second > 0:
        parts.append(format_rate(per_second, unit))
        if elapsed is None:
            parts.append(f"{format_duration((total - done) / per_second)} left")
    if note:
        parts.append(note)
    return ", ".join(parts)


def _in_worker_process() -> bool:
    # Worker processes (process pool, Dask) share the terminal with each other: in-place rewriting
    # there would mix their lines.
    return multiprocessing.parent_process() is not None


class Progress:
    """Shows `done` of `total` units of one stage. Use as a context manager so an interrupted stage
    ends its in-place line before the error message.

    The rate is measured from the first update, not from zero, so a resumed stage (training from its
    last checkpoint) shows its own speed; the first update therefore shows no time left yet."""

    def __init__(
        self,
        stage: str,
        total: int,
        unit: str = "iteration",
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        seconds: float | None = None,
        mode: str | None = None,
    ):
        self.stage, self.total, self.unit = stage, int(total), unit
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        mode = mode if mode is not None else os.environ.get(MODE_ENV, "")
        self.enabled = mode != "off"
        self.in_place = mode != "lines" and self._is_terminal() and not _in_worker_process()
        if seconds is None:
            seconds = float(os.environ.get(SECONDS_ENV) or (IN_PLACE_SECONDS if self.in_place else LINES_SECONDS))
        self.seconds = seconds
        self._first: tuple[int, float] | None = None
        self._shown_at: float | None = None
        self._open_line = False  # an in-place line is on the terminal without its newline
        self._finished = False

    def _is_terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def update(self, done: int, note: str = "") -> None:
        """Record that `done` units are done; show it if it is the first, the last, or due."""
        if not self.enabled or self._finished:
            return
        now = self.clock()
        if self._first is None:
            self._first = (done, now)
        first_done, first_at = self._first
        per_second = (done - first_done) / (now - first_at) if now > first_at and done > first_done else None
        last = done >= self.total
        if last:
            self._finished = True
            line = format_line(self.stage, done, self.total, self.unit, per_second, now - first_at, note)
        elif self._shown_at is None or now - self._shown_at >= self.seconds:
            line = format_line(self.stage, done, self.total, self.unit, per_second, note=note)
        else:
            return
        self._shown_at = now
        self._write(line, last)

    def _write(self, line: str, last: bool) -> None:
        if self.in_place:
            self.stream.write("\r" + line + _CLEAR_TO_END + ("\n" if last else ""))
            self._open_line = not last
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False


def note(message: str, stream: TextIO | None = None) -> None:
    """One line for a person following the run (a stage reused, a checkpoint fallen back from), on
    standard error, under the same switch as the display (nothing when DPSYNTH_PROGRESS=off)."""
    if os.environ.get(MODE_ENV, "") == "off":
        return
    print(message, file=stream or sys.stderr, flush=True)
