"""Signals as exceptions, ending a process tree that spans sessions, whole-line appends, and the
progress file between torchrun's rank 0 and the launcher (no torch, no torchrun here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from planner import progress as progress_mod
from planner.interrupts import Interrupted, deferred, raise_on_signals
from planner.io import append_jsonl, read_jsonl
from planner.progress import PhaseFile, hidden, progress, report_phase
from planner.validate.launch import _alive, _failure_reason, end_process_tree, process_tree


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                       (signal.SIGHUP, 129)])
def test_signal_raises_interrupted_and_handlers_come_back(sig: int, code: int) -> None:
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as info, raise_on_signals():
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler runs at the next bytecode: never reached
    assert info.value.exit_code == code == 128 + sig
    assert str(info.value) == info.value.reason == f"interrupted by {signal.Signals(sig).name}"
    assert signal.getsignal(sig) is before


def test_a_signal_while_deferred_waits_for_the_block_end_and_later_ones_are_ignored() -> None:
    reached = []
    with pytest.raises(Interrupted) as info, raise_on_signals():
        with deferred():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            reached.append("end of the deferred block")
        reached.append("after it")  # not reached: raised as the block ended
    assert reached == ["end of the deferred block"] and info.value.signum == signal.SIGHUP
    # during the cleanup of the first signal a second one changes nothing
    with pytest.raises(Interrupted), raise_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            reached.append("cleanup ran to its end")
    assert reached[-1] == "cleanup ran to its end"


# A parent that starts a child in a session of its own (as torchrun starts its workers) and
# prints the child's pid; both sleep. With IGNORE, both ignore SIGTERM.
TREE = """
import os, signal, subprocess, sys, time
if "IGNORE" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\\n"
    "if 'IGNORE' in sys.argv: signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "print('ready', flush=True)\\n"
    "time.sleep(600)", *sys.argv[1:]], start_new_session=True, stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("ignore", [False, True])
def test_end_process_tree_reaches_workers_in_other_sessions(ignore: bool) -> None:
    args = ["IGNORE"] if ignore else []
    root = subprocess.Popen([sys.executable, "-c", TREE, *args], stdout=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ,
                                                                    "PLANNER_RUN_TAG": "t1"})
    child = int(root.stdout.readline())
    assert os.getsid(child) == child != os.getsid(root.pid)  # its own session
    assert {root.pid, child} <= process_tree(root.pid, "t1")
    t0 = time.monotonic()
    end_process_tree(root.pid, "t1", grace_s=0.5)
    root.wait(timeout=5)
    root.stdout.close()
    assert not _alive(child) and not _alive(root.pid)
    if ignore:  # SIGTERM ignored: SIGKILL after the grace period
        assert root.returncode == -signal.SIGKILL and time.monotonic() - t0 >= 0.5
    else:
        assert root.returncode == -signal.SIGTERM


