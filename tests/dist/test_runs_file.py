"""A runs file a user kept (issue 20, "Runs a user made"): a line that is not JSON (a `# comment`,
a torn last line) does not break `planner validate`: the run appends its one record and the
launcher finds it by run_id (on main it reported "torchrun exited with code 0", exited 1 and
appended a second, contradicting record)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.dist, pytest.mark.slow]

TINY = ["--model", "llama3-8b", "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads",
        "2", "--ffn", "64", "--vocab", "128", "--seq-len", "16", "--global-batch", "4",
        "--dp", "2", "--no-check", "--steps", "1", "--warmup", "0"]


def test_validate_appends_one_record_past_a_comment_and_a_torn_line(tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    kept = '# my runs, by hand\n{"ok": true, "run_id": "earlier"}\n{"ok": tr'
    runs.write_text(kept)  # the torn line has no newline: a writer killed mid-line
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "planner", "validate", *TINY, "--out", str(runs)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    text = runs.read_text()
    assert text.startswith(kept + "\n")  # nothing the user had is lost or rewritten
    new = [json.loads(line) for line in text[len(kept) + 1:].splitlines()]
    assert len(new) == 1 and new[0]["ok"] is True and new[0]["run_id"] != "earlier"
    assert "appended to" in out.stderr
