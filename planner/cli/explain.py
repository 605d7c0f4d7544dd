"""`planner explain` and `planner report`: one plan explained; the ranked plans, the winner's
explanation and the figures in one self-contained HTML file.

    planner explain --model llama70b --cluster 128xA100 --rank 1
    planner explain --model llama3-405b --cluster 16384xH100 --seq-len 8192 --global-batch 2048 \\
        --tp 8 --pp 16 --vpp 8 --zero 2 --recompute none --figures figs/
    planner report --html plans.html --model llama70b --cluster 128xA100 --train-tokens 2e12

A plan is given by --rank N (the N-th of `solve` with the same options; pins narrow the
search) or, without --rank, by --tp and --pp (and the other pins; the rest at `estimate`'s
defaults). Its neighbours in the ranking come from the unpinned search then.
"""

from __future__ import annotations

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
from planner.cli.options import (
    ClusterOpt,
    JsonOpt,
    ModelOpt,
    output_file,
    output_folder,
    with_economics,
)
from planner.cli.typer_app import app
from planner.errors import LayoutError, SpecError

RankOpt = Annotated[int | None, typer.Option(
    "--rank", min=1, max=limits.MAX_TOP,
    help="Explain the N-th plan of the ranking (solve with the same options).")]
FiguresOpt = Annotated[str | None, typer.Option(  # str: an empty value is refused, not "."
    "--figures", callback=output_folder,
    help="Write the plan's figures here (schedule, memory, pareto; PNG and SVG).")]
HtmlOpt = Annotated[Path, typer.Option("--html", callback=output_file,
                                       help="Write the HTML report here.")]
TopOpt = Annotated[int, typer.Option("--top", min=1, max=limits.MAX_TOP,
                                     help="Ranked plans in the table.")]
CompareOpt = Annotated[list[str] | None, typer.Option(
    "--compare-cluster", help="Also rank on this cluster (repeatable): the Pareto figure then "
    "compares the clusters, step time against peak memory and against GPU count.")]
# Plans behind the Pareto figure: more than the table shows, so the front has points.
PARETO_PLANS = 60


def resolve_plan(model_spec: Any, cluster_spec: Any, job: Any, pins: dict[str, Any],
                 rank: int | None, top: int) -> tuple[Any, list[Any]]:
    """(the plan to explain, the ranking it is compared with)."""
    from planner.costmodel import estimate_placed
    from planner.errors import InfeasibleError
    from planner.plan import Plan
    from planner.search import solve

    if rank is not None:
        ranked = solve(model_spec, cluster_spec, job, pins, top_k=max(top, rank + 2))
        if rank > len(ranked):
            raise SpecError(f"--rank {rank}: only {len(ranked)} plans fit with these options")
        return ranked[rank - 1], ranked
    if "tp" not in pins or "pp" not in pins:
        raise LayoutError("explain needs --rank N, or --tp and --pp (and any other pins)")
    from planner.layout import default_layout

    layout, est = estimate_placed(model_spec, cluster_spec, job,
                                  default_layout(cluster_spec.num_gpus, str(cluster_spec), **pins))
    plan = Plan(layout=layout, estimate=est)
    try:
        ranked = solve(model_spec, cluster_spec, job, {}, top_k=max(top, PARETO_PLANS))
    except InfeasibleError:
        ranked = []
    for p in ranked:
        if p.layout == layout:
            plan = p
    return plan, ranked


def write_figures(model_spec: Any, cluster_spec: Any, job: Any, plan: Any, ranked: list[Any],
                  folder: Path) -> list[Path]:
    """schedule / memory / pareto figures of the plan, PNG and SVG, into folder."""
    from planner import figures

    figs = {"schedule": figures.schedule_figure(model_spec, cluster_spec, job, plan.layout),
            "memory": figures.memory_figure(model_spec, cluster_spec, job, plan.layout)}
    if ranked:
        figs["pareto"] = figures.pareto_figure({str(cluster_spec): ranked})
    out = []
    for name, fig in figs.items():
        for ext in ("png", "svg"):
            out.append(figures.save(fig, folder / f"{name}.{ext}"))
    return out


