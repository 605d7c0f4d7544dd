"""planner command line.

    planner solve --model llama70b --cluster 128xA100
    planner estimate --model llama3-70b --cluster 64xH100 --tp 8 --pp 4 --zero 1
    planner models --json
    planner clusters
    planner validate --model llama2-7b --tp 2 --pp 1 --dp 2 --steps 5 --out runs.jsonl
    planner calibrate --runs runs.jsonl --profile H100 --out h100-fitted.yaml

Each command lives in its own module and only parses, calls the library and formats. Errors a
user causes (planner.errors.PlannerError) are printed as one line on stderr with exit code 2
(1 for an infeasible solve).
"""

from __future__ import annotations

import sys

from planner.cli import calibrate, clusters, estimate, models, profile, solve, validate  # noqa: F401 (registers)
from planner.cli.app import app
from planner.errors import PlannerError


def main() -> None:
    """Console-script entry point. typer runs in standalone mode (usage errors exit 2 with its
    own message, typer.Exit codes pass through); our own PlannerError becomes one line."""
    try:
        app()
    except PlannerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        for line in getattr(exc, "diagnosis", []):
            print(f"  {line}", file=sys.stderr)
        sys.exit(exc.exit_code)


__all__ = ["app", "main"]