def test_append_keeps_earlier_lines_and_closes_a_torn_one(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text('{"a": 1}\n{"b": 2, "cut off by a kil')  # a writer killed mid-line
    append_jsonl(path, {"ok": False, "error": "interrupted by SIGTERM"})
    lines = path.read_text().splitlines()
    assert lines[:2] == ['{"a": 1}', '{"b": 2, "cut off by a kil']
    assert json.loads(lines[2]) == {"ok": False, "error": "interrupted by SIGTERM"}
    append_jsonl(path, {"c": 3})
    assert json.loads(path.read_text().splitlines()[3]) == {"c": 3}
    fresh = tmp_path / "new" / "runs.jsonl"
    append_jsonl(fresh, {"d": 4})
    assert read_jsonl(fresh) == [{"d": 4}]


def test_phase_file_reads_whole_lines_only(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("PLANNER_PROGRESS_FILE", str(path))
    monkeypatch.setattr(progress_mod, "_last_report", 0.0)
    phases = PhaseFile(path)
    assert phases.poll() is None  # no file yet
    report_phase(1, 4, "step 1/4", force=True)
    report_phase(2, 4, "step 2/4")  # within REPORT_EVERY_S of the last: not written
    with open(path, "a") as f:
        f.write('{"done": 3, "total": 4, "pha')  # half a line, as a reader may see it
    assert phases.poll()["phase"] == "step 1/4"
    with open(path, "a") as f:
        f.write('se": "step 3/4"}\n')
    assert phases.poll() == {"done": 3, "total": 4, "phase": "step 3/4"}
    assert phases.poll() is None
    report_phase(4, 4, "done")  # the last unit is always written
    assert phases.poll()["done"] == 4 and len(phases.phases) == 3


def test_bars_are_hidden_off_a_terminal_and_in_json_output() -> None:
    with progress("x", 3) as bar:  # pytest captures stderr: not a terminal
        assert bar._progress is None
        bar.advance()
        bar.update(completed=2, description="y")
    with hidden(), progress("x", 3, enabled=None) as bar:
        assert bar._progress is None
    with progress("x", 3, enabled=True) as bar:  # forced: a real rich bar
        assert bar._progress is not None
        with progress("inner", 2, enabled=True) as inner:  # nested: a task of the same bar
            assert inner._progress is bar._progress
            assert len(bar._progress.tasks) == 2
        assert len(bar._progress.tasks) == 1


def _launch(run_dir: Path, nnodes: int = 1) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(run_dir=run_dir), nnodes=nnodes)


def test_a_rank_killed_by_a_signal_is_the_root_cause(tmp_path: Path) -> None:
    log = tmp_path / "torchrun.log"
    # rank 0 saw its peer vanish and wrote an error; rank 1 was SIGKILLed (torch.distributed
    # .elastic's agent line, torch 2.13)
    (tmp_path / "error-rank0.txt").write_text("RuntimeError: Connection closed by peer\n")
    log.write_text("E1124 ... failed (exitcode: 1) local_rank: 0 (pid: 11) of binary: py\n"
                   "E1124 ... failed (exitcode: -9) local_rank: 1 (pid: 12) of binary: py\n")
    reason = _failure_reason(_launch(tmp_path), 1, None, log)
    assert reason.startswith("rank 1 was killed by SIGKILL (out of host memory?)")
    assert _failure_reason(_launch(tmp_path, nnodes=2), 1, None, log).startswith(
        "local rank 1 of this node was killed by SIGKILL")
    log.write_text("E1124 ... failed (exitcode: 1) local_rank: 0 (pid: 11) of binary: py\n")
    assert _failure_reason(_launch(tmp_path), 1, None, log) == (
        "rank 0: RuntimeError: Connection closed by peer")
    assert _failure_reason(_launch(tmp_path), None, 10.0, log).startswith("timed out after 10 s")


def test_without_a_gpu_driver_the_launcher_does_not_import_torch() -> None:
    from planner.validate.launch import _no_gpu_driver

    code = ("import sys; from planner.validate.launch import local_backend, local_gpu_count, "
            "local_profile; print(local_gpu_count(), local_backend(), local_profile(), "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    if _no_gpu_driver():
        assert out == ["0", "gloo", "None", "False"]
    else:  # a GPU machine: torch answers
        assert out[3] == "True"


def test_a_missing_torch_is_one_clear_error(monkeypatch) -> None:
    import importlib.util

    from planner.errors import SpecError
    from planner.validate.launch import require_torch

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(SpecError, match=r"torch is not installed: pip install"):
        require_torch()


def test_a_signal_while_torchrun_starts_still_ends_it(tmp_path: Path, monkeypatch) -> None:
    """SIGTERM lands inside Popen (before the launcher holds the handle): it is raised once
    the handle is held, and the process started is ended like any other."""
    from planner.validate import launch

    started = []
    real_popen = subprocess.Popen

    def popen_signalled_midway(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler has run (deferred) before the process exists
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(launch.subprocess, "Popen", popen_signalled_midway)
    cmd = [sys.executable, "-c", "import time; time.sleep(600)"]
    with pytest.raises(Interrupted, match="interrupted by SIGTERM"):
        launch.run_torchrun(cmd, {}, tmp_path / "log", timeout_s=60)
    [proc] = started
    assert proc.returncode == -signal.SIGTERM and not _alive(proc.pid)
