"""`planner validate`: run one layout for real under torchrun and append what it measured.

    planner validate --model llama2-7b --layers 4 --hidden 256 --heads 8 --ffn 512 --vocab 1024 \\
        --seq-len 128 --global-batch 8 --tp 2 --dp 2 --zero 3 --steps 5 --out runs.jsonl
    planner validate --model llama70b --layers 8 --tp 8 --pp 2 --dp 4 --nnodes 8 \\
        --rdzv-endpoint node0:29500 --out runs.jsonl --print-only   # then run it on every node

Layout knobs default as in `estimate` (zero 1, selective recompute, sp when tp > 1). The
scale-down options (--layers --hidden --heads --kv-heads --ffn --vocab) shrink the model's shape;
the prediction is made for the model as it runs. Exit 0 when the run is ok, 1 when it failed
(the record says why), 2 on bad input, 128 + signal on SIGTERM, SIGINT or SIGHUP (torchrun and
its workers ended, a record with ok false and "interrupted by SIG..." appended). A terminal
shows the steps as a progress bar.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated

import typer

from planner import limits
from planner.cli.options import (
    BackendOpt,
    CpOpt,
    DpOpt,
    EpOpt,
    GlobalBatchOpt,
    MbsOpt,
    ModelOpt,
    NnodesOpt,
    PpOpt,
    ProfileOpt,
    RdzvEndpointOpt,
    RecomputeOpt,
    SeqLenOpt,
    SpOpt,
    StackOpt,
    StageLayersOpt,
    TpOpt,
    VppOpt,
    ZeroOpt,
    parse_stage_layers,
    records_option,
    timeout_option,
)
from planner.cli.typer_app import app


def _dim(flag: str, what: str, upper: int):
    return Annotated[int | None, typer.Option(flag, min=1, max=upper, help=f"Scale down: {what}.")]


@app.command("validate")
def validate_cmd(
    model: ModelOpt,
    out: records_option("--out", "JSON-lines file to append to.", "-o"),
    tp: TpOpt = None,
    pp: PpOpt = None,
    dp: DpOpt = None,
    cp: CpOpt = None,
    ep: EpOpt = None,
    vpp: VppOpt = None,
    mbs: MbsOpt = None,
    zero: ZeroOpt = None,
    recompute: RecomputeOpt = None,
    sp: SpOpt = None,
    seq_len: SeqLenOpt = None,
    global_batch: GlobalBatchOpt = None,
    stage_layers: StageLayersOpt = None,
    layers: _dim("--layers", "transformer layers", limits.MAX_LAYERS) = None,
    hidden: _dim("--hidden", "hidden size", limits.MAX_HIDDEN) = None,
    heads: _dim("--heads", "attention heads", limits.MAX_HEADS) = None,
    kv_heads: _dim("--kv-heads", "key/value heads", limits.MAX_HEADS) = None,
    ffn: _dim("--ffn", "MLP hidden size", limits.MAX_FFN) = None,
    vocab: _dim("--vocab", "vocabulary size", limits.MAX_VOCAB) = None,
    steps: Annotated[int, typer.Option("--steps", min=1, max=limits.MAX_STEPS,
                                       help="Measured steps.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=0, max=limits.MAX_STEPS,
                                        help="Unmeasured steps first.")] = 2,
    profile: ProfileOpt = None,
    stack: StackOpt = None,
    nproc: Annotated[int | None, typer.Option(
        "--nproc", min=1, max=limits.MAX_NPROC,
        help="Processes per node (default: tp*pp*dp*cp / nnodes).")] = None,
    nnodes: NnodesOpt = 1,
    rdzv_endpoint: RdzvEndpointOpt = None,
    backend: BackendOpt = None,
    timeout: timeout_option("Kill the run after this many seconds (it counts as failed).") = 600.0,
    seed: Annotated[int, typer.Option("--seed", min=0, max=limits.MAX_SEED,
                                      help="Seed of weights and synthetic data.")] = 0,
    pp_schedule: Annotated[str, typer.Option(
        "--pp-schedule", help="1f1b or gpipe (vpp > 1 always runs interleaved 1F1B).")] = "1f1b",
    check: Annotated[bool, typer.Option("--check/--no-check", help="Compare step 1 with a "
                                        "single-process run of the same model and data.")] = True,
    print_only: Annotated[bool, typer.Option("--print-only", help="Write the run config and print "
                                             "the torchrun command; do not run it.")] = False,
) -> None:
    """Run a layout for real under torchrun and append the measured record to --out."""
    from rich.console import Console

    from planner.errors import SpecError
    from planner.layout import default_layout
    from planner.registry import load_gpu, load_model
    from planner.specs import JobSpec
    from planner.stacks import resolve_stack
    from planner.validate.config import ScaleDown, require_supported, scaled_spec
    from planner.validate.launch import execute, local_profile, prepare

    if pp_schedule not in ("1f1b", "gpipe"):
        raise SpecError(f"unknown --pp-schedule '{pp_schedule}' (1f1b or gpipe)")
    spec = scaled_spec(load_model(model), ScaleDown(layers=layers, hidden=hidden, heads=heads,
                                                    kv_heads=kv_heads, ffn=ffn, vocab=vocab))
    counts = parse_stage_layers(stage_layers)
    tp, pp, dp = tp or 1, pp or len(counts) or 1, dp or 1
    layout = dataclasses.replace(  # dp given (1 when not): the knobs left out at their defaults
        default_layout(0, "", tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, mbs=mbs, zero=zero,
                       recompute=recompute, sp=sp), stage_layers=counts)
    preset = resolve_stack(stack)  # the prediction's recipe and factors; the record names it
    job = preset.job(JobSpec(seq_len=seq_len or spec.seq_len,
                             global_batch=global_batch or spec.global_batch), stack or "")
    require_supported(spec, layout, job.global_batch, job.seq_len, backend)  # before torch
    gpu = load_gpu(str(profile)) if profile is not None else local_profile()
    gpu = preset.profile_for(gpu, job.precision) if gpu is not None else None
    if not print_only and layout.num_gpus % nnodes == 0:  # refuse what this machine cannot hold
        from planner.validate.launch import check_machine

        check_machine(spec, layout, job, gpu, nproc or layout.num_gpus // nnodes, check=check)
    launch = prepare(
        spec, layout, job, out=out, steps=steps, warmup=warmup, profile=gpu,
        profile_ref=str(profile) if profile is not None else (gpu.name if gpu else None),
        nproc=nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, backend=backend, seed=seed,
        check=check, pp_schedule=pp_schedule, timeout_s=timeout, extra={"stack": preset.name},
    )
    console = Console(stderr=True, soft_wrap=True)
    console.print(f"[bold]{spec.name}[/] {layout} on {launch.nnodes}x{launch.nproc_per_node} "
                  f"processes ({launch.backend})")
    env = " ".join(f"{k}={v}" for k, v in launch.env.items())
    console.print(f"torchrun command{' (run it on every node)' if nnodes > 1 else ''}:",
                  highlight=False)
    typer.echo(f"{env + ' ' if env else ''}{launch.command_line}")
    if print_only:
        return
    from planner.interrupts import raise_on_signals
    from planner.validate.launch import require_torch

    require_torch()

    with raise_on_signals():  # SIGTERM/SIGINT/SIGHUP: record ok false, exit 128 + signal
        record = execute(launch, timeout_s=timeout)
    _print_record(console, record, out)
    if not record.get("ok"):
        sys.exit(1)  # typer.Exit would be swallowed by planner.cli.main (standalone_mode=False)


def _print_record(console, record: dict, out: Path) -> None:
    """Measured vs predicted, memory, the correctness check, or the failure reason."""
    from rich.markup import escape

    if not record.get("ok"):
        console.print(f"[red]run failed:[/] {escape(str(record.get('error')))} "
                      f"(appended to {out})", highlight=False)
        return
    pred = record.get("predicted_step_time_s")
    meas = record["measured_step_time_s"]
    line = f"step time {meas:.4g} s measured (median of {len(record['measured_step_times_s'])})"
    if pred:
        line += f", {pred:.4g} s predicted ({(pred - meas) / meas:+.1%})"
    elif record.get("prediction_error"):
        line += f"; no prediction: {escape(record['prediction_error'])}"
    console.print(line, highlight=False)
    console.print(f"peak memory {record['measured_peak_mem_gb']:.3g} GiB, losses "
                  + ", ".join(f"{x:.4f}" for x in record["losses"]), highlight=False)
    if record.get("match") is not None:
        verdict = "[green]match[/]" if record["match"] else "[red]MISMATCH[/]"
        console.print(
            f"step 1 vs single process: loss {record['loss_rel_error']:.1e}, grad norm "
            f"{record['grad_norm_rel_error']:.1e} relative (tolerance "
            f"{record['match_tolerance_rel']:.0e}) {verdict}", highlight=False)
    console.print(f"appended to {out}", highlight=False)
