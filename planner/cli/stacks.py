"""`planner stacks`: the software-stack presets, their recipe, factors and provenance.

    planner stacks
    planner stacks --json | jq '.[] | select(.name == "nemo") | .provenance.out_of_sample'

`--stack TEXT` on solve, estimate, validate and calibrate takes a preset name, an alias or a
framework description ("NeMo 24.07 (Megatron-Core)", "DeepSpeed ZeRO-3"); the same rules read the
`stack` (else `framework`) column of a runs table.
"""

from __future__ import annotations

import json

import typer

from planner.cli.options import JsonOpt
from planner.cli.typer_app import app


def _err(stats) -> str:
    return "-" if stats is None else f"{100 * stats.median:.1f}% / {100 * stats.p90:.1f}%"


def _only(factors) -> str:
    """' (fp8 only)' or ' (16-bit only)' where the factors hold for one precision kind
    (StackFactors.precisions, planner.stacks.precision_kind)."""
    from planner.stacks import precision_kind

    kinds = {precision_kind(p) for p in factors.precisions or ()}
    return f" ({kinds.pop()} only)" if len(kinds) == 1 else ""


@app.command("stacks")
def stacks_cmd(as_json: JsonOpt = False) -> None:
    """List the software-stack presets: recipe, efficiency factors (GEMM scale, host time per
    layer pass) and where they come from (published runs fitted, error in and out of sample).
    --json prints a list of objects."""
    from planner.stacks import builtin_stacks

    presets = list(builtin_stacks().values())
    if as_json:
        typer.echo(json.dumps([p.summary() for p in presets], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="software stacks (--stack NAME or a framework description)")
    for col in ("name", "recipe", "gemm x", "layer pass us", "fitted on (runs)",
                "error in sample", "out of sample"):
        table.add_column(col, justify="right" if col in ("gemm x", "layer pass us") else "left",
                         no_wrap=col == "name")
    for p in presets:
        prov = p.provenance
        recipe = " ".join(f"{k}={v}" for k, v in p.recipe.job_fields().items()) or "defaults"
        if p.layout_defaults:
            recipe += "; " + " ".join(f"{k}={v}" for k, v in p.layout_defaults.items())
        gemm = f"{p.factors.gemm_scale:.3g}" + _only(p.factors)
        layer = ("profile" if p.factors.layer_overhead_us is None
                 else f"{p.factors.layer_overhead_us:.0f}")
        for cls, f in p.gpu_factors.items():  # factors kept on one GPU class (stackfit)
            gemm += f"; {cls} {f.gemm_scale:.3g}{_only(f)}"
            layer += f"; {cls} " + ("profile" if f.layer_overhead_us is None
                                    else f"{f.layer_overhead_us:.0f}")
        table.add_row(
            p.name, recipe, gemm, layer,
            f"{', '.join(prov.fitted_on)} ({prov.runs})" if p.fitted
            else "none: stock",
            _err(prov.in_sample), _err(prov.out_of_sample))
    console = Console()
    console.print(table)
    console.print("errors: median / p90 of |predicted / measured - 1| of step time; out of "
                  "sample: on the stack's other sources, or one model left out when it has one "
                  "source (planner stacks --json says which). Factors fitted on some precisions "
                  "only (bf16/fp16 count as one) are stock for the others; the first value "
                  "serves the GPU classes not named after it (stock in fitted presets).")
