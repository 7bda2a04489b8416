"""The progress display: its plain line (percentage, rate, time left) and throttling on an injected clock,
the rich display on a terminal (statuses, stages, bars), plain lines elsewhere, silence when switched off."""

import io

import pytest

from dpsynth.tasks.progress import Progress, format_duration, format_line, format_rate


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def shown(stream) -> list[str]:
    return stream.getvalue().splitlines()


def test_line_has_percentage_rate_and_time_left():
    assert (
        format_line("pretraining k1000", 900, 2000, "iteration", per_second=2.5)
        == "pretraining k1000: 45% (900/2000 iterations), 2.5 iterations/s, 7:20 left"
    )
    assert (
        format_line("training k10", 40, 40, "iteration", per_second=104.2, elapsed=0.4, note="epsilon 9.990")
        == "training k10: 100% (40/40 iterations) in 0:00, 104 iterations/s, epsilon 9.990"
    )
    # No rate yet (the first update): no time left either.
    assert format_line("sampling k10", 0, 41, "checkpoint") == "sampling k10: 0% (0/41 checkpoints)"


def test_rate_and_duration_read_well_at_every_scale():
    assert format_rate(0.2, "run") == "5.0 s per run"
    assert format_rate(3.14, "run") == "3.1 runs/s"
    assert format_rate(1234.0, "iteration") == "1,234 iterations/s"
    assert [format_duration(s) for s in (7, 754, 3723, -1)] == ["0:07", "12:34", "1:02:03", "0:00"]


def test_throttled_to_the_interval_plus_first_and_last_update():
    clock, out = Clock(), io.StringIO()
    progress = Progress("pretraining k10", 100, clock=clock, stream=out, seconds=5, mode="")
    progress.update(0)  # first: shown
    clock.now += 1
    progress.update(10)  # 1 s later: not due
    clock.now += 4
    progress.update(50)  # 5 s after the first: due, 10 iterations/s, 5 s left
    clock.now += 1
    progress.update(60)  # not due
    clock.now += 1
    progress.update(100)  # the last: always shown, with the time taken
    assert shown(out) == [
        "pretraining k10: 0% (0/100 iterations)",
        "pretraining k10: 50% (50/100 iterations), 10.0 iterations/s, 0:05 left",
        "pretraining k10: 100% (100/100 iterations) in 0:07, 14.3 iterations/s",
    ]
    clock.now += 10
    progress.update(100)  # nothing after the last
    assert len(shown(out)) == 3


def test_a_resumed_stage_measures_its_rate_from_where_it_resumed():
    clock, out = Clock(), io.StringIO()
    progress = Progress("training k10", 40, clock=clock, stream=out, seconds=0, mode="")
    progress.update(20)  # resumed from the checkpoint at iteration 20
    clock.now += 10
    progress.update(30, "epsilon 41.459")
    assert shown(out)[-1] == "training k10: 75% (30/40 iterations), 1.0 iterations/s, 0:10 left, epsilon 41.459"


def test_a_terminal_display_draws_every_stage_and_bar_with_rich_and_ends_cleanly():
    from dpsynth.tasks.progress import TerminalDisplay, close_display, open_display, stage, status

    term = Terminal()
    with open_display(mode="", stream=term) as display:
        assert isinstance(display, TerminalDisplay)
        status("starting Prefect")
        with stage("train"), Progress("training k10", 3, "iteration") as progress:
            progress.update(1, "epsilon 1.000")
            progress.update(3, "epsilon 9.990")
        with pytest.raises(KeyboardInterrupt), stage("select"):
            raise KeyboardInterrupt
        close_display()
        status("after the end")  # nothing: the display is closed
    drawn = term.getvalue()
    # The final frame: a line per status and stage, the stage's line taken over by its bar.
    for shown in ("starting Prefect", "training k10", "3/3 iterations", "epsilon 9.990", "select", "stopped"):
        assert shown in drawn, shown
    assert "after the end" not in drawn
    assert drawn.endswith("\x1b[?25h") or "\x1b[?25h" in drawn  # the cursor is given back


def test_plain_lines_elsewhere_and_nothing_without_a_display(capsys):
    from dpsynth.tasks.progress import LinesDisplay, open_display, stage, status

    clock, out = Clock(), io.StringIO()
    with stage("validate"):  # no display open: nothing
        status("starting Prefect")
    assert capsys.readouterr().err == ""
    with open_display(mode="", stream=out) as display:
        assert isinstance(display, LinesDisplay)
        display.clock = clock
        status("starting Prefect")
        clock.now += 12
        with stage("validate"):
            clock.now += 3
    # Start-up statuses are for a terminal: a log gets the stages.
    assert shown(out) == ["validate...", "validate: done in 0:03"]


@pytest.mark.parametrize("mode, expected", [("lines", 2), ("off", 0)])
def test_lines_mode_never_rewrites_and_off_mode_is_silent(mode, expected):
    clock, term = Clock(), Terminal()
    with Progress("model selection k10", 2, "run", clock=clock, stream=term, seconds=0, mode=mode) as progress:
        progress.update(0)
        clock.now += 1
        progress.update(2)
    assert "\r" not in term.getvalue() and len(shown(term)) == expected


def test_mode_and_interval_come_from_the_environment(monkeypatch):
    """The experiment's worker processes inherit them: the command line sets them there."""
    out = io.StringIO()
    monkeypatch.setenv("DPSYNTH_PROGRESS", "off")
    Progress("pretraining k10", 2, stream=out).update(0)
    assert out.getvalue() == ""
    monkeypatch.setenv("DPSYNTH_PROGRESS", "lines")
    monkeypatch.setenv("DPSYNTH_PROGRESS_SECONDS", "3")
    from dpsynth.tasks.progress import LinesDisplay, open_display

    with open_display(stream=Terminal()) as display:  # plain lines even on a terminal
        assert isinstance(display, LinesDisplay)
    assert Progress("pretraining k10", 2, stream=Terminal()).seconds == 3.0
