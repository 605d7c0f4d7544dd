"""`planner models`: the built-in model specs and the names that resolve to them.

    planner models
    planner models --json | jq '.[] | select(.name == "llama2-70b")'
"""

from __future__ import annotations

import json

import typer

from planner.cli.options import JsonOpt
from planner.cli.typer_app import app


@app.command("models")
def models_cmd(as_json: JsonOpt = False) -> None:
    """List the built-in models: size (billions of parameters, embeddings included; active per
    token for MoE), shape and default job. --model also takes a spec YAML or an HF config.json."""
    from planner.registry import builtin_models

    rows = [spec.summary() for spec in builtin_models().values()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    headers = ("name", "aliases", "params B", "active B", "layers", "hidden", "heads",
               "kv_heads", "ffn", "vocab", "seq_len")
    cells = []
    for row in rows:
        moe = row["num_experts"]
        ffn = f"{row['ffn_hidden']}" + (f" {moe}x{row['expert_ffn_hidden']}" if moe else "")
        cells.append((
            str(row["name"]), ", ".join(row["aliases"]), f"{row['params_b']:.2f}",
            f"{row['active_params_b']:.2f}", str(row["layers"]), str(row["hidden"]),
            str(row["heads"]), str(row["kv_heads"]), ffn, str(row["vocab"]), str(row["seq_len"]),
        ))
    table = Table(title="Built-in models (--model NAME or ALIAS)")
    for i, header in enumerate(headers):
        if header == "aliases":  # the only column that wraps when the terminal is narrow
            table.add_column(header, ratio=1, min_width=12, overflow="fold")
            continue
        width = max(len(header), *(len(c[i]) for c in cells))
        table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True,
                         min_width=width)
    for c in cells:
        table.add_row(*c)
    console = Console()
    # Never crop a number: widen past a narrow terminal (or a pipe's 80 columns) if needed.
    needed = Console(width=1000).measure(table).minimum
    if needed > console.width:
        console = Console(width=needed)
    console.print(table)
