"""LoggedProgress: a background job's log shows progress as plain lines; a terminal gets only the bar."""

import io

import pytest
from rich.console import Console

from specbench import progress as progress_mod
from specbench.progress import LoggedProgress


@pytest.fixture
def clock(monkeypatch):
    """The progress module's clock (and the bar's, for its speed), advanced by hand (seconds)."""
    now = [1000.0]
    monkeypatch.setattr(progress_mod, "_now", lambda: now[0])
    return now


def _bar(terminal: bool, clock: list[float]):
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=terminal, width=200)
    return LoggedProgress(console=console, get_time=lambda: clock[0]), sink


def test_a_log_file_gets_a_line_at_the_first_update_every_interval_and_at_the_end(clock):
    bar, sink = _bar(False, clock)
    with bar:
        task = bar.add_task("train", total=500, label="")
        for step in range(1, 501):
            clock[0] += 1.0  # one step a second: a line every 60 steps at most
            bar.update(task, completed=step, label=f"step {step} · [green]ok[/]")
        bar.update(task, completed=500, label="done")  # a second update at 500/500 is not logged again
        other = bar.add_task("cell", total=None, label="loading")
        bar.update(other, label="loading")
        bar.update(other, description="next cell", completed=0, total=None, label="")  # renamed: logged at once
    lines = [line for line in sink.getvalue().splitlines() if line.strip()]
    assert lines[0].startswith("train: 1/500 · step 1 · ok · ")  # nothing when added: the first update
    progress_lines = [line for line in lines if line.startswith("train:")]
    assert 9 <= len(progress_lines) <= 11  # the start, every 60 s over 500 s, the end
    assert progress_lines[-1].startswith("train: 500/500 · step 500 · ok · ")
    # one step a second: the time left is the steps left, in seconds or minutes; none once complete
    assert progress_lines[1] == "train: 61/500 · step 61 · ok · 61 s · about 7 min left", progress_lines[1]
    assert progress_lines[-2].endswith(" s left") and "left" not in progress_lines[-1]
    assert "[green]" not in sink.getvalue()  # markup is rendered to plain text, not printed raw
    assert any(line.startswith("cell: loading") for line in lines) and any(line.startswith("next cell: ") for line in lines)


def test_a_terminal_gets_the_bar_and_no_extra_lines(clock):
    bar, sink = _bar(True, clock)
    with bar:
        task = bar.add_task("train", total=3, label="")
        for step in (1, 2, 3):
            clock[0] += 100.0
            bar.update(task, completed=step)
    assert "train: " not in sink.getvalue()


@pytest.mark.parametrize("transient", [False, True])
def test_a_bar_stopped_before_any_update_leaves_a_log_empty(clock, transient):
    """A user error raised while loading (inside the bar, before its first update) stays the only line on stderr:
    rich ends a bar on a console that is not a terminal with its last frame, or an empty line when transient (the
    blank line that stood above `run --target nosuch`'s error in a log)."""
    bar, sink = _bar(False, clock)
    bar.live.transient = transient
    with pytest.raises(ValueError):
        with bar:
            bar.add_task("run", total=None, label="loading")
            raise ValueError("a bad target")
    assert sink.getvalue() == ""
