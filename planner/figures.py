"""Figures of plans (matplotlib, imported here only: `planner solve` never loads it).

    fig = schedule_figure(model, cluster, job, layout)   pipeline Gantt chart per stage
    fig = memory_figure(model, cluster, job, layout)     memory per stage vs the capacity
    fig = pareto_figure({"128xA100": plans})             step time vs peak memory (vs GPUs)
    fig = calibration_figure(fit)                        predicted vs measured, with the band
    save(fig, "gantt.png") / save(fig, "gantt.svg"); svg_text(fig); png_base64(fig)

Every number drawn comes from the cost model: the Gantt chart times pipeline.schedule_order
with the slowest stage's per-micro-batch pass times from estimate_batch (so its idle time is
the estimate's time_pp_bubble_s), the memory bars are estimate_batch's per-stage terms.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from planner.calibrate import FitResult
    from planner.layout import Layout
    from planner.plan import Plan
    from planner.specs import ClusterSpec, JobSpec, ModelSpec

COLORS = {"F": "#4C72B0", "B": "#55A868", "R": "#DD8452", "send": "#222222",
          "bubble": "#D9D9D9"}
MEM_COLORS = {"weights": "#4C72B0", "grads": "#8172B2", "optimizer": "#C44E52",
              "activations": "#55A868", "other": "#937860"}


def _figure(width: float, height: float) -> Figure:
    """A figure that needs no display (Agg canvas, no pyplot state)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_bytes(fig: Figure, path: str | Path) -> bytes:
    """The figure as PNG or SVG bytes, by the suffix of `path` (SpecError for another)."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        from planner.errors import SpecError

        raise SpecError(f"figure {path}: use a .png or .svg file name")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=150)
    return buf.getvalue()


def save(fig: Figure, path: str | Path) -> Path:
    """Write the figure as PNG or SVG (by suffix) with planner.io.write_output."""
    from planner.io import write_output

    write_output(path, figure_bytes(fig, path))
    return Path(path)


def svg_text(fig: Figure) -> str:
    """The figure as an inline SVG document (no external references)."""
    buf = io.StringIO()
    # no metadata: the SVG names no URL (matplotlib's creator line has one)
    fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None,
                                              "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE for inlining in HTML


def png_base64(fig: Figure, dpi: int = 110) -> str:
    """The figure as a base64 PNG (for data: URIs)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# ---- pipeline schedule ------------------------------------------------------------------------
def schedule_timeline(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
                      schedule: str | None = None) -> dict[str, Any]:
    """The slowest stage's pass times (estimate_batch), scaled per stage by its own time, laid
    on pipeline.simulate: slots, the slowest stage's pass times (s) and the estimate's columns.
    schedule None: interleaved when vpp > 1, else 1F1B.
    TP/CP/EP communication of a pass is drawn inside it (split as its compute splits)."""
    from planner.costmodel import estimate_batch, pipeline

    cols = estimate_batch(model, cluster, job, [layout])
    one = {k: v[0] for k, v in cols.items()}
    kind = schedule or "1f1b"
    vpp = layout.vpp if kind == "1f1b" else 1
    m = int(one["grad_accum"])
    f, b, r = float(one["fwd_mb_s"]), float(one["bwd_mb_s"]), float(one["recompute_mb_s"])
    scale = float(one["stage_mb_s"]) / (f + b + r)  # comm per micro-batch, drawn pro rata
    tf, tb, tr = f * scale / vpp, (b + r) * scale / vpp, r * scale / vpp
    send = float(one["p2p_send_s"]) if layout.pp > 1 else 0.0
    blocking = not (job.p2p_overlap and vpp > 1)
    # each stage at its own per-micro-batch time (the LM head's and the embedding's stages
    # differ), split into passes as the slowest stage's: the estimate's bubble_time
    import numpy as np

    from planner.costmodel.batch import stage_costs

    if "stage_time_s" in one:  # a cluster of pools: each stage on its own pool's GPU
        per_stage = np.asarray(one["stage_time_s"], dtype=float)[: layout.pp]
    else:
        feats = pipeline.stage_features(model, layout.pp, layout.vpp, layout.stage_layers,
                                        prune=False)
        per_stage = stage_costs(model, cluster, job, [layout], feats)[0][0]
    rel = per_stage / max(float(per_stage.max()), 1e-30)
    slots = pipeline.simulate(layout.pp, vpp, m, tf * rel, tb * rel, send, kind,  # type: ignore[arg-type]
                              blocking)
    return {"slots": slots, "fwd_s": tf, "bwd_s": tb, "recompute_s": tr, "send_s": send,
            "blocking": blocking, "m": m, "vpp": vpp, "schedule": kind, "columns": one}


