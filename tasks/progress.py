"""What a person following a `release` or `experiment` sees on standard error while it runs.

A command opens one display (`open_display`, from flows/console.py) for its whole length. On it:

- a status line for start-up work that is no stage (loading the libraries, checking the table, opening the
  MLflow store, starting Prefect's temporary server): `status("starting Prefect")`; it ends, with the time
  it took, when the next status or stage starts (on a terminal only);
- a line per stage (`stage("validate")`, from each Prefect task in flows/stages.py), with its time;
- a bar for the long stages (pretraining, training, sampling, model selection): `Progress`, which takes
  over the line of the stage it runs in, with done/total, the time taken and the time left.

On a terminal the display is drawn with `rich` and redrawn in place. Anywhere else (a log file, CI) it is
plain lines: `validate...` and `validate: done in 0:02` for stages and statuses, and for a bar a line like

    pretraining k1000: 45% (900/2000 iterations), 2.6 iterations/s, 5:47 left

at most every few seconds, plus the first and the last. Without an open display in this process (a flow
called from Python, a worker process of the experiment), stages and statuses show nothing and bars are
plain lines, as in a log. The mode travels in the environment, not in a Python setting, because the
experiment flow runs stages in worker processes that inherit the environment:

    DPSYNTH_PROGRESS=off      nothing (what `--json` sets: standard error then carries errors only)
    DPSYNTH_PROGRESS=lines    plain lines even on a terminal (what `--verbose` sets)
    DPSYNTH_PROGRESS_SECONDS  the least time between two plain bar lines (default 10)

`rich` is imported only when a display is drawn on a terminal, so `dpsynth --help` stays fast.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Self, TextIO, cast

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

MODE_ENV = "DPSYNTH_PROGRESS"
SECONDS_ENV = "DPSYNTH_PROGRESS_SECONDS"
LINES_SECONDS = 10.0
# A bar forwards an update to the terminal display at most this often (rich redraws a few times a second).
DRAW_SECONDS = 0.1


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
    """A bar's plain line. With `elapsed` it is the closing line (time taken); otherwise, with a rate,
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
    # Worker processes (process pool, Dask) share the terminal with each other and with the command's
    # display: they never draw on it.
    return multiprocessing.parent_process() is not None


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


# ------------------------------------------------------------------------------------------ displays


class Display:
    """The display of one command: nothing (mode "off"). `LinesDisplay` and `TerminalDisplay` show it."""

    def status(self, label: str) -> None:
        """Start-up work that is no stage; ends when the next status or stage starts."""

    def begin(self, label: str) -> object:
        """A stage starts; returns its handle for `end` and `attach`."""
        return label

    def end(self, handle: object, failed: bool = False) -> None:
        """The stage `handle` ends (`failed`: by an exception)."""

    def bar(self, handle: object | None, label: str, total: int, unit: str) -> object | None:
        """A bar for `label` on the line of stage `handle` (or a line of its own); None: plain lines."""
        return None

    def advance(self, bar: object, done: int, note: str) -> None:
        """Show `done` units on `bar`."""

    def close(self) -> None:
        """The command ends: end what is still open and release the terminal."""


