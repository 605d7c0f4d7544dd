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

import os
import signal
import sys
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


# ---- children that do not outlive the planner -------------------------------------------------
# torchrun is the planner's child; its workers are grandchildren in sessions of their own, so a
# SIGKILL of the planner (which runs no cleanup) reaches neither unless each is tied to it:
# torchrun by the kernel's parent-death signal, each worker by a watchdog thread that watches
# the planner's pid (named in this environment variable as PID:START_TIME).
PARENT_ENV = "PLANNER_PARENT_PROCESS"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_S = 0.5  # how often a worker looks for the planner


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None when
    it is gone or a zombie (or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def parent_env() -> dict[str, str]:
    """The environment entry that names this process to the workers' watchdog."""
    return {PARENT_ENV: f"{os.getpid()}:{_start_time(os.getpid()) or ''}"}


def die_with_parent_preexec() -> Any:
    """A Popen preexec_fn (run in the child between fork and exec) that asks the kernel for
    SIGKILL when the parent dies (prctl(2) PR_SET_PDEATHSIG, Linux; a no-op elsewhere), and
    exits at once if the parent died before that call."""
    parent = os.getpid()

    def preexec() -> None:
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # not Linux
            return
        if os.getppid() != parent:  # the parent was gone before the signal was armed
            os._exit(1)

    return preexec


def exit_with_launcher() -> None:
    """In a torchrun worker: a daemon thread that ends this process when the planner that
    launched it (PARENT_ENV) is gone, e.g. killed by SIGKILL. A no-op when not launched by the
    planner (a run started by hand) or outside Linux."""
    value = os.environ.get(PARENT_ENV, "")
    pid_text, _, started = value.partition(":")
    if not pid_text.isdigit() or not started:
        return

    def watch() -> None:
        import time

        while _start_time(int(pid_text)) == started:
            time.sleep(WATCH_S)
        print(f"planner process {pid_text} is gone; this worker ends", file=sys.stderr,
              flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="planner-watchdog", daemon=True).start()
