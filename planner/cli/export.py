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


def runnable_plans(solve, model_spec, cluster_spec, job, pins, rank, rules,
                   own_split=None):
    """The ranking's plans the launcher can run (`rules(layout, layers)` lists why not), best
    first, at least `rank` of them where there are: the first plans of a wider ranking (each
    with its stages as the launcher splits them, `own_split`, and estimated so), and the best of
    each pin that mends a refusal (ZeRO 0, ZeRO 1, pp 1) when those are too few."""
    from planner.costmodel import estimate
    from planner.plan import Plan

    if rules is None:
        return solve(model_spec, cluster_spec, job, pins, top_k=rank)
    layers = model_spec.num_hidden_layers

    def runnable(found):
        out = []
        for p in found:
            if own_split is not None and own_split(p.layout, layers) != p.layout:
                lay = own_split(p.layout, layers)
                p = Plan(lay, estimate(model_spec, cluster_spec, job, lay))
            if not rules(p.layout, layers) and p.estimate.fits:
                out.append(p)
        return out

    plans = runnable(solve(model_spec, cluster_spec, job, pins, top_k=max(64, 8 * rank)))
    if len(plans) < rank:
        seen = {str(p.layout) for p in plans}
        for extra in ({"zero": 0}, {"zero": 1}, {"pp": 1}):
            if any(k in pins and pins[k] != v for k, v in extra.items()):
                continue
            for p in runnable(solve(model_spec, cluster_spec, job, {**pins, **extra},
                                    top_k=rank)):
                if str(p.layout) not in seen:
                    plans.append(p)
                    seen.add(str(p.layout))
    plans.sort(key=lambda p: p.estimate.step_time_s)
    return plans


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
    resolved = inputs.config
    from planner.launchers import module

    launcher = module(to.value if hasattr(to, "value") else str(to))
    rules = getattr(launcher, "layout_problems", None)
    own_split = getattr(launcher, "with_own_split", None)
    # the launcher's fixed knobs (DeepSpeed: vpp 1), where neither the user nor the config says
    pins = {**getattr(launcher, "LAYOUT_PINS", {}), **pins}
    knobs = [k for k in KNOBS if k != "etp"]  # etp defaults to the TP size
    if all(k in pins for k in knobs):
        counts = resolved.imported.stage_layers if resolved is not None else ()
        if len(counts) not in (pins["pp"], pins["pp"] * pins["vpp"]):
            counts = ()  # per stage, or per virtual stage (the config's pipeline layout)
        layout = Layout(**{k: pins[k] for k in knobs}, etp=pins.get("etp", 0),
                        stage_layers=counts)
        if own_split is not None and own_split(layout, model_spec.num_hidden_layers) != layout:
            layout = own_split(layout, model_spec.num_hidden_layers)
            print(f"note: {to.value}: the stages as the launcher splits them ({layout})",
                  file=sys.stderr)
        plan = Plan(layout, estimate(model_spec, cluster_spec, job, layout))
        if not plan.estimate.fits:
            print(f"warning: {layout} does not fit ({plan.estimate.peak_mem_gb:.1f} GiB of "
                  f"{plan.estimate.mem_capacity_gb:.1f})", file=sys.stderr)
    else:
        plans = runnable_plans(solve, model_spec, cluster_spec, job, pins, rank, rules,
                               own_split)
        if len(plans) < rank:
            from planner.errors import SpecError

            raise SpecError(f"--rank {rank}: only {len(plans)} plan(s) fit"
                            + (f" that {to.value} can run" if rules else ""))
        plan = plans[rank - 1]
    write_export(to, model_spec, cluster_spec, job, plan, out)
