"""`planner estimate` (placeholder until its issue lands)."""

import typer

from planner.cli.app import app
from planner.errors import PlannerError


@app.command("estimate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def estimate_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    raise PlannerError("'planner estimate' is not implemented yet")
