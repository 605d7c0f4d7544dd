"""The typer application object that every command module registers on."""

import typer

app = typer.Typer(
    name="planner",
    help="3D-parallelism planner for LLM training: ranked, memory-safe layouts with predicted "
    "step time, and the tools to check them (validate, profile, calibrate). Piped output is "
    "drawn 160 columns wide: set COLUMNS (e.g. COLUMNS=220) to widen help and tables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """Keeps `planner COMMAND` a group when main() has registered only the command being run
    (typer runs a lone command without its name otherwise)."""
