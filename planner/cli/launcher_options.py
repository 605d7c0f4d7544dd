"""Options and helpers for the launchers (planner.launchers) that export, solve and estimate
share: --config (read a launcher config, typed flags override it), --export/--out, --to, --rank.
Registers no command (main() imports only the command being run).
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from planner import limits
from planner.cli.options import load_inputs, output_file


class LauncherChoice(str, Enum):
    megatron = "megatron"
    nemo = "nemo"
    torchtitan = "torchtitan"
    deepspeed = "deepspeed"


MaybeModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="Built-in name/alias, spec YAML, or HF config.json (default with "
    "--config: the config's model).")]
MaybeClusterOpt = Annotated[str | None, typer.Option(
    "--cluster", "-c", help="NxGPU, NODESxPERNODExGPU, or a cluster YAML; with --config a bare "
    "GPU name (H100) takes the config's GPU count.")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="A launcher config to start from (Megatron-LM arguments or script, "
    "NeMo/Megatron-Bridge YAML, torchtitan config, DeepSpeed JSON or script; detected by "
    "content; FILE.py:FUNCTION picks one function of a torchtitan config registry): its "
    "model and layout, flags override.")]
ToOpt = Annotated[LauncherChoice, typer.Option("--to", help="The launcher to write for.")]
ExportOpt = Annotated[LauncherChoice | None, typer.Option(
    "--export", help="Also write the winner as this launcher's configuration (see --out).")]
OutOpt = Annotated[Path | None, typer.Option(
    "--out", callback=output_file,
    help="Write the launcher configuration here (stdout otherwise).")]
RankOpt = Annotated[int, typer.Option("--rank", min=1, max=limits.MAX_TOP,
                                      help="Which ranked plan to write.")]

RECIPE_OPTIONS = ("precision", "attention", "grad_dtype", "tp_comm_overlap", "p2p_overlap",
                  "moe_dispatcher", "moe_capacity_factor", "moe_routing", "moe_ep_overlap")


def given(ctx: typer.Context, names: tuple[str, ...]) -> set[str]:
    """The options the user typed (not left at their default): the context's ParameterSource
    (click's enum, vendored by typer) compared by name."""
    sources = {n: ctx.get_parameter_source(n) for n in names}
    return {n for n, s in sources.items() if s is not None and s.name != "DEFAULT"}


def inputs(ctx: typer.Context, config: Path | None, model: str | None, cluster: str | None,
           profile: Path | None, seq_len: int | None, global_batch: int | None,
           recipe: dict[str, Any], pins: dict[str, Any], stack: str | None = None,
           pools: bool = False):
    """(model, cluster, job, pins, resolved-or-None): from the flags alone, or from --config with
    the flags that were typed overriding it. `stack` (--stack; with --config default the config's
    framework) sets the recipe the config and the typed flags do not, and its efficiency factors
    on the GPU profile (planner.stacks). pools: the command takes a cluster of pools
    (64xH100+128xA100; solve, estimate and export, from the flags)."""
    from planner.errors import SpecError

    unwrap = {k: (v.value if isinstance(v, Enum) else v) for k, v in recipe.items()}
    if config is None:
        if model is None or cluster is None:
            raise SpecError("give --model and --cluster (or --config with a launcher config)")
        given_recipe = {k: recipe[k] for k in RECIPE_OPTIONS if recipe.get(k) is not None}
        model_spec, cluster_spec, job = load_inputs(
            model, cluster, profile, seq_len, global_batch, **given_recipe, stack=stack,
            pools=pools)
        return model_spec, cluster_spec, job, pins, None
    from planner.launchers import read_config, resolve
    from planner.registry import load_gpu

    imported = read_config(config)
    typed = given(ctx, RECIPE_OPTIONS)
    job_overrides = {k: unwrap[k] for k in typed if k in unwrap}
    job_overrides.update(seq_len=seq_len, global_batch=global_batch)
    gpu = load_gpu(str(profile)) if profile is not None else None
    resolved = resolve(imported, model, cluster, gpu, job_overrides, pins)
    for note in resolved.notes:
        print(f"note: {config}: {note}", file=sys.stderr)
    from planner.stacks import resolve_stack

    text = stack or imported.framework
    preset = resolve_stack(text)
    own = set(imported.job) | typed
    fields = {k: v for k, v in preset.recipe_fields(text).items() if k not in own}
    job = resolved.job.model_copy(update=fields) if fields else resolved.job
    cluster_spec = resolved.cluster.model_copy(
        update={"gpu": preset.profile_for(resolved.cluster.gpu, job.precision)})
    return resolved.model, cluster_spec, job, resolved.pins, resolved


def first_runnable(launcher: LauncherChoice | str, plans: list, model_spec, cluster_spec,
                   job):
    """The best of `plans` the launcher can run (its layout_problems; DeepSpeed's pipeline
    engine: no vpp, ZeRO 0-1 with pp > 1), with the stages as the launcher splits them
    (with_own_split, re-estimated), noted on stderr when it is not the first; SpecError when
    none is."""
    from planner.costmodel import estimate_placed
    from planner.errors import SpecError
    from planner.launchers import module
    from planner.plan import Plan

    name = launcher.value if isinstance(launcher, Enum) else launcher
    rules = getattr(module(name), "layout_problems", None)
    own_split = getattr(module(name), "with_own_split", None)
    for i, plan in enumerate(plans):
        if rules is None or not rules(plan.layout):
            if i:
                print(f"note: {name}: exporting plan {i + 1} ({plan.layout}), the best the "
                      f"launcher can run", file=sys.stderr)
            if own_split is not None:
                layout = own_split(plan.layout, model_spec.num_hidden_layers)
                if layout != plan.layout:
                    plan = Plan(layout, estimate_placed(model_spec, cluster_spec, job, layout)[1])
            return plan
    raise SpecError(f"none of the {len(plans)} plans can run on {name} "
                    f"({'; '.join(rules(plans[0].layout))}): use `planner export --to {name}`, "
                    "which re-plans")


def write_export(launcher: LauncherChoice | str, model_spec, cluster_spec, job, plan,
                 out: Path | None) -> None:
    """Write plan's layout as the launcher's config to `out` (atomically) or stdout; warnings on
    stderr."""
    from planner.io import write_text_atomic
    from planner.launchers import FORMS, LaunchPlan, export_plan

    name = launcher.value if isinstance(launcher, Enum) else launcher
    form = FORMS.get((name, out.suffix.lower())) if out is not None else None
    result = export_plan(name, LaunchPlan(model_spec, cluster_spec, job, plan.layout,
                                          plan.estimate.step_time_s), form)
    for warning in result.warnings:
        print(f"warning: {name}: {warning}", file=sys.stderr)
    if out is None or str(out) == "-":
        sys.stdout.write(result.text)
    else:
        write_text_atomic(out, result.text)
        print(f"wrote {out} ({name})", file=sys.stderr)


