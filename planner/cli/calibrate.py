"""`planner calibrate`: fit a GPU profile to measured step times.

    planner calibrate --runs runs.jsonl --profile cpu.yaml --out cpu-fitted.yaml
    planner calibrate --runs my_cluster_logs.csv --profile H100 --out h100-fitted.yaml
    planner calibrate --runs runs.csv --profile A100 --out a.yaml --fit gemm_scale,dp_overlap
    planner calibrate --runs megatron.log --runs titan.log --profile H100 --out h100-mine.yaml
    planner calibrate --runs three_runs.jsonl --profile H100 --stack nemo --out h100-nemo.yaml

By default the fit starts from the software stack's preset (--stack, else the stack the runs
name, else megatron-core) and fits only the knobs the runs identify, at most runs - 1, pulled
toward the preset (planner.calibrate.fewshot); it says which knobs it kept and why. --fit a,b
fits exactly those knobs instead (robust least squares, planner.calibrate.fit).

--runs (repeatable) takes the JSON-lines records of `planner validate`, a CSV with the columns of
published_runs.csv, or a Megatron-LM / NeMo / torchtitan training log (planner.measured.logs:
layout and model from the log, the median of its steady steps, predicted on --profile's GPU).
Prints the step-time error per run and overall,
before and after the fit and cross-validated, and writes the fitted profile atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli.options import output_file, output_option
from planner.cli.typer_app import app

RunsOpt = Annotated[list[Path], typer.Option(
    "--runs", help="validate records (.jsonl), a runs table (.csv) or a Megatron-LM / NeMo / "
    "torchtitan training log (.log); repeat for several.")]
BaseProfileOpt = Annotated[str, typer.Option(
    "--profile", help="GPU profile to start from: built-in name or YAML.")]
OutOpt = output_option("--out", "Write the fitted profile here (YAML).")
FitOpt = Annotated[str | None, typer.Option(
    "--fit", help="Comma-separated parameters to fit (default: every one the runs move).")]
SourceOpt = Annotated[list[str] | None, typer.Option(
    "--source", help="Use only rows of this source_id (repeatable; tables).")]
CvOpt = Annotated[bool, typer.Option("--cv/--no-cv", help="Cross-validate (leave-one-out).")]
MAX_WARNINGS = 10  # model disagreements printed (one per row)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a JSON summary instead of tables.")]
PlotOpt = Annotated[Path | None, typer.Option(
    "--plot", callback=output_file,
    help="Also draw predicted vs measured with the band (.png or .svg).")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Fit even when the records were measured on another device than the "
    "profile describes (CPU records against a GPU profile).")]
StackOpt = Annotated[str | None, typer.Option(
    "--stack", help="Software stack of the runs (preset or framework text; planner stacks): the "
    "fit starts from its preset. Default: the stack the runs name, else megatron-core.")]


@app.command("calibrate")
def calibrate_cmd(runs: RunsOpt, profile: BaseProfileOpt, out: OutOpt, fit: FitOpt = None,
                  source: SourceOpt = None, cv: CvOpt = True, json_out: JsonOpt = False,
                  plot: PlotOpt = None,
                  stack: StackOpt = None, force: ForceOpt = False) -> None:
    """Fit the profile's efficiency parameters to measured runs and write a new profile."""
    import json
    from contextlib import nullcontext

    from rich.console import Console

    from planner.calibrate import calibrate, profile_yaml
    from planner.calibrate.report import fit_summary, print_fit
    from planner.errors import SpecError
    from planner.io import write_bytes_atomic, write_text_atomic
    from planner.measured.runs import device_mismatch, load_runs
    from planner.progress import hidden, progress
    from planner.registry import load_gpu

    if plot is not None and plot.suffix.lower() not in (".png", ".svg"):
        raise SpecError(f"--plot {plot}: use a .png or .svg file name")
    if json_out and str(out) == "-":
        raise SpecError("--json and --out - would both write to stdout; give --out a file name")
    gpu = load_gpu(profile)
    if fit:  # every input checked before the runs are read (and warned about)
        from planner.specs.adjust import knobs_for

        known = [k.name for k in knobs_for(gpu)]
        unknown = sorted({n.strip() for n in fit.split(",") if n.strip()} - set(known))
        if unknown:
            raise SpecError(f"unknown fit parameter(s): {', '.join(unknown)}; known: "
                            + ", ".join(known))
    measured, skipped = [], []
    for path in runs:
        more, less = load_runs(path, gpu)
        measured += more
        skipped += less
    if source:
        measured = [r for r in measured if r.source_id in source]
        skipped = [s for s in skipped if s.source_id in source]
    measured = matching_gpu(measured, gpu)
    mismatch = device_mismatch(measured, gpu)
    if mismatch and not force:
        raise SpecError(f"{mismatch}: fit a profile of the device the runs ran on (`planner "
                        "profile` makes one), or pass --force")
    for line in [w for r in measured for w in r.extra.get("warnings", [])][:MAX_WARNINGS]:
        typer.echo(f"warning: {line}", err=True)
    if not measured:
        reasons = sorted({s.reason for s in skipped})[:3]
        raise SpecError(f"{', '.join(map(str, runs))}: no usable run for profile {gpu.name}"
                        + (f" ({'; '.join(reasons)})" if reasons else ""))
    preset = _stack_of(stack, measured)
    measured = [_with_stack(r.with_gpu(gpu), preset) for r in measured]
    with (hidden() if json_out else nullcontext()), \
            progress(f"fitting {gpu.name} to {len(measured)} runs"):
        if fit:
            names = [n.strip() for n in fit.split(",") if n.strip()]
            base = preset.profile_for(gpu, [r.job.precision for r in measured])
            result = calibrate(base, measured, names=names, cross_validate=cv)
        else:
            from planner.calibrate.fewshot import few_shot_fit

            result = few_shot_fit(gpu, measured, stack=preset, cross_validate=cv)
    figure = None
    if plot is not None:  # drawn before anything is written: a failure leaves both untouched
        from planner.figures import calibration_figure, figure_bytes

        figure = figure_bytes(calibration_figure(result), plot)
    write_text_atomic(out, profile_yaml(result.profile))
    if figure is not None:
        write_bytes_atomic(plot, figure)
    if mismatch:
        typer.echo(f"warning: {mismatch} (fitted anyway: --force)", err=True)
    if json_out:
        typer.echo(json.dumps(fit_summary(result, skipped), indent=2))
        return
    console = Console(stderr=str(out) == "-")  # stdout carries the profile with --out -
    print_fit(result, console, skipped)
    if str(out) != "-":
        console.print(f"wrote {out}")


def matching_gpu(runs, gpu):
    """The runs measured on `gpu`'s type (by registry name or alias); all of them when the runs
    name a single GPU type (a user's own logs, validate records)."""
    types = {r.cluster.gpu.name for r in runs}
    if len(types) <= 1:
        return list(runs)
    names = {gpu.name.lower(), *(a.lower() for a in gpu.aliases)}
    base = str(gpu.provenance.get("base_profile", "")).lower() if gpu.provenance else ""
    if base:
        names.add(base)
    return [r for r in runs if r.cluster.gpu.name.lower() in names]


def _stack_of(text, runs):
    """--stack when given, else the one stack every run names, else the default."""
    from planner.stacks import resolve_stack

    if text:
        return resolve_stack(text)
    named = {r.stack for r in runs}
    return resolve_stack(named.pop() if len(named) == 1 else None)


def _with_stack(run, preset):
    """A run that names no stack (validate records without one) runs the --stack's recipe."""
    from dataclasses import replace

    from planner.stacks import DEFAULT_STACK

    if run.stack != DEFAULT_STACK or preset.name == DEFAULT_STACK:
        return run
    return replace(run, job=preset.job(run.job), stack=preset.name)
