"""`planner solve`: the ranked layouts that fit, best predicted step time first.

    planner solve --model llama70b --cluster 128xA100
    planner solve --model llama3-405b --cluster 16384xH100 --seq-len 8192 --global-batch 2048
    planner solve --model llama70b --cluster 64xA100 --tp 8 --top 5 --csv plans.csv
    planner solve --model mixtral --cluster 64xH100 --json

Every knob not given is searched (tp, pp, dp, cp, ep, vpp, mbs, zero, recompute, sp); a given
one is pinned. Ties in step time go to lower memory, then to fewer groups crossing nodes
(docs/ranking.md). When nothing fits, it says why (the smallest memory any layout needs, what
dominates it, which pin or limit binds) and exits 1; pins no valid layout can honour exit 2.
"""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.app import app
from planner.cli.options import (
    ClusterOpt,
    CpOpt,
    CsvOpt,
    DpOpt,
    EpOpt,
    GlobalBatchOpt,
    JsonOpt,
    MbsOpt,
    ModelOpt,
    PpOpt,
    PrecisionChoice,
    PrecisionOpt,
    ProfileOpt,
    RecomputeOpt,
    SeqLenOpt,
    SpOpt,
    TpOpt,
    VppOpt,
    ZeroOpt,
    layout_pins,
    load_inputs,
)

TopOpt = Annotated[int, typer.Option("--top", min=1, help="How many ranked plans to show/write.")]


@app.command("solve")
def solve_cmd(
    model: ModelOpt,
    cluster: ClusterOpt,
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
    precision: PrecisionOpt = PrecisionChoice.bf16,
    seq_len: SeqLenOpt = None,
    global_batch: GlobalBatchOpt = None,
    profile: ProfileOpt = None,
    top: TopOpt = 10,
    csv: CsvOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search the layouts (CP-SAT) and print the best that fit, ranked by predicted step time."""
    from planner.search import solve

    model_spec, cluster_spec, job = load_inputs(
        model, cluster, profile, seq_len, global_batch, precision
    )
    pins = layout_pins(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, mbs=mbs, zero=zero, recompute=recompute, sp=sp
    )
    plans = solve(model_spec, cluster_spec, job, pins, top_k=top)
    from planner import report

    if csv is not None:
        report.write_plans_csv(plans, csv)
    if as_json:
        typer.echo(report.plans_json(plans))
        return
    from rich.console import Console

    console = Console()
    pinned = " ".join(f"{k}={v}" for k, v in pins.items())
    title = (
        f"{model_spec.name} on {cluster_spec} ({cluster_spec.num_gpus} GPUs), seq {job.seq_len}, "
        f"global batch {job.global_batch}, {job.precision}"
        + (f"; pinned {pinned}" if pinned else "")
    )
    report.print_plans_table(plans, console, title=title)
    if csv is not None:
        console.print(f"wrote {csv}")