@app.command("explain")
@takes(LAYOUT_KNOB_OPTIONS, JOB_OPTIONS, RUN_ECONOMICS_OPTIONS)
def explain_cmd(
    ctx: typer.Context,
    model: ModelOpt,
    cluster: ClusterOpt,
    rank: RankOpt = None,
    figures: FiguresOpt = None,
    as_json: JsonOpt = False,
    **options: Any,  # the shared options (@takes), read by name in resolve_inputs
) -> None:
    """Explain one plan: where the time and memory go, what binds, the change that helps most
    (re-estimated), and why its neighbours in the ranking lose."""
    from planner.costmodel import memory_status
    from planner.explanation import explain
    from planner.report import run_note_lines
    inputs = resolve_inputs(ctx, pools=True)
    model_spec, cluster_spec, job, pins = inputs.model, inputs.cluster, inputs.job, inputs.pins
    run_in = inputs.economics
    plan, ranked = resolve_plan(model_spec, cluster_spec, job, pins, rank, 10)
    plan = with_economics([plan], model_spec, cluster_spec, run_in)[0]
    from planner.published import mark_cluster_plans, note

    marked, limit = mark_cluster_plans([plan], cluster_spec, inputs.stack.name, job.precision)
    plan = marked[0]
    exp = explain(model_spec, cluster_spec, job, plan, ranked)
    flagged = note([plan], limit)
    lines = exp.lines() + ([flagged] if flagged else []) \
        + run_note_lines(plan, run_in, inputs.ref_lr, inputs.ref_batch)
    written = write_figures(model_spec, cluster_spec, job, plan, ranked, figures) if figures else []
    if as_json:
        import json

        from planner.report import plan_rows

        typer.echo(json.dumps({
            "plan": plan_rows([plan])[0], "binds": exp.binds, "groups": exp.groups,
            "best_change": exp.best_change.text() if exp.best_change else None,
            "changes": [{"change": c.what, "layout": str(c.plan.layout),
                         "step_time_s": c.plan.estimate.step_time_s,
                         "d_step_rel": c.d_step_rel, "d_peak_gb": c.d_peak_gb,
                         "fits": c.plan.estimate.fits,
                         "memory_status": memory_status(c.plan.estimate)} for c in exp.changes],
            "neighbours": exp.neighbours, "text": lines,
            "figures": [str(p) for p in written]}, indent=2))
        return
    from rich.console import Console

    console = Console()
    console.print(f"{model_spec.name} on {cluster_spec} ({cluster_spec.num_gpus} GPUs), seq "
                  f"{job.seq_len}, global batch {job.global_batch}", markup=False)
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for path in written:
        console.print(f"wrote {path}", markup=False)


@app.command("report")
@takes(LAYOUT_KNOB_OPTIONS, JOB_OPTIONS, RUN_ECONOMICS_OPTIONS)
def report_cmd(
    ctx: typer.Context,
    html: HtmlOpt,
    model: ModelOpt,
    cluster: ClusterOpt,
    top: TopOpt = 10,
    compare_cluster: CompareOpt = None,
    **options: Any,  # the shared options (@takes), read by name in resolve_inputs
) -> None:
    """Write one self-contained HTML file: the ranked plans, the winner's explanation and its
    figures (inlined SVG, no network)."""
    from planner.explanation import explain
    from planner.html_report import html_report
    from planner.io import write_text_atomic
    from planner.report import job_label, run_note_lines
    from planner.search import solve

    if str(html) != "-" and html.suffix.lower() not in (".html", ".htm"):
        raise SpecError(f"--html {html}: use a .html file name")
    inputs = resolve_inputs(ctx, pools=True)
    model_spec, cluster_spec, job, pins = inputs.model, inputs.cluster, inputs.job, inputs.pins
    run_in = inputs.economics
    ranked = solve(model_spec, cluster_spec, job, pins, top_k=max(top, PARETO_PLANS))
    ranked = with_economics(ranked, model_spec, cluster_spec, run_in)
    winner = ranked[0]
    exp = explain(model_spec, cluster_spec, job, winner, ranked)
    groups = {str(cluster_spec): ranked}
    for other in compare_cluster or []:
        from planner.errors import InfeasibleError
        from planner.registry import parse_cluster

        given = options["profile"] is not None  # --profile: the same GPU profile everywhere
        spec = parse_cluster(other, profile=cluster_spec.gpu if given else None)
        try:
            groups[str(spec)] = solve(model_spec, spec, job, pins, top_k=PARETO_PLANS)
        except InfeasibleError:
            groups[str(spec)] = []
    title = (f"{model_spec.name} on {cluster_spec} ({cluster_spec.num_gpus} GPUs), seq "
             f"{job.seq_len}, global batch {job.global_batch}, {job_label(cluster_spec.gpu, job)}")
    from planner.costmodel.checks import plan_warnings

    notes = [f"warning: {w}" for w in plan_warnings(cluster_spec, job, winner)]
    text = html_report(model_spec, cluster_spec, job, ranked, top, exp,
                       notes + run_note_lines(winner, run_in, inputs.ref_lr, inputs.ref_batch),
                       title, groups)
    write_text_atomic(html, text)
    typer.echo(f"wrote {html} ({len(text) / 1024:.0f} KiB): {min(top, len(ranked))} plans, "
               f"winner {winner.layout}", err=str(html) == "-")
