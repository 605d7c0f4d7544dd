"""Run the planner CLI in this process (planner.cli.main, the console script) and capture what
it prints: the real parser, callbacks and error path, without a subprocess per call."""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass

from planner.cli import main


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def invoke(*args: str) -> Result:
    """planner ARGS in-process: main() with sys.argv set; its SystemExit is the exit code."""
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["planner", *(str(a) for a in args)]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return Result(code, out.getvalue(), err.getvalue())


def assert_one_line_exit_2(result: Result, *fragments: str) -> str:
    """Exit 2, no traceback, exactly one stderr line `error: ...` holding every fragment."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == 2, (result.code, result.stderr)
    lines = result.error_lines
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
