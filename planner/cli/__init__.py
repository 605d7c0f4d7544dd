"""planner command line.

    planner solve --model llama70b --cluster 128xA100
    planner estimate --model llama3-70b --cluster 64xH100 --tp 8 --pp 4 --zero 1
    planner models --json
    planner clusters
    planner stacks --json
    planner validate --model llama2-7b --tp 2 --pp 1 --dp 2 --steps 5 --out runs.jsonl
    planner calibrate --runs runs.jsonl --profile H100 --out h100-fitted.yaml
    planner explain --model llama70b --cluster 128xA100 --rank 1
    planner report --html plans.html --model llama70b --cluster 128xA100

Each command lives in its own module and only parses, calls the library and formats. Errors a
user causes (planner.errors.PlannerError, and the parser's usage errors) are printed as one line
on stderr with exit code 2 (1 for an infeasible solve). A command that runs torchrun ends its
processes on SIGTERM, SIGINT or SIGHUP and exits 128 + the signal with one line.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from planner.errors import PlannerError
from planner.interrupts import Interrupted

# Command name -> the module that registers it on the typer app (planner.cli.typer_app). main()
# imports only the module of the command being run, so `planner solve` never pays for the
# imports of calibrate, validate or profile.
COMMANDS = {
    "solve": "planner.cli.solve",
    "estimate": "planner.cli.estimate",
    "models": "planner.cli.models",
    "clusters": "planner.cli.clusters",
    "validate": "planner.cli.validate",
    "profile": "planner.cli.profile",
    "calibrate": "planner.cli.calibrate",
    "explain": "planner.cli.explain",
    "report": "planner.cli.explain",
    "export": "planner.cli.export",
    "stacks": "planner.cli.stacks",
}


def register(argv: list[str] | None = None) -> Any:
    """Register the command named by argv[1] (every command when argv names none, e.g. --help)
    and return the typer app."""
    name = argv[1] if argv and len(argv) > 1 else None
    for module in [COMMANDS[name]] if name in COMMANDS else COMMANDS.values():
        importlib.import_module(module)
    from planner.cli.typer_app import app

    return app


def __getattr__(name: str) -> Any:
    """`from planner.cli import app`: the app with every command registered."""
    if name == "app":
        return register()
    raise AttributeError(f"module 'planner.cli' has no attribute {name!r}")


# Columns of help and tables when stdout is not a terminal (a pipe, a file): rich falls back to
# 80, which cuts option names and values in --help ("NODESxPERNODExGP…"). COLUMNS, when set,
# wins (the README says how to widen or narrow the output).
PIPED_WIDTH = 160


def piped_width() -> bool:
    """Draw help and tables PIPED_WIDTH columns wide when stdout is not a terminal and the
    user set no COLUMNS (rich and typer read COLUMNS for their console width). True when it
    set COLUMNS (main() removes it again: an in-process caller keeps its environment)."""
    import os

    if "COLUMNS" not in os.environ and not sys.stdout.isatty():
        os.environ["COLUMNS"] = str(PIPED_WIDTH)
        return True
    return False


def main() -> None:
    """Console-script entry point: exit with run()'s code (help and tables PIPED_WIDTH wide
    when stdout is not a terminal)."""
    import os

    added = piped_width()
    try:
        code = run()
    finally:
        if added:
            os.environ.pop("COLUMNS", None)
    sys.exit(code)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` (default sys.argv[1:]) and return its exit code: 0 ok, 1 nothing
    fits or a run failed, 2 bad input. Every bad input, ours (PlannerError) or the parser's
    (typer/click usage errors: an unknown option, a value out of range, a missing value), is one
    `error: ...` line on stderr; --help and a bare `planner` print the help (exit 0)."""
    from typer.exceptions import TyperException

    args = sys.argv[1:] if argv is None else list(argv)
    app = register(["planner", *args])
    try:
        result = app(args=args, prog_name="planner", standalone_mode=False)
    except Interrupted as exc:  # SIGTERM, SIGINT, SIGHUP in validate, profile, solve --calibrate
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except PlannerError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        for line in getattr(exc, "diagnosis", []):
            print(f"  {line}", file=sys.stderr)
        return exc.exit_code
    except TyperException as exc:  # click's UsageError / BadParameter / NoSuchOption, Abort
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `planner` or a bare group
            print(exc.format_message())
            return 0
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = exc.format_message() if hasattr(exc, "format_message") else "aborted"
        print(f"error: {one_line(message)}{hint}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except BrokenPipeError:  # `planner models | head`: the reader left; say nothing more
        sys.stdout = None  # type: ignore[assignment] - no flush at exit into the closed pipe
        return 1
    return result if isinstance(result, int) else 0


def one_line(text: str) -> str:
    """`text` with its line breaks and runs of blanks folded to single spaces."""
    return " ".join(text.split())


__all__ = ["app", "main", "one_line", "run"]
