"""Plans as tables, CSV and JSON (the plan columns of docs/contract.md, in contract order),
and the rich breakdown of one plan. pandas and rich are imported inside the functions: the CLI
must start fast."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.io import write_text_atomic
from planner.plan import MEM_COLUMNS, PLAN_COLUMNS, TIME_COLUMNS, Plan

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console

    from planner.specs import GpuProfile, JobSpec

TIME_LABELS = {
    "time_compute_s": "compute (fwd + bwd + recompute)",
    "time_tp_comm_s": "TP/SP collectives",
    "time_cp_comm_s": "CP ring exchange (exposed)",
    "time_ep_comm_s": "EP all-to-all",
    "time_pp_comm_s": "PP point-to-point",
    "time_pp_bubble_s": "PP bubble",
    "time_dp_comm_exposed_s": "DP gradient comm (exposed)",
    "time_optimizer_s": "optimizer step + fixed overhead",
}
MEM_LABELS = {
    "mem_weights_gb": "weights",
    "mem_grads_gb": "gradients",
    "mem_optimizer_gb": "optimizer state",
    "mem_activations_gb": "activations (+ logits)",
    "mem_other_gb": "collective / ZeRO buffers",
}


def _plain(value: Any) -> Any:
    """numpy scalars -> Python; non-finite floats -> None (valid JSON)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def plan_rows(plans: Sequence[Plan]) -> list[dict[str, Any]]:
    """One dict per plan: the contract columns in order, then any extras."""
    return [{k: _plain(v) for k, v in p.row().items()} for p in plans]


def plans_frame(plans: Sequence[Plan]) -> pd.DataFrame:
    """A DataFrame with PLAN_COLUMNS first (contract order), extras after."""
    import pandas as pd

    rows = plan_rows(plans)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=list(PLAN_COLUMNS))
    extras = [c for c in frame.columns if c not in PLAN_COLUMNS]
    return frame[list(PLAN_COLUMNS) + extras]


def plans_csv(plans: Sequence[Plan]) -> str:
    """CSV text of the plans (header = the plan columns); stage_layers as '7,8,...,8,7' (the
    --stage-layers form)."""
    frame = plans_frame(plans)
    for name in ("stage_layers", "stage_gpu", "stage_time_s", "stage_mem_gb"):
        if name in frame.columns:
            frame[name] = [",".join(str(n) for n in v) if isinstance(v, list) else v
                           for v in frame[name]]
    return frame.to_csv(index=False)


def write_plans_csv(plans: Sequence[Plan], path: str | Path) -> None:
    """Write the plans as CSV, atomically."""
    write_text_atomic(path, plans_csv(plans))


def plans_json(plans: Sequence[Plan]) -> str:
    """A JSON list of plan objects."""
    return json.dumps(plan_rows(plans), indent=2)


def plan_json(plan: Plan) -> str:
    """One plan as a JSON object (estimate --json)."""
    return json.dumps(plan_rows([plan])[0], indent=2)


def job_label(gpu: GpuProfile, job: JobSpec) -> str:
    """The job's precision and non-default recipe, as the tables' titles print it. A profile
    measured with gloo (`planner profile` on CPUs) ran its matmuls in fp32, whatever the job's
    16-bit name says."""
    precision = job.precision
    if (gpu.provenance or {}).get("backend") == "gloo":
        precision = "fp32 (CPU profile)"
    recipe = [name for name, on in (("tp-comm-overlap", job.tp_comm_overlap),
                                     ("no-p2p-overlap", not job.p2p_overlap),
                                     ("no-grad-overlap", not job.grad_overlap)) if on]
    if job.attention != "flash":
        recipe.append(f"{job.attention} attention")
    if job.grad_dtype != "auto":
        recipe.append(f"grads {job.grad_dtype}")
    if job.grad_reduce_dtype != "auto":
        recipe.append(f"grads reduced {job.grad_reduce_dtype}")
    # the MoE recipe where it is not the default (dense jobs leave these at their defaults)
    if job.moe_dispatcher != "alltoall":
        recipe.append(f"{job.moe_dispatcher} dispatcher")
    if job.moe_capacity_factor is not None:
        recipe.append(f"capacity factor {job.moe_capacity_factor:g}")
    if job.moe_routing != "aux_loss":
        recipe.append(f"{job.moe_routing.replace('_', '-')} routing")
    if job.moe_ep_overlap:
        recipe.append("EP overlap")
    return ", ".join([precision, *recipe])


def layout_label(plan: Plan) -> str:
    return str(plan.layout)


