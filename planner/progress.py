"""Progress of long work: a rich bar on a terminal, nothing in --json or piped output.

    with progress("validating 3 plans", total=3) as bar:
        for plan in plans:
            bar.advance(description=f"plan {plan.layout}")

Work that runs in torchrun's worker processes reports its phases through a JSON-lines file
(`report_phase`, rank 0 only, the file named by $PLANNER_PROGRESS_FILE); the parent polls it
(`PhaseFile`) and moves its bar. Rich is imported only when a bar is shown.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# The file rank 0 of a torchrun job appends its phases to (set by the launcher).
PROGRESS_FILE_ENV = "PLANNER_PROGRESS_FILE"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def on_terminal() -> bool:
    """True when stderr (where the bars go) is a terminal."""
    return _isatty(sys.stderr)


class Bar:
    """One progress bar; every method is a no-op when the bar is hidden. `total` None: a
    spinner with the elapsed time."""

    def __init__(self, progress: Any = None, task: Any = None) -> None:
        self._progress, self._task = progress, task

    def advance(self, steps: float = 1, description: str | None = None) -> None:
        if self._progress is not None:
            kw = {"description": description} if description is not None else {}
            self._progress.update(self._task, advance=steps, **kw)

    def update(self, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        if self._progress is None:
            return
        kw: dict[str, Any] = {}
        if completed is not None:
            kw["completed"] = completed
        if total is not None:
            kw["total"] = total
        if description is not None:
            kw["description"] = description
        self._progress.update(self._task, **kw)


_active: Any = None  # the rich Progress on screen; nested bars become its tasks
_hidden = 0  # inside hidden(): no bar (--json output)


@contextmanager
def hidden() -> Iterator[None]:
    """No bar inside the block, whatever the terminal (a command's --json output)."""
    global _hidden
    _hidden += 1
    try:
        yield
    finally:
        _hidden -= 1


@contextmanager
def progress(description: str, total: float | None = None, *,
             enabled: bool | None = None) -> Iterator[Bar]:
    """A rich progress bar on stderr for the block (removed when it ends). `enabled` None: shown
    only when stderr is a terminal; pass False for --json output. A bar opened inside another's
    block is shown under it."""
    global _active
    if enabled is None:
        enabled = not _hidden and on_terminal()
    if not enabled:
        yield Bar()
        return
    if _active is not None:
        task = _active.add_task(description, total=total)
        try:
            yield Bar(_active, task)
        finally:
            _active.remove_task(task)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn()]
    # prints to stdout go above the bar only when stdout is this terminal too (rich would
    # otherwise carry a piped stdout over to stderr)
    to_terminal = _isatty(sys.stdout)
    with Progress(*columns, console=Console(stderr=True), transient=True,
                  redirect_stdout=to_terminal, redirect_stderr=True) as prog:
        _active = prog
        try:
            yield Bar(prog, prog.add_task(description, total=total))
        finally:
            _active = None


def track(items: Iterable[T], description: str, total: int | None = None, *,
          enabled: bool | None = None) -> Iterator[T]:
    """Iterate `items` with a bar that advances once per item (for a loop run to its end; a
    loop that may break early holds a `progress` block instead, so its bar closes with it)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(description, total, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.advance()


_last_report = 0.0
REPORT_EVERY_S = 0.2  # phases closer together than this are not written (the bar polls at 4 Hz)


def report_phase(done: int, total: int, description: str, force: bool = False) -> None:
    """Worker side: append `{done, total, phase, time}` to $PLANNER_PROGRESS_FILE (no-op when
    unset), at most every REPORT_EVERY_S unless `force` or the last unit. One short line in one
    write, so the parent never reads half of one for long."""
    global _last_report
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return
    now = time.monotonic()
    if not force and done < total and now - _last_report < REPORT_EVERY_S:
        return
    _last_report = now
    line = json.dumps({"done": done, "total": total, "phase": description,
                       "time": round(time.time(), 3)})
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError:  # progress is never worth failing a run for
        pass


class PhaseFile:
    """Parent side: the latest complete phase line of a progress file, read on each poll."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._buffer = ""
        self.phases: list[dict[str, Any]] = []

    def poll(self) -> dict[str, Any] | None:
        """The newest phase written since the last poll (None when nothing new)."""
        try:
            with open(self.path) as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except OSError:
            return None
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split("\n")
        newest = None
        for line in lines:
            try:
                newest = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.phases.append(newest)
        return newest

    def follow(self, bar: Bar) -> None:
        """Move `bar` to the newest phase, if any."""
        phase = self.poll()
        if phase is not None:
            bar.update(completed=phase.get("done"), total=phase.get("total"),
                       description=phase.get("phase"))
