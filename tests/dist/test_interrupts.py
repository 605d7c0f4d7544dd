"""Interrupts leave nothing behind and lose nothing (issue 15, section 2): real `planner`
processes under torchrun (a tiny model, 2 gloo ranks), a signal sent from here the way a
scheduler (SIGTERM), Ctrl-C (SIGINT) or a closed terminal (SIGHUP) sends it, to the planner
process only; then the exit code, the records and the process table are checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.dist, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EARLIER = {"earlier": "record", "ok": True}
TINY = ["--model", "llama3-8b", "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads",
        "2", "--ffn", "64", "--vocab", "128", "--seq-len", "16", "--global-batch", "4",
        "--dp", "2", "--no-check"]


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    """`planner ARGS` in tmp_path (temporary files under it too), output captured."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-m", "planner", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ours(tmp_path: Path) -> list[tuple[int, str, dict[str, str]]]:
    """Live processes (not zombies) whose command line or environment names tmp_path:
    torchrun and its workers. (pid, command line, environment)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (proc / "stat").read_text()
            environ = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] in "ZX":
            continue
        env = dict(kv.split("=", 1) for kv in environ.split("\0") if "=" in kv)
        if str(tmp_path) in cmdline or env.get("TMPDIR") == str(tmp_path):
            out.append((int(proc.name), cmdline, env))
    return out


def _workers(tmp_path: Path) -> dict[int, int]:
    """rank -> pid of the torchrun workers running now."""
    return {int(env["RANK"]): pid for pid, cmd, env in _ours(tmp_path)
            if "RANK" in env and "torch.distributed.run" not in cmd}


def _wait(what, timeout: float = 120.0, proc: subprocess.Popen | None = None):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"planner ended first ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)
    pytest.fail("timed out waiting")


def _phase(tmp_path: Path, needle: str) -> bool:
    """A progress line with `needle` was written by rank 0 (the run is past its start)."""
    for path in tmp_path.rglob("progress.jsonl"):
        if needle in path.read_text(errors="replace"):
            return True
    return False


def _finish(proc: subprocess.Popen, tmp_path: Path) -> tuple[int, str]:
    """Exit code and stderr; nothing of the run may be alive once planner has exited."""
    _out, err = proc.communicate(timeout=60)
    assert _ours(tmp_path) == [], "processes left behind"
    return proc.returncode, err


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("sig, when", [(signal.SIGTERM, "mid-step"),
                                       (signal.SIGINT, "at start"),
                                       (signal.SIGHUP, "mid-step")],
                         ids=["SIGTERM-mid-step", "SIGINT-at-start", "SIGHUP-mid-step"])
def test_validate_signal_ends_torchrun_and_records_why(tmp_path: Path, sig: int, when: str
                                                       ) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(EARLIER) + "\n")
    proc = _start(tmp_path, "validate", *TINY, "--steps", "100000", "--warmup", "0",
                  "--out", str(runs))
    if when == "mid-step":
        _wait(lambda: _phase(tmp_path, ": step "), proc=proc)
    else:  # the workers exist, still importing torch or joining the process group
        _wait(lambda: len(_workers(tmp_path)) == 2, proc=proc)
    os.kill(proc.pid, sig)
    rc, err = _finish(proc, tmp_path)
    name = signal.Signals(sig).name
    assert rc == 128 + sig
    assert err.strip().splitlines()[-1].startswith(f"error: interrupted by {name}; torchrun")
    records = _records(runs)
    assert records[0] == EARLIER and len(records) == 2  # every earlier record kept
    assert records[1]["ok"] is False and records[1]["error"] == f"interrupted by {name}"
    assert records[1]["measured_step_time_s"] is None and records[1]["world_size"] == 2


def test_sigkill_of_one_rank_mid_step_names_the_rank(tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    proc = _start(tmp_path, "validate", *TINY, "--steps", "100000", "--warmup", "0",
                  "--out", str(runs))
    _wait(lambda: _phase(tmp_path, ": step "), proc=proc)
    os.kill(_workers(tmp_path)[1], signal.SIGKILL)
    rc, err = _finish(proc, tmp_path)
    assert rc == 1
    [record] = _records(runs)
    assert record["ok"] is False
    assert record["error"].startswith("rank 1 was killed by SIGKILL"), record["error"]
    assert "run failed: rank 1 was killed by SIGKILL" in err


def test_profile_signal_ends_torchrun_and_keeps_the_old_profile(tmp_path: Path) -> None:
    out = tmp_path / "cpu.yaml"
    out.write_text("# a profile measured earlier\n")
    proc = _start(tmp_path, "profile", "--out", str(out), "--nproc", "2", "--quick")
    _wait(lambda: _phase(tmp_path, "GEMM"), proc=proc)
    os.kill(proc.pid, signal.SIGTERM)
    rc, err = _finish(proc, tmp_path)
    assert rc == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1] == (
        f"error: interrupted by SIGTERM; torchrun and its workers ended; {out} not written")
    assert out.read_text() == "# a profile measured earlier\n"
    assert not list(tmp_path.glob("planner-profile-*"))  # its temporary folder is gone too


def test_solve_calibrate_signal_records_the_run_in_flight(tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(EARLIER) + "\n")
    proc = _start(tmp_path, "solve", "--model", str(ROOT / "examples/tiny-llama.yaml"),
                  "--cluster", f"1x2x{ROOT / 'validate/measured/cpu-gloo-2proc.yaml'}",
                  "--calibrate", "2", "--runs", str(runs))
    _wait(lambda: len(_workers(tmp_path)) == 2, proc=proc)
    os.kill(proc.pid, signal.SIGTERM)
    rc, err = _finish(proc, tmp_path)
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    records = _records(runs)
    assert records[0] == EARLIER and len(records) == 2
    assert records[1]["ok"] is False and records[1]["error"] == "interrupted by SIGTERM"


@pytest.mark.parametrize("when", ["mid-step", "at start"])
def test_sigkill_of_the_planner_ends_torchrun_and_its_workers(tmp_path: Path, when: str) -> None:
    """SIGKILL runs no cleanup in the planner: torchrun dies by its parent-death signal, the
    workers (torchrun's children, in sessions of their own) by their watchdog on the planner's
    pid. Nothing of the run may be alive a few seconds later (a run left alone takes minutes:
    100000 steps)."""
    runs = tmp_path / "runs.jsonl"
    proc = _start(tmp_path, "validate", *TINY, "--steps", "100000", "--warmup", "0",
                  "--out", str(runs))
    if when == "mid-step":
        _wait(lambda: _phase(tmp_path, ": step "), proc=proc)
    else:
        _wait(lambda: len(_workers(tmp_path)) == 2, proc=proc)
    assert any("torch.distributed.run" in cmd for _, cmd, _ in _ours(tmp_path))
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 20  # the watchdog looks every 0.5 s; gloo teardown is quick
    while _ours(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ours(tmp_path) == [], "torchrun or a worker outlived the planner"