def print_plans_table(plans: Sequence[Plan], console: Console, title: str | None = None) -> None:
    """A rich table of the main columns, one row per plan. Cells are never cropped: when the
    console is narrower than the table (a pipe is 80 columns), the table is printed wider."""
    from rich.console import Console as RichConsole
    from rich.table import Table

    headers = [("#", "right"), ("layout", "left"), ("step s", "right"), ("tok/s/GPU", "right"),
               ("MFU", "right"), ("mem/usable GiB", "right"), ("fits", "center"),
               ("bubble", "right"), ("comm s", "right"), ("tied", "center")]
    rows = []
    for p in plans:
        e = p.estimate
        comm = (e.time_tp_comm_s + e.time_cp_comm_s + e.time_ep_comm_s + e.time_pp_comm_s
                + e.time_dp_comm_exposed_s)
        band = ""
        if e.step_time_high_s > e.step_time_low_s:
            band = f" ({e.step_time_low_s:.2f}-{e.step_time_high_s:.2f})"
        rows.append((
            str(p.rank) if p.rank else "-", layout_label(p), f"{e.step_time_s:.3f}{band}",
            f"{e.tokens_per_s_per_gpu:,.0f}",
            f"{e.mfu:.1%}" + (" !" if p.faster_than_published else ""),
            f"{e.peak_mem_gb:.1f}/{e.mem_capacity_gb:.1f}", fits_word(e),
            f"{e.time_pp_bubble_s / e.step_time_s:.1%}" if e.step_time_s else "-", f"{comm:.3f}",
            "=" if p.tied_with_best else "",
        ))
    if any(p.run is not None for p in plans):  # --train-tokens: days and cost of the run
        headers += [("days", "right"), ("GPU-h (M)", "right"), ("$M", "right")]
        rows = [(*r, *((f"{p.run.train_days:,.1f}", f"{p.run.gpu_hours / 1e6:,.3f}",
                        f"{p.run.cost_usd / 1e6:,.2f}") if p.run is not None else ("-",) * 3))
                for r, p in zip(rows, plans, strict=True)]
    table = Table(title=title, show_lines=False)
    for i, (name, justify) in enumerate(headers):
        width = max([len(name), *(len(r[i]) for r in rows)])
        table.add_column(name, justify=justify, no_wrap=True, min_width=width)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(*r)
    needed = RichConsole(width=1000).measure(table).minimum
    if needed > console.width:
        console = RichConsole(file=console.file, width=needed, no_color=console.no_color)
    console.print(table)


def tie_note(plans: Sequence[Plan], tied_total: int, calibrated: bool,
             at_least: bool = False) -> str:
    """The line under a ranking whose first plans tie (tied_total > 1), CLI and HTML alike:
    how many layouts tie, how many are shown, the band they share, and the order within."""
    shown = sum(p.tied_with_best for p in plans)
    best = plans[0].estimate
    rel = float(getattr(best, "ranking_band", float("nan")))
    if not rel == rel:  # no ranking band (a stand-in cost function): the step-time band
        rel = (best.step_time_high_s - best.step_time_low_s) / (2 * best.step_time_s)
    source = ("the profile's calibrated" if calibrated else
              "the measured error between layouts of one job,")
    count = f"at least {tied_total}" if at_least else f"{tied_total}"
    return (f"{count} layouts tie with the fastest ({shown} shown, marked '='): their "
            f"ranking bands overlap ({source} +/-{rel:.1%}, 1 sigma); within the tie the "
            "ranking prefers the layout least exposed to communication and bubble time, then "
            "lower memory (docs/ranking.md)")


def fits_word(e: Any) -> str:
    """The table's fits cell: "yes", "may" (within the memory band of the usable capacity,
    planner.costmodel.memory_status) or "no"."""
    from planner.costmodel.memory import near_capacity

    if not e.fits:
        return "no"
    return "may" if near_capacity(e.peak_mem_gb, e.mem_capacity_gb) else "yes"


