"""`planner export`: a plan as Megatron-LM, NeMo / Megatron-Bridge, torchtitan or DeepSpeed
configuration.

    planner export --to megatron --model gpt3-175b --cluster 16x8xA100 --tp 8 --pp 16 --out run.sh
    planner export --to torchtitan --model llama3-405b --cluster 16384xH100 --rank 2
    planner export --to nemo --config my_megatron_script.sh --cluster H100   # convert a config
    planner solve --model llama3-70b --cluster 64xH100 --export nemo --out overrides.yaml

Plan N of the ranking (--rank, default 1) is written; a layout whose every knob is pinned is taken
as is (estimated, even when it does not fit). stdout when no --out; what the launcher cannot
express is a comment in the file and a warning on stderr.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from planner.cli.inputs import (
    JOB_OPTIONS,
    LAYOUT_KNOB_OPTIONS,
    resolve_inputs,
    takes,
)
from planner.cli.launcher_options import (
    ConfigOpt,
    MaybeClusterOpt,
    MaybeModelOpt,
    OutOpt,
    RankOpt,
    ToOpt,
    write_export,
)
from planner.cli.typer_app import app


@app.command("export")
@takes(LAYOUT_KNOB_OPTIONS, JOB_OPTIONS)
def export_cmd(
    ctx: typer.Context,
    to: ToOpt,
    model: MaybeModelOpt = None,
    cluster: MaybeClusterOpt = None,
    config: ConfigOpt = None,
    rank: RankOpt = 1,
    out: OutOpt = None,
    **options: Any,  # the shared options (@takes), read by name in resolve_inputs
) -> None:
    """Write a plan as a launcher's own configuration (plan --rank N of the ranking, or the
    layout every knob of which is pinned, or the --config's layout converted)."""
    from planner.costmodel import estimate
    from planner.layout import KNOBS, Layout
    from planner.plan import Plan
    from planner.search import solve

    inputs = resolve_inputs(ctx, pools=True)  # a pooled plan: export_plan says why not, one line
    model_spec, cluster_spec, job, pins = inputs.model, inputs.cluster, inputs.job, inputs.pins
    if all(k in pins for k in KNOBS):
        layout = Layout(**{k: pins[k] for k in KNOBS})
        plan = Plan(layout, estimate(model_spec, cluster_spec, job, layout))
        if not plan.estimate.fits:
            print(f"warning: {layout} does not fit ({plan.estimate.peak_mem_gb:.1f} GiB of "
                  f"{plan.estimate.mem_capacity_gb:.1f})", file=sys.stderr)
    else:
        plans = solve(model_spec, cluster_spec, job, pins, top_k=rank)
        if len(plans) < rank:
            from planner.errors import SpecError

            raise SpecError(f"--rank {rank}: only {len(plans)} plan(s) fit")
        plan = plans[rank - 1]
    write_export(to, model_spec, cluster_spec, job, plan, out)
