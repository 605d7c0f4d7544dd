"""`planner estimate`: predict one layout, term by term, whether it fits or not.

    planner estimate --model llama70b --cluster 128xA100 --tp 8 --pp 4
    planner estimate --model llama3-70b --cluster 64xH100 --tp 8 --pp 4 --zero 1 --json
    planner estimate --model gpt3-175b --cluster 16x8xA100 --tp 8 --pp 8 --vpp 3 --csv plan.csv

Knobs not given take these defaults: dp = GPUs / (tp * pp * cp), cp = ep = vpp = mbs = 1, etp = tp,
zero = 1 (Megatron's distributed optimizer), recompute = selective, sp on when tp > 1.
A layout that does not fit is still estimated (fits false, with what overflows); degrees that do
not multiply to the GPU count or do not divide heads, layers or the batch exit 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from planner.cli.inputs import (
    JOB_OPTIONS,
    LAYOUT_KNOB_OPTIONS,
    RUN_ECONOMICS_OPTIONS,
    resolve_inputs,
    takes,
)
from planner.cli.launcher_options import ConfigOpt, MaybeClusterOpt, MaybeModelOpt
from planner.cli.options import (
    CsvOpt,
    JsonOpt,
    StageLayersOpt,
    with_economics,
)
from planner.cli.typer_app import app
from planner.errors import LayoutError
from planner.layout import Layout, default_layout

ESTIMATE_HELP = (
    "Predict step time, throughput, MFU and the memory of the most loaded GPU for one layout.\n\n"
    "Knobs not given: dp = GPUs / (tp * pp * cp), cp = ep = vpp = mbs = 1, zero 1 (distributed "
    "optimizer), recompute selective, sp on when tp > 1. A layout that does not fit is still "
    "estimated and says what overflows."
)


@app.command("estimate", help=ESTIMATE_HELP)
@takes(LAYOUT_KNOB_OPTIONS, JOB_OPTIONS, RUN_ECONOMICS_OPTIONS)
def estimate_cmd(
    ctx: typer.Context,
    model: MaybeModelOpt = None,
    cluster: MaybeClusterOpt = None,
    config: ConfigOpt = None,
    stage_layers: StageLayersOpt = None,
    csv: CsvOpt = None,
    as_json: JsonOpt = False,
    **options: Any,  # the shared options (@takes), read by name in resolve_inputs
) -> None:
    """Predict one layout (help text: ESTIMATE_HELP)."""
    from planner.costmodel import estimate_placed
    from planner.plan import Plan

    # with --config, its layout; the flags typed override it; the stack's layout knobs are
    # defaults here (below), not pins
    inputs = resolve_inputs(ctx, pools=True, pin_stack=False)
    model_spec, cluster_spec, job, pins = inputs.model, inputs.cluster, inputs.job, inputs.pins
    run_in, counts = inputs.economics, inputs.stage_layers
    pp = pins.get("pp", len(counts) or None)
    own = inputs.config.imported.stage_layers if inputs.config is not None else ()
    if not counts and own and len(own) in (pp, pp * pins.get("vpp", 1)):
        counts = own  # the config's uneven split (per stage, or per virtual stage)
    if "tp" not in pins or pp is None:
        raise LayoutError("estimate needs --tp and --pp (use `planner solve` to search them)")
    # what the stack cannot change, where the user did not say
    fixed = {k: v for k, v in inputs.stack.layout_defaults.items() if k in ("vpp", "zero", "sp")}
    knobs = {**fixed, **{k: v for k, v in pins.items() if k not in ("tp", "pp")}}
    layout = default_layout(cluster_spec.num_gpus, str(cluster_spec), tp=pins["tp"], pp=pp,
                            **knobs)
    layout = dataclasses.replace(layout, stage_layers=counts)
    if "etp" not in pins and model_spec.is_moe and layout.etp == 0:
        layout = _fold_experts(layout)
    plan = Plan(*estimate_placed(model_spec, cluster_spec, job, layout))
    plan = with_economics([plan], model_spec, cluster_spec, run_in)[0]
    from planner.published import mark_cluster_plans, note

    marked, limit = mark_cluster_plans([plan], cluster_spec, inputs.stack.name, job.precision)
    plan = marked[0]
    from planner import report
    from planner.costmodel.checks import layout_warnings, plan_warnings

    for line in (layout_warnings(cluster_spec, layout) + plan_warnings(cluster_spec, job, plan)
                 + inputs.stack.unsupported(layout)):
        typer.echo(f"warning: {line}", err=True)

    if csv is not None:
        report.write_plans_csv([plan], csv)
    if as_json:
        import json

        from planner.costmodel import memory_status

        # beside the plan columns: "fits", "may not fit: x GiB +- y ..." or "does not fit"
        row = {**report.plan_rows([plan])[0], "memory_status": memory_status(plan.estimate)}
        typer.echo(json.dumps(row, indent=2))
        return
    from rich.console import Console

    console = Console()
    console.print(
        f"{model_spec.name} on {cluster_spec} ({cluster_spec.num_gpus} GPUs), "
        f"{report.job_label(cluster_spec.gpu, job)}"
        + (f", stack {inputs.stack.name}" if inputs.stack_given else "")
    )
    report.print_estimate(plan, console)
    report.print_run_notes(plan, run_in, inputs.ref_lr, inputs.ref_batch, console)
    flagged = note([plan], limit)
    if flagged:
        console.print("! " + flagged, markup=False)
    if csv is not None:
        console.print(f"wrote {csv}")


def _fold_experts(layout: Layout) -> Layout:
    """The layout with etp 1 where Megatron's default etp = tp does not fold (etp*ep must
    divide tp*cp*dp; e.g. Qwen3-235B's tp 2, dp 16, ep 32, run with expert-TP 1), saying so."""
    from planner.costmodel.checks import expert_fold_allowed

    lo = layout
    if expert_fold_allowed(lo.tp, lo.cp, lo.dp, lo.ep, lo.tp) or not expert_fold_allowed(
            lo.tp, lo.cp, lo.dp, lo.ep, 1):
        return layout
    typer.echo(f"note: etp = tp = {lo.tp} does not fold with ep={lo.ep} over tp*cp*dp = "
               f"{lo.tp * lo.cp * lo.dp} ranks; estimating etp=1 (give --etp to choose)", err=True)
    return dataclasses.replace(layout, etp=1)