def print_estimate(plan: Plan, console: Console) -> None:
    """The breakdown of one plan: time terms, memory terms, throughput, and overflow reasons."""
    from rich.table import Table

    e = plan.estimate
    console.print(
        f"[bold]{plan.layout}[/]  grad_accum {e.grad_accum}, global batch "
        f"{e.global_batch} x {e.seq_len} tokens"
    )
    t = Table(title="time per optimizer step", show_header=True)
    t.add_column("term")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for col in TIME_COLUMNS:
        v = getattr(e, col)
        t.add_row(
            TIME_LABELS.get(col, col),
            f"{v:.4f}",
            f"{v / e.step_time_s:.1%}" if e.step_time_s else "-",
        )
    band = (
        f" (band {e.step_time_low_s:.3f}-{e.step_time_high_s:.3f})"
        if e.step_time_high_s > e.step_time_low_s
        else ""
    )
    t.add_row("[bold]step time[/]", f"[bold]{e.step_time_s:.4f}[/]", f"100%{band}")
    m = Table(title="memory of the most loaded GPU (GiB)", show_header=True)
    m.add_column("term")
    m.add_column("GiB", justify="right")
    for col in MEM_COLUMNS:
        m.add_row(MEM_LABELS.get(col, col), f"{getattr(e, col):.2f}")
    from planner.costmodel import memory_status

    verdict = memory_status(e)
    status = ("[green]fits[/]" if verdict == "fits" else f"[yellow]{verdict}[/]"
              if verdict.startswith("may") else "[red]does not fit[/]")
    m.add_row("[bold]peak (allocated by PyTorch)[/]", f"[bold]{e.peak_mem_gb:.2f}[/]")
    m.add_row("usable capacity", f"{e.mem_capacity_gb:.2f}  {status}")
    if e.device_mem_gb == e.device_mem_gb:  # not NaN
        m.add_row("device shows (nvidia-smi: + allocator cache, CUDA context, NCCL)",
                  f"{e.device_mem_gb:.2f}")
    console.print(t)
    console.print(m)
    console.print(f"most loaded GPU: pipeline stage {e.peak_stage}, holding activations of "
                  f"{e.in_flight:g} micro-batches")
    if plan.layout.stage_gpu and e.stage_time_s:
        st = Table(title="pipeline stages (cluster of pools)", show_header=True)
        for name, justify in (("stage", "right"), ("GPU", "left"), ("layers", "right"),
                              ("s per micro-batch", "right"), ("GiB", "right")):
            st.add_column(name, justify=justify)  # type: ignore[arg-type]
        for i, (gpu, n, t, mem) in enumerate(zip(plan.layout.stage_gpu, plan.layout.stage_layers,
                                                 e.stage_time_s, e.stage_mem_gb, strict=True)):
            st.add_row(str(i), gpu, str(n), f"{t:.4f}", f"{mem:.1f}")
        console.print(st)
    elif plan.layout.pp > 1 and plan.layout.stage_layers:
        from planner.layout import format_stage_layers

        lo = plan.layout
        rule = "even rule" if lo.even_split else "uneven"
        if lo.virtual_split:  # and Megatron's layout string of the same chunks
            from planner.launchers.megatron import layout_string

            console.print(f"layers per virtual stage ({rule}): "
                          f"{format_stage_layers(lo.stage_layers)} "
                          f"('{layout_string(list(lo.stage_layers))}'), per stage "
                          f"{format_stage_layers(lo.layers_per_stage)}")
        else:
            console.print(f"layers per stage ({rule}): {format_stage_layers(lo.stage_layers)}")
    console.print(
        f"throughput {e.tokens_per_s:,.0f} tokens/s ({e.tokens_per_s_per_gpu:,.0f} per GPU), "
        f"model {e.model_tflops_per_gpu:.1f} TFLOP/s/GPU (MFU {e.mfu:.1%}), "
        f"hardware {e.hw_tflops_per_gpu:.1f} TFLOP/s/GPU (HFU {e.hfu:.1%})"
    )
    for line in e.overflow:
        console.print(f"[red]overflow:[/] {line}")


def run_note_lines(plan: Plan, inputs: Any, ref_lr: float | None,
                   ref_batch: float | None) -> list[str]:
    """The training run of a plan (planner.economics) and the LR advice for its global batch,
    as lines; empty when neither was asked for."""
    from planner import economics

    lines: list[str] = []
    if plan.run is not None and inputs is not None:
        lines.append(f"training run of {plan.layout} on {inputs.train_tokens:.4g} tokens:")
        lines += [f"  {s}" for s in economics.run_summary(plan.run, inputs)]
    if ref_lr is not None and ref_batch is not None:
        e = plan.estimate
        steps = plan.run.steps if plan.run is not None else None
        adv = economics.lr_advice(ref_lr, ref_batch, e.global_batch, steps, e.seq_len)
        lines += economics.lr_lines(adv, ref_lr, ref_batch, e.global_batch)
    return lines


def print_run_notes(plan: Plan, inputs: Any, ref_lr: float | None, ref_batch: float | None,
                    console: Console) -> None:
    """Print run_note_lines (markup off: the lines hold brackets and dollar signs)."""
    if inputs is None and ref_lr is None:  # nothing asked: planner.economics stays unloaded
        return
    for line in run_note_lines(plan, inputs, ref_lr, ref_batch):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
