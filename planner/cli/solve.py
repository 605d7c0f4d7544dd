"""`planner solve`: the ranked layouts that fit, the tie with the fastest first, then by step time.

    planner solve --model llama70b --cluster 128xA100
    planner solve --model llama3-405b --cluster 16384xH100 --seq-len 8192 --global-batch 2048
    planner solve --model llama70b --cluster 64xA100 --tp 8 --top 5 --csv plans.csv
    planner solve --model mixtral --cluster 64xH100 --json

Every knob not given is searched (tp, pp, dp, cp, ep, vpp, mbs, zero, recompute, sp); a given one
is pinned. Plans whose ranking bands (the error between layouts of one job) overlap the fastest's
are tied (tied_with_best) and come first, the most robust first (then lower memory); the rest by
step time, exact ties to lower memory, then to fewer groups crossing nodes (docs/ranking.md). When
nothing fits, it says why (the smallest memory any layout needs, what dominates it, which pin or
limit binds) and exits 1; pins no valid layout can honour exit 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from planner import limits
from planner.cli.inputs import (
    JOB_OPTIONS,
    LAYOUT_KNOB_OPTIONS,
    RUN_ECONOMICS_OPTIONS,
    resolve_inputs,
    takes,
)
from planner.cli.launcher_options import (
    ConfigOpt,
    ExportOpt,
    MaybeClusterOpt,
    MaybeModelOpt,
    OutOpt,
    write_export,
)
from planner.cli.options import (
    CsvOpt,
    EvenStagesOpt,
    JsonOpt,
    StageLayersOpt,
    output_file,
    records_option,
    with_economics,
)
from planner.cli.typer_app import app

TopOpt = Annotated[int, typer.Option("--top", min=1, max=limits.MAX_TOP,
                                     help="How many ranked plans to show/write.")]
CalibrateOpt = Annotated[
    int | None,
    typer.Option(
        "--calibrate",
        min=1,
        max=limits.MAX_TOP,
        help="Closed loop: validate the top N plans here (torchrun), refit the profile, re-rank.",
    ),
]
RunsOpt = records_option("--runs", "With --calibrate: run records are appended here.")
TpAcrossNodesOpt = Annotated[
    bool,
    typer.Option(
        "--tp-across-nodes",
        help="Also search tp beyond the NVLink domain (its collectives over the scale-out "
        "network); by default tp stays inside one domain.",
    ),
]
ProfileOutOpt = Annotated[
    Path | None,
    typer.Option("--profile-out", callback=output_file,
                 help="With --calibrate: write the fitted profile here."),
]


@contextmanager
def _empty_json_when_infeasible(as_json: bool) -> Iterator[None]:
    """With --json, nothing that fits is an empty list on stdout (the diagnosis on stderr, exit
    1 as the contract says)."""
    from planner.errors import InfeasibleError

    try:
        yield
    except InfeasibleError:
        if as_json:
            typer.echo("[]")
        raise


@app.command("solve")
@takes(LAYOUT_KNOB_OPTIONS, JOB_OPTIONS, RUN_ECONOMICS_OPTIONS)
def solve_cmd(
    ctx: typer.Context,
    model: MaybeModelOpt = None,
    cluster: MaybeClusterOpt = None,
    config: ConfigOpt = None,
    stage_layers: StageLayersOpt = None,
    even_stages: EvenStagesOpt = False,
    top: TopOpt = 10,
    csv: CsvOpt = None,
    as_json: JsonOpt = False,
    calibrate: CalibrateOpt = None,
    runs: RunsOpt = Path("runs.jsonl"),
    profile_out: ProfileOutOpt = None,
    export: ExportOpt = None,
    out: OutOpt = None,
    tp_across_nodes: TpAcrossNodesOpt = False,
    **options: Any,  # the shared options (@takes), read by name in resolve_inputs
) -> None:
    """Search the layouts (CP-SAT) and print the best that fit: the tie with the fastest (by
    robustness), then the rest by predicted step time."""
    from planner.errors import SpecError
    from planner.search import search

    if out is not None and export is None:
        raise SpecError("--out goes with --export LAUNCHER")
    if str(csv) == "-" and (as_json or (export is not None and str(out) in ("None", "-"))):
        raise SpecError("--csv - and " + ("--json" if as_json else "--export without --out")
                        + " would both write to stdout; give --csv a file name")
    # with --config, the config's layout (inputs.pins) is the one compared; typed flags pinned
    inputs = resolve_inputs(ctx, pools=True)
    model_spec, cluster_spec, job = inputs.model, inputs.cluster, inputs.job
    pins = inputs.typed_pins
    comparison = loop = None
    with _empty_json_when_infeasible(as_json):
        if calibrate is not None:
            loop = _closed_loop(inputs, calibrate, runs, top, profile_out, as_json,
                                tp_across_nodes)
            plans = loop.plans_after
            tied_total = sum(p.tied_with_best for p in plans)
            at_least = tied_total == len(plans)  # the loop keeps only its top plans
        elif inputs.config is not None:
            from planner.cli.solve_config import compare_config

            result, comparison = compare_config(model_spec, cluster_spec, job, pins,
                                                inputs.pins, top,
                                                inputs.config.imported.stage_layers)
            plans, tied_total, at_least = (result.plans(), result.tied_total,
                                           result.tied_at_least)
        else:
            result = search(model_spec, cluster_spec, job, pins, top_k=top,
                            stage_layers=inputs.stage_layers, even_stages=even_stages,
                            tp_across_nodes=tp_across_nodes)
            plans, tied_total, at_least = (result.plans(), result.tied_total,
                                           result.tied_at_least)
    plans = with_economics(plans, model_spec, cluster_spec, inputs.economics)
    from planner.published import mark_cluster_plans

    plans, limit = mark_cluster_plans(plans, cluster_spec, inputs.stack.name, job.precision)
    from planner import report
    from planner.costmodel.checks import plan_warnings

    for line in (plan_warnings(cluster_spec, job, plans[0]) + inputs.stack.unsupported(
            plans[0].layout)) if plans else []:
        typer.echo(f"warning: {line}", err=True)
    if export is not None:
        from planner.cli.launcher_options import first_runnable

        write_export(export, model_spec, cluster_spec, job,
                     first_runnable(export, plans, model_spec, cluster_spec, job), out)
    if csv is not None:
        report.write_plans_csv(plans, csv)
    if as_json:
        if comparison is None:
            typer.echo(report.plans_json(plans))
        else:
            from planner.cli.solve_config import comparison_json

            typer.echo(comparison_json(plans, comparison))
        return
    from rich.console import Console

    # the table goes to stderr when stdout carries a file (--export without --out, --csv -)
    console = Console(stderr=(export is not None and (out is None or str(out) == "-"))
                      or str(csv) == "-")
    _print(console, inputs, plans, (tied_total, at_least), loop, comparison, limit)
    if csv is not None and str(csv) != "-":
        console.print(f"wrote {csv}")


def _print(console, inputs, plans, tie, loop, comparison, limit) -> None:
    """The table, the winner's run, warnings, the tie (its size and whether that is a lower
    bound), the config comparison, the loop's fit."""
    from planner import report

    tied_total, at_least = tie

    model_spec, cluster_spec, job = inputs.model, inputs.cluster, inputs.job
    pins = inputs.typed_pins
    preset, stack = inputs.stack, inputs.stack_given
    pinned = " ".join(f"{k}={v}" for k, v in pins.items())
    title = (
        f"{model_spec.name} on {cluster_spec} ({cluster_spec.num_gpus} GPUs), seq {job.seq_len}, "
        f"global batch {job.global_batch}, {report.job_label(cluster_spec.gpu, job)}"
        + (f", stack {preset.name}" if stack else "")
        + (f"; pinned {pinned}" if pinned else "")
    )
    report.print_plans_table(plans, console, title=title)
    if plans:
        report.print_run_notes(plans[0], inputs.economics, inputs.ref_lr, inputs.ref_batch,
                                console)
    from planner.published import note

    flagged = note(plans, limit)
    if flagged:
        console.print("! " + flagged, markup=False)
    from planner.costmodel.checks import layout_warnings

    crossing = [p.rank for p in plans if layout_warnings(cluster_spec, p.layout)]
    if crossing:
        console.print(f"warning: plans {', '.join(map(str, crossing))} run tp across NVLink "
                      "domains (over the scale-out network)")
    if tied_total > 1:
        calibrated = loop is not None or cluster_spec.gpu.step_time_rel_error is not None
        console.print(report.tie_note(plans, tied_total, calibrated, at_least))
    if comparison is not None:
        from planner.search.compare import describe

        for line in describe(comparison):
            console.print(line)
    if loop is not None:
        from planner.calibrate.report import print_fit

        before, after = loop.plans_before[0].layout, loop.plans_after[0].layout
        print_fit(loop.fit, console, loop.skipped)
        console.print("ran " + ", ".join(str(v) for v in loop.validated)
                      + " (the first plan and the tied plans that differ most in what drives "
                      "their step times)")
        console.print(
            f"calibrated on {len(loop.validated)} validated plan(s); records in {loop.runs_path}"
            + (f", fitted profile in {loop.profile_path}" if loop.profile_path else "")
        )
        console.print(
            f"winner changed: {before} -> {after}" if loop.winner_changed
            else f"winner unchanged: {after}"
        )


def _closed_loop(inputs, n, runs, top, profile_out, as_json, tp_across_nodes):
    """solve --calibrate N: the closed loop (planner.validate.loop) on these inputs; SIGTERM,
    SIGINT or SIGHUP end the run in flight with its record (exit 128 + signal)."""
    from contextlib import nullcontext

    from planner.interrupts import raise_on_signals
    from planner.progress import hidden
    from planner.validate.loop import closed_loop

    with raise_on_signals(), (hidden() if as_json else nullcontext()):
        return closed_loop(inputs.model, inputs.cluster, inputs.job, inputs.typed_pins, n, runs,
                           top_k=top, profile_out=profile_out, stack=inputs.stack,
                           tp_across_nodes=tp_across_nodes)

