"""Progress of a long command (``verify``, ``cleanup``, ``run --once``), on a terminal only.

A bar drawn by ``rich`` on standard error while it is a terminal and the terminal shows more than errors (not
``--quiet``); in a pipe or a log nothing is drawn, so what a script or a log reads stays the command's own lines.
Lines a command prints while a bar is drawn go through :meth:`Progress.line`, above the bar."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

from streamoffload.cli_common import log_settings

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID


def progress_shown(stream: TextIO | None = None) -> bool:
    """Whether progress is drawn on ``stream`` (standard error): a terminal, and not ``--quiet``."""
    stream = stream or sys.stderr
    try:
        return stream.isatty() and not log_settings().quiet
    except (AttributeError, ValueError):  # closed, or not a real file
        return False


class Progress:
    """One or more counted tasks of a command: ``total`` items (``unit``) of the first one, named ``what``;
    :meth:`add_task` adds others (a topic-partition's bytes). A no-op off a terminal."""

    def __init__(self, what: str, total: float | None, unit: str = "", *, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.shown = progress_shown(self.stream)
        self._bar: RichProgress | None = None
        self._first: TaskID | None = None
        if self.shown:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress
            from rich.table import Column

            # One line per task however narrow the terminal: the names give way (cut short with …), never the figures.
            def fixed() -> Column:
                return Column(no_wrap=True)

            self._bar = RichProgress(
                TextColumn(  # names as the store gave them
                    "{task.description}",
                    markup=False,
                    table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1, min_width=12),
                ),
                BarColumn(bar_width=16, table_column=fixed()),
                MofNCompleteColumn(table_column=fixed()),
                TextColumn("{task.fields[unit]}", markup=False, table_column=fixed()),
                TaskProgressColumn(table_column=fixed()),
                TextColumn("{task.fields[note]}", markup=False, table_column=fixed()),
                TimeElapsedColumn(table_column=fixed()),
                _eta_column()(table_column=fixed()),
                expand=True,
                console=Console(file=self.stream, force_terminal=True),
                transient=False,
                redirect_stdout=False,  # a command's output stays on its standard output (a pipe, a file)
                redirect_stderr=False,
            )
            self._first = self.add_task(what, total, unit)

    def add_task(self, what: str, total: float | None, unit: str = "") -> TaskID | None:
        if self._bar is None:
            return None
        return self._bar.add_task(what, total=total, unit=unit, note="")

    def advance(self, amount: float = 1, task: TaskID | None = None, *, note: str | None = None) -> None:
        """Count ``amount`` more items of ``task`` (the first one by default); ``note``: a text shown after the
        count, such as ``"41.9 MB at 3.1 MB/s"``."""
        if self._bar is not None:
            self._bar.update(self._task(task), advance=amount)
            if note is not None:
                self._bar.update(self._task(task), note=note)

    def show(self, completed: float, task: TaskID | None = None, *, note: str | None = None) -> None:
        """Set ``task``'s count to ``completed`` (a figure read again from where the work reports it)."""
        if self._bar is not None:
            self._bar.update(self._task(task), completed=completed)
            if note is not None:
                self._bar.update(self._task(task), note=note)

    def set_total(self, total: float | None, task: TaskID | None = None) -> None:
        """Set ``task``'s total (one learnt while the work goes on)."""
        if self._bar is not None:
            self._bar.update(self._task(task), total=total)

    def extend(self, amount: float, task: TaskID | None = None) -> None:
        """Add ``amount`` to a task's total (one found as the work goes: the segments of the next topic-partition)."""
        if self._bar is not None:
            chosen = self._task(task)
            total = self._bar.tasks[chosen].total or 0
            self._bar.update(chosen, total=total + amount)

    def line(self, text: str) -> None:
        """Print ``text`` on standard output (above the bar when one is drawn there)."""
        if self._bar is not None and _same_terminal():
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text)

    def _task(self, task: TaskID | None) -> TaskID:
        chosen = self._first if task is None else task
        assert chosen is not None
        return chosen

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()


def _same_terminal() -> bool:
    """Whether standard output and standard error are the same terminal (then a line goes above the bar)."""
    import os

    try:
        return sys.stdout.isatty() and os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno()))
    except (AttributeError, OSError, ValueError):
        return False


def _eta_column() -> type:
    """rich's ``TimeRemainingColumn`` labelled ``ETA``, blank where a task has no total (nothing to estimate)."""
    from rich.progress import Task, TimeRemainingColumn
    from rich.text import Text

    class EtaColumn(TimeRemainingColumn):
        def render(self, task: Task) -> Text:
            if task.total is None:
                return Text("")
            return Text.assemble("ETA ", super().render(task))

    return EtaColumn