def schedule_figure(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
                    schedule: str | None = None, max_stages: int = 16) -> Figure:
    """Gantt chart, one row per pipeline stage: forward, backward (its recompute part in its own
    colour at the start), sends, and the idle time (bubble) in grey."""
    from matplotlib.patches import Patch

    tl = schedule_timeline(model, cluster, job, layout, schedule)
    slots = tl["slots"]
    pp = layout.pp
    shown = list(range(pp)) if pp <= max_stages else sorted(
        {round(i * (pp - 1) / (max_stages - 1)) for i in range(max_stages)})
    end = max(s.end for s in slots) if slots else 0.0
    fig = _figure(11, 0.45 * len(shown) + 1.8)
    ax = fig.add_subplot()
    row_of = {s: i for i, s in enumerate(shown)}
    for s in shown:
        ax.broken_barh([(0, end)], (row_of[s] - 0.4, 0.8), color=COLORS["bubble"], zorder=0)
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}  # one collection per row, kind
    rec = tl["recompute_s"]
    for sl in slots:
        if sl.stage not in row_of:
            continue
        row, width = row_of[sl.stage], sl.end - sl.start
        if sl.op.kind == "F":
            bars.setdefault((row, "F"), []).append((sl.start, width))
        else:
            if rec > 0:
                bars.setdefault((row, "R"), []).append((sl.start, rec))
            bars.setdefault((row, "B"), []).append((sl.start + rec, width - rec))
        v = sl.op.chunk * pp + sl.stage
        if tl["send_s"] > 0 and ((sl.op.kind == "F" and v < pp * tl["vpp"] - 1)
                                 or (sl.op.kind == "B" and v > 0)):
            bars.setdefault((row, "send"), []).append((sl.end, tl["send_s"]))
        if len(slots) <= 400 and width > end / 120:
            ax.text(sl.start + width / 2, row, str(sl.op.microbatch), ha="center",
                    va="center", fontsize=6, color="white")
    per_row = len(slots) / max(pp, 1)
    edge = 0.2 if per_row <= 150 else 0.0  # white separators only while bars are wide enough
    for (row, kind), xr in bars.items():
        y, h = (row + 0.22, 0.18) if kind == "send" else (row - 0.4, 0.8)
        ax.broken_barh(xr, (y, h), color=COLORS[kind], lw=edge if kind in "FB" else 0,
                       edgecolor="white", zorder=3 if kind == "send" else 2)
    ax.set_yticks(range(len(shown)), [f"stage {s}" for s in shown])
    ax.invert_yaxis()
    ax.set_xlim(0, end)
    ax.set_xlabel("seconds into the optimizer step (pipeline part)")
    cols = tl["columns"]
    name = {"1f1b": "interleaved 1F1B" if tl["vpp"] > 1 else "1F1B", "gpipe": "GPipe"}[
        tl["schedule"]]
    bubble = end - tl["m"] * tl["vpp"] * (tl["fwd_s"] + tl["bwd_s"])  # idle of the last stage
    ax.set_title(f"{layout}: {name}, {tl['m']} micro-batches, pp {pp}"
                 + (f", vpp {tl['vpp']}" if tl["vpp"] > 1 else "")
                 + f"\nidle {bubble:.3f} s per stage here; the estimate counts bubble "
                 f"{float(cols['time_pp_bubble_s']):.3f} s + p2p "
                 f"{float(cols['time_pp_comm_s']):.3f} s", fontsize=9)
    handles = [Patch(color=COLORS["F"], label="forward"), Patch(color=COLORS["B"],
               label="backward"), Patch(color=COLORS["bubble"], label="idle (bubble)")]
    if tl["recompute_s"] > 0:
        handles.insert(2, Patch(color=COLORS["R"], label="recompute"))
    if tl["send_s"] > 0:
        handles.append(Patch(color=COLORS["send"], label="p2p send"
                             + ("" if tl["blocking"] else " (overlapped)")))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8,
               frameon=False)
    return fig


# ---- memory per stage ------------------------------------------------------------------------
def stage_memory(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                 layout: Layout) -> dict[str, list[float]]:
    """Every pipeline stage's memory terms, GiB (estimate_batch all_stages)."""
    from planner.costmodel import estimate_batch

    cols = estimate_batch(model, cluster, job, [layout], all_stages=True)
    out = {k: [float(x) for x in cols[f"stages_mem_{k}_gb"][0]] for k in MEM_COLORS}
    out["stage"] = [int(x) for x in cols["stages_index"][0]]
    return out


