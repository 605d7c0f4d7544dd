"""`planner calibrate` (placeholder until its issue lands)."""

import typer

from planner.cli.app import app
from planner.errors import PlannerError


@app.command("calibrate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def calibrate_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    raise PlannerError("'planner calibrate' is not implemented yet")
