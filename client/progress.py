"""Progress of long command-line operations, on stderr only.

On a terminal: a rich progress bar (description, bar, done/total) that disappears
when the operation ends. Not a terminal (piped, a log file, a test): one plain line
per step, `<label>: <done>/<total> <item>`, so a log says how far it got. stdout is
never written here: the commands' tables and JSON stay machine-readable.

    with Progress("grow", total=len(queues)) as progress:
        for queue in queues:
            ...
            progress.advance(f"{vhost}/{name}")

`force_terminal` (tests) draws the bar even when stderr is not a terminal.
"""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, label: str, total: int, *, stream=None,
                 force_terminal: bool | None = None) -> None:
        self.label, self.total, self.done = label, total, 0
        self.stream = stream if stream is not None else sys.stderr
        terminal = force_terminal if force_terminal is not None else _isatty(self.stream)
        self._bar = None
        if terminal:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar,
                                       TextColumn)

            console = Console(file=self.stream, force_terminal=True)
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[item]}"),
                            console=console, transient=True)
            self._task = self._bar.add_task(label, total=total, item="")

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, item: str = "") -> None:
        """One step done; `item` names it (a queue, a section, a file)."""
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, item=item)
        else:
            self.stream.write(f"{self.label}: {self.done}/{self.total}"
                              + (f" {item}" if item else "") + "\n")
            self.stream.flush()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
