"""`planner models` (placeholder until its issue lands)."""

import typer

from planner.cli.app import app
from planner.errors import PlannerError


@app.command("models", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def models_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    raise PlannerError("'planner models' is not implemented yet")
