"""`python -m planner`: the CLI. From a source checkout whose dependencies are not installed in
this interpreter, it hands over to the checkout's own `.venv` (made by the README quick start)
if there is one, and otherwise says in one line how to install (exit 2)."""

import os
import sys
from importlib.util import find_spec
from pathlib import Path

REQUIRED = ("typer", "rich", "pydantic", "yaml", "numpy", "ortools")


def _ensure_dependencies() -> None:
    missing = [name for name in REQUIRED if find_spec(name) is None]
    if not missing:
        return
    venv_python = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python"
    if venv_python.is_file() and Path(sys.prefix).resolve() != venv_python.parent.parent.resolve():
        os.execv(str(venv_python), [str(venv_python), "-m", "planner", *sys.argv[1:]])
    print(f"error: planner's dependencies are not installed in {sys.executable} (missing: "
          f"{', '.join(missing)}); run `pip install -e .` in a virtualenv (README, Quick start)",
          file=sys.stderr)
    sys.exit(2)


_ensure_dependencies()

from planner.cli import main  # noqa: E402

main()
