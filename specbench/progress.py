"""Progress that also reads in a log file: a rich bar on a terminal, plain lines elsewhere.

Rich draws nothing while a bar runs when its console is not a terminal, so a training run started with
``nohup ... > train.log`` showed no progress for hours. :class:`LoggedProgress` is rich's
:class:`~rich.progress.Progress` that, when its console is not a terminal, also prints one plain line
per task at its first update, at most every :attr:`LoggedProgress.log_every_s` seconds while it moves
(with the time left, as the bar's own estimate has it, once there is one), and when it completes.
Nothing is printed when a task is added, nor when the bar stops (off a terminal the live display does not
start: rich would end it with the bar's last frame, or an empty line for a transient bar), so a user error
raised before the first update (a bad target, --compile on a CPU) stays the one line on stderr.
"""

from __future__ import annotations

from time import monotonic as _now
from typing import Any

from rich.errors import MarkupError
from rich.progress import Progress, TaskID
from rich.text import Text


def _plain(markup: str) -> str:
    """The text of a rich-markup label (a label that is not valid markup is kept as written)."""
    try:
        return Text.from_markup(markup).plain
    except MarkupError:
        return markup


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min`` or ``3.4 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


class LoggedProgress(Progress):
    log_every_s: float = 60.0

    def __init__(self, *columns: Any, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self._log_plain = not self.disable and not self.console.is_terminal
        self._last_logged: dict[TaskID, float] = {}
        self._completed_logged: set[TaskID] = set()
        self._described: dict[TaskID, str] = {}

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        self._log(task_id)

    def start(self) -> None:
        if not self._log_plain:  # off a terminal the plain lines are the record: no live display to end
            super().start()

    def stop(self) -> None:
        if not self._log_plain:
            super().stop()

    def _log(self, task_id: TaskID) -> None:
        if not self._log_plain:
            return
        with self._lock:
            task = self._tasks[task_id]
            complete = task.total is not None and task.completed >= task.total
            now = _now()
            last = self._last_logged.get(task_id)
            if not task.visible or task_id in self._completed_logged and complete:
                return
            renamed = self._described.get(task_id) != task.description  # a task reused for the next item
            if last is not None and not complete and not renamed and now - last < self.log_every_s:
                return
            self._described[task_id] = task.description
            self._last_logged[task_id] = now
            if complete:
                self._completed_logged.add(task_id)
            else:
                self._completed_logged.discard(task_id)
            left = None if complete else task.time_remaining  # rich's estimate, as the terminal bar shows it
            parts = [f"{task.completed:,.0f}/{task.total:,.0f}" if task.total is not None
                     else f"{task.completed:,.0f}" if task.completed else "",
                     _plain(str(task.fields.get("label", ""))), f"{task.elapsed or 0.0:,.0f} s",
                     "" if left is None else f"about {_duration(left)} left"]
            line = f"{_plain(task.description)}: {' · '.join(p for p in parts if p)}"
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)


__all__ = ["LoggedProgress"]
