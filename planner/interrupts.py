"""SIGTERM (a scheduler: SLURM, Kubernetes), SIGINT (Ctrl-C) and SIGHUP (a closed terminal) as
an exception, so the commands that start torchrun can end its processes and record the run.

    with raise_on_signals():
        ...                       # a signal raises Interrupted here
        with deferred():
            proc = Popen(...)     # ... but not here: it waits until the block ends

While an Interrupted unwinds (the first signal), further signals are ignored so the cleanup
(ending the process tree, appending the record) runs to its end; it is bounded in time. The CLI
turns Interrupted into one line and exit code 128 + signal, as a shell reports a process
killed by that signal.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# (SIGHUP does not exist on Windows)
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP")
                if hasattr(signal, name))


class Interrupted(BaseException):
    """A termination signal arrived. A BaseException (like KeyboardInterrupt), so that no
    `except Exception` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.signal_name = signal.Signals(signum).name
        self.note = ""  # what the cleanup did, for the user's one line
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        """'interrupted by SIGTERM': the `error` of the run record."""
        return f"interrupted by {self.signal_name}"

    def __str__(self) -> str:
        return self.reason + (f"; {self.note}" if self.note else "")

    @property
    def exit_code(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP)."""
        return 128 + self.signum


class _State:
    depth = 0            # nesting of raise_on_signals
    deferring = 0        # nesting of deferred
    pending: int | None = None
    raised: int | None = None  # the signal being handled; later ones are ignored
    previous: dict[int, Any] = {}


def _handler(signum: int, _frame: Any) -> None:
    if _State.raised is not None:
        return
    if _State.deferring:
        _State.pending = _State.pending or signum
        return
    _State.raised = signum
    raise Interrupted(signum)


@contextmanager
def raise_on_signals() -> Iterator[None]:
    """Turn SIGTERM, SIGINT and SIGHUP into Interrupted inside the block (re-entrant; a no-op
    outside the main thread, where Python cannot set handlers). The previous handlers come back
    when the outermost block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _State.depth == 0:
        _State.previous = {s: signal.signal(s, _handler) for s in SIGNALS}
        _State.pending = _State.raised = None
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if _State.depth == 0:
            for s, old in _State.previous.items():
                signal.signal(s, old)
            _State.previous, _State.pending, _State.raised = {}, None, None


@contextmanager
def deferred() -> Iterator[None]:
    """A signal inside the block is raised when the block ends (e.g. between starting a process
    and holding its handle, so the process is never left unknown)."""
    _State.deferring += 1
    try:
        yield
    finally:
        _State.deferring -= 1
    if not _State.deferring and _State.pending is not None and _State.raised is None:
        signum, _State.pending = _State.pending, None
        _State.raised = signum
        raise Interrupted(signum)