def memory_figure(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout) -> Figure:
    """Stacked bars of each stage's memory terms against the usable capacity and the HBM."""
    mem = stage_memory(model, cluster, job, layout)
    stages = mem["stage"]
    fig = _figure(min(11, 5 + 0.4 * len(stages)), 4.2)
    ax = fig.add_subplot()
    bottom = [0.0] * len(stages)
    for key, color in MEM_COLORS.items():
        ax.bar(stages, mem[key], bottom=bottom, color=color, label=key, width=0.8)
        bottom = [b + v for b, v in zip(bottom, mem[key], strict=True)]
    gpu = cluster.gpu
    ax.axhline(gpu.usable_memory_gib, color="black", ls="--", lw=1,
               label=f"usable {gpu.usable_memory_gib:.1f} GiB")
    ax.axhline(gpu.memory_gib, color="grey", ls=":", lw=1, label=f"HBM {gpu.memory_gib:g} GiB")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_xticks(stages)
    ax.set_title(f"{layout}\nmemory per stage (peak {max(bottom):.1f} GiB on stage "
                 f"{stages[bottom.index(max(bottom))]})", fontsize=9)
    fig.legend(fontsize=7, ncol=4, loc="outside lower center", frameon=False)
    return fig


# ---- Pareto front ------------------------------------------------------------------------------
def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (lower is better), by
    the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def _label_inside(ax: Any, labels: Sequence[tuple[str, float, float]]) -> None:
    """Annotate each (text, x, y) point, the text on the side of the point that faces the
    middle of the axes (left of a point in the right half, below one in the top half) so that
    it stays inside the axes, with an arrow from the text to the point."""
    if not labels:
        return
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    for text, x, y in labels:
        right = x > (x0 + x1) / 2
        top = y > (y0 + y1) / 2
        ax.annotate(text, (x, y), fontsize=7, xytext=(-8 if right else 8, -10 if top else 10),
                    textcoords="offset points", ha="right" if right else "left",
                    va="top" if top else "bottom",
                    arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "grey"})


def pareto_figure(groups: Mapping[str, Sequence[Plan]]) -> Figure:
    """Step time against peak memory of ranked plans, the front drawn; with several clusters
    (groups), a second panel puts step time against GPU count."""
    several = len(groups) > 1
    fig = _figure(11 if several else 7, 4.5)
    ax = fig.add_subplot(1, 2 if several else 1, 1)
    winners: list[tuple[str, float, float]] = []  # (layout, memory, step) of each plan 1
    for label, plans in groups.items():
        pts = [(p.estimate.step_time_s, p.estimate.peak_mem_gb) for p in plans]
        if not pts:
            continue
        ax.scatter([p[1] for p in pts], [p[0] for p in pts], s=14, alpha=0.6, label=label)
        front = pareto_front(pts)
        fx = sorted((pts[i][1], pts[i][0]) for i in front)
        ax.step([x for x, _ in fx], [y for _, y in fx], where="post", lw=1)
        cap = plans[0].estimate.mem_capacity_gb
        ax.axvline(cap, color="grey", ls=":", lw=1)
        winners.append((str(plans[0].layout), pts[0][1], pts[0][0]))
    _label_inside(ax, winners)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("step time (s)")
    ax.set_title("ranked plans: step time vs peak memory (front: stepped line)", fontsize=9)
    if several or len(groups) == 1:
        ax.legend(fontsize=7)
    if several:
        ax2 = fig.add_subplot(1, 2, 2)
        for label, plans in groups.items():
            if plans:
                n = [p.layout.tp * p.layout.pp * p.layout.dp * p.layout.cp for p in plans]
                ax2.scatter(n, [p.estimate.step_time_s for p in plans], s=14, alpha=0.6,
                            label=label)
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("GPUs")
        ax2.set_ylabel("step time (s)")
        ax2.set_title("step time vs GPU count", fontsize=9)
        ax2.legend(fontsize=7)
    return fig


# ---- calibration -------------------------------------------------------------------------------
def calibration_figure(fit: FitResult) -> Figure:
    """Predicted against measured step time, before and after the fit (cross-validated when
    there is one), with the fitted profile's 1-sigma band around the diagonal."""
    import numpy as np

    fig = _figure(6, 5.5)
    ax = fig.add_subplot()
    meas = np.asarray(fit.measured, dtype=float)
    after = fit.pred_cv if fit.pred_cv is not None else fit.pred_after
    lo, hi = float(meas.min()) * 0.7, float(meas.max()) * 1.4
    xs = np.geomspace(lo, hi, 50)
    # the band the fitted profile carries (step_time_rel_error), so the figure and the profile
    # say one number; a fit without one falls back to its residuals' spread
    sigma = fit.profile.step_time_rel_error
    sigma = fit.rel_error_sigma if sigma is None else float(sigma)
    ax.fill_between(xs, xs * np.exp(-sigma), xs * np.exp(sigma), color="#4C72B0", alpha=0.15,
                    label=f"band +/-{sigma:.1%} (1 sigma)")
    ax.plot(xs, xs, color="black", lw=1)
    ax.scatter(meas, fit.pred_before, marker="x", color="grey", label="before the fit")
    ax.scatter(meas, after, color="#4C72B0",
               label=f"after ({fit.cv_method})" if fit.pred_cv is not None else "after (in-sample)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(f"{fit.profile.name}: {len(meas)} runs", fontsize=9)
    ax.legend(fontsize=8)
    return fig