class LinesDisplay(Display):
    """One plain line at each stage's start and end (for logs and CI); bars print their own plain lines.
    Statuses show nothing here: start-up work is a terminal user's wait, and a command refused before
    any stage keeps its standard error to the one paragraph that says why."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic):
        self.stream, self.clock = stream, clock

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def begin(self, label: str) -> object:
        self._line(f"{label}...")
        return (label, self.clock())

    def end(self, handle: object, failed: bool = False) -> None:
        label, started = cast(tuple[str, float], handle)
        self._line(f"{label}: {'stopped after' if failed else 'done in'} {format_duration(self.clock() - started)}")


class TerminalDisplay(Display):
    """Drawn in place with rich: a line per status and stage (a spinner, then a tick and its time), the
    long stages with a bar. Standard error written meanwhile (a note, a warning) prints above it."""

    def __init__(self, stream: TextIO):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as RichProgress

        console = Console(file=stream, force_terminal=True, highlight=False)
        self.rich: RichProgress = RichProgress(
            SpinnerColumn(finished_text="[green]✓[/]"),
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            TextColumn("[dim]{task.fields[note]}[/]"),
            console=console,
            redirect_stdout=False,  # standard output carries the command's result, never the display
            redirect_stderr=True,
            refresh_per_second=4,
        )
        self._lock = threading.Lock()
        self._status: TaskID | None = None
        self.rich.start()

    def _add(self, label: str) -> TaskID:
        # total=None: a pulsing bar while it runs; a full one once done.
        return self.rich.add_task(label, total=None, count="", left="", note="")

    def _task(self, task: TaskID) -> Any:
        return next(t for t in self.rich.tasks if t.id == task)

    def _finish(self, task: TaskID, failed: bool = False) -> None:
        total = self._task(task).total or 1
        fields: dict[str, Any] = {"left": ""}
        if failed:
            fields["note"] = "stopped"
            self.rich.update(task, **fields)
            self.rich.stop_task(task)
        else:
            self.rich.update(task, total=total, completed=total, **fields)

    def _end_status(self) -> None:
        if self._status is not None:
            self._finish(self._status)
            self._status = None

    def status(self, label: str) -> None:
        with self._lock:
            self._end_status()
            self._status = self._add(label)

    def begin(self, label: str) -> object:
        with self._lock:
            self._end_status()
            return self._add(label)

    def end(self, handle: object, failed: bool = False) -> None:
        with self._lock:
            self._finish(handle, failed)  # type: ignore[arg-type]

    def bar(self, handle: object | None, label: str, total: int, unit: str) -> object | None:
        with self._lock:
            task = handle if handle is not None else self._add(label)
            self.rich.update(task, total=total, completed=0, description=label, count=f"0/{total} {unit}s")  # type: ignore[arg-type]
            return (task, unit, total)

    def advance(self, bar: object, done: int, note: str) -> None:
        task, unit, total = cast("tuple[TaskID, str, int]", bar)
        with self._lock:
            self.rich.update(task, completed=done, count=f"{done}/{total} {unit}s", note=note)
            left = self._task(task).time_remaining
            self.rich.update(task, left=f"{format_duration(left)} left" if left is not None and done < total else "")

    def close(self) -> None:
        with self._lock:
            self._end_status()
            self.rich.stop()


_OFF = Display()
# The display this process opened (with the process id: a display never serves another process), and
# the stage now running on it.
_open: tuple[int, Display] | None = None
_stages: list[object] = []


def _display() -> Display | None:
    if _open is None or _open[0] != os.getpid():
        return None
    return _open[1]


@contextlib.contextmanager
def open_display(mode: str | None = None, stream: TextIO | None = None) -> Iterator[Display]:
    """The display of one command, for the block: drawn on a terminal, plain lines elsewhere or under
    DPSYNTH_PROGRESS=lines, nothing under DPSYNTH_PROGRESS=off. Closed (whatever is open ended) at the
    end of the block, or earlier by `close_display` (before the command prints its result)."""
    global _open
    stream = stream if stream is not None else sys.stderr
    mode = mode if mode is not None else os.environ.get(MODE_ENV, "")
    display: Display
    if mode == "off":
        display = _OFF
    elif mode != "lines" and _is_terminal(stream) and not _in_worker_process():
        display = TerminalDisplay(stream)
    else:
        display = LinesDisplay(stream)
    previous = _open
    _open = (os.getpid(), display)
    try:
        yield display
    finally:
        _open = previous
        _stages.clear()
        display.close()


def close_display() -> None:
    """End the open display now (the command is about to print its result on standard output)."""
    global _open
    display = _display()
    if display is not None:
        _open = None
        _stages.clear()
        display.close()


def status(label: str) -> None:
    """Show start-up work that is no stage (nothing without an open display)."""
    display = _display()
    if display is not None:
        display.status(label)


@contextlib.contextmanager
def stage(label: str) -> Iterator[None]:
    """One stage's line, with its time (nothing without an open display)."""
    display = _display()
    if display is None:
        yield
        return
    handle = display.begin(label)
    _stages.append(handle)
    failed = True
    try:
        yield
        failed = False
    finally:
        if _stages and _stages[-1] is handle:
            _stages.pop()
        display.end(handle, failed)


# ---------------------------------------------------------------------------------------------- bars


class Progress:
    """Shows `done` of `total` units of one stage: on the open terminal display, on the line of the stage
    it runs in; otherwise as plain lines on `stream`. Use as a context manager so an interrupted stage
    ends its line before the error message.

    The rate of the plain lines is measured from the first update, not from zero, so a resumed stage
    (training from its last checkpoint) shows its own speed; the first line therefore shows no time left."""

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
        # An explicit stream, or no display open in this process: plain lines on the stream.
        display = _display() if stream is None and self.enabled else None
        if display is _OFF:
            self.enabled = False
        self._display = display
        self._bar = display.bar(_stages[-1] if _stages else None, stage, self.total, unit) if display else None
        self.seconds = seconds if seconds is not None else float(os.environ.get(SECONDS_ENV) or LINES_SECONDS)
        self._first: tuple[int, float] | None = None
        self._shown_at: float | None = None
        self._finished = False

    def update(self, done: int, note: str = "") -> None:
        """Record that `done` units are done; show it if it is the first, the last, or due."""
        if not self.enabled or self._finished:
            return
        now = self.clock()
        if self._bar is not None:
            last = done >= self.total
            if last or self._shown_at is None or now - self._shown_at >= DRAW_SECONDS:
                self._shown_at = now
                self._finished = last
                assert self._display is not None
                self._display.advance(self._bar, done, note)
            return
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
        self.stream.write(line + "\n")
        self.stream.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def note(message: str, stream: TextIO | None = None) -> None:
    """One line for a person following the run (a stage reused, a checkpoint fallen back from), on
    standard error (above the display on a terminal), under the same switch as the display (nothing
    when DPSYNTH_PROGRESS=off)."""
    if os.environ.get(MODE_ENV, "") == "off":
        return
    print(message, file=stream or sys.stderr, flush=True)
