"""Help and tables piped to a file or a pipe (stdout not a terminal) use the full width, not
rich's 80-column fallback; COLUMNS, when the user sets it, wins (issue 20)."""

from __future__ import annotations

import os
import subprocess
import sys

from planner.cli import PIPED_WIDTH


def _piped(*args: str, columns: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    if columns is not None:
        env["COLUMNS"] = columns
    res = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_help_is_not_cut_when_piped() -> None:
    out = _piped("solve", "--help")
    assert "NODESxPERNODExGPU" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) == PIPED_WIDTH
    assert "COLUMNS" in _piped("--help")  # the top-level help says how to widen


def test_columns_set_by_the_user_wins() -> None:
    out = _piped("solve", "--help", columns="100")
    assert max(len(line) for line in out.splitlines()) == 100


def test_estimate_table_is_drawn_wide_when_piped() -> None:
    out = _piped("estimate", "-m", "llama2-7b", "-c", "8xH100", "--tp", "2", "--pp", "1")
    assert "…" not in out
    assert "device shows (nvidia-smi: + allocator cache, CUDA context, NCCL)" in out
