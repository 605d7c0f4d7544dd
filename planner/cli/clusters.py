"""`planner clusters`: the built-in GPU profiles, the names that resolve to them, and the
cluster grammar that --cluster accepts.

    planner clusters
    planner clusters --json | jq '.profiles[] | select(.name == "H100-SXM") | .usable_memory_gib'
"""

from __future__ import annotations

import json

import typer

from planner.cli.options import JsonOpt
from planner.cli.typer_app import app


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@app.command("clusters")
def clusters_cmd(as_json: JsonOpt = False) -> None:
    """List the built-in GPU profiles (dense peaks, HBM, usable memory after the runtime reserve,
    node shape, fabrics, NIC) and the --cluster grammar. --json prints
    {"profiles": [...], "grammar": "..."}."""
    from planner.registry import CLUSTER_GRAMMAR_HELP, builtin_gpus

    rows = [gpu.summary() for gpu in builtin_gpus().values()]
    if as_json:
        typer.echo(json.dumps({"profiles": rows, "grammar": CLUSTER_GRAMMAR_HELP}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    headers = ("name", "aliases", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GiB", "usable GiB",
               "HBM TB/s", "GPUs/node", "NVLink domain", "fabric", "NIC Gbit/s")
    cells = [
        (str(r["name"]), ", ".join(r["aliases"]), _num(r["peak_bf16_tflops"]),
         _num(r["peak_fp8_tflops"]), _num(r["memory_gib"]), f"{r['usable_memory_gib']:.1f}",
         _num(r["hbm_tb_per_s"]), str(r["gpus_per_node"]), str(r["domain_gpus"]),
         str(r["intra_node_fabric"]), _num(r["nic_gbit_per_s"]))
        for r in rows
    ]
    table = Table(title="Built-in GPU profiles (--cluster NxNAME or NxALIAS)")
    for i, header in enumerate(headers):
        if header == "aliases":  # the only column that wraps when the terminal is narrow
            table.add_column(header, ratio=1, min_width=12, overflow="fold")
            continue
        width = max(len(header), *(len(c[i]) for c in cells))
        table.add_column(header, justify="left" if i in (0, 9) else "right", no_wrap=True,
                         min_width=width)
    for c in cells:
        table.add_row(*c)
    console = Console()
    needed = Console(width=1000).measure(table).minimum  # never crop a number
    if needed > console.width:
        console = Console(width=needed)
    console.print(table)
    console.print("\n--cluster grammar:", style="bold")
    console.print(CLUSTER_GRAMMAR_HELP, markup=False, highlight=False)
