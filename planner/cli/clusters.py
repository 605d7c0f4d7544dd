"""`planner clusters` (placeholder until its issue lands)."""

import typer

from planner.cli.app import app
from planner.errors import PlannerError


@app.command("clusters", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def clusters_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    raise PlannerError("'planner clusters' is not implemented yet")
