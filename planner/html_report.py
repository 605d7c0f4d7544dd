"""One self-contained HTML report: the ranked plans, the winner's explanation and its figures.
Nothing is fetched when it opens: the figures are inline SVG (a base64 PNG when the SVG would
be large), the style sheet is inline, there is no script."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.explanation import Explanation
    from planner.plan import Plan
    from planner.specs import ClusterSpec, JobSpec, ModelSpec

# Past this size an SVG (thousands of Gantt bars) is inlined as a PNG instead.
MAX_INLINE_SVG_BYTES = 1_500_000

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; padding: 0 1.5em; max-width: 1400px;
       color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table.plans { border-collapse: collapse; font-size: 0.85em; }
table.plans th, table.plans td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
table.plans td.layout { text-align: left; font-family: monospace; white-space: nowrap; }
table.plans tr.winner { background: #eef5ff; font-weight: 600; }
pre { background: #f7f7f7; padding: 0.8em; font-size: 0.82em; white-space: pre-wrap; }
figure { margin: 1em 0; } figure svg, figure img { max-width: 100%; height: auto; }
figcaption { font-size: 0.85em; color: #555; }
"""


def _inline(fig: object) -> str:
    from planner import figures

    svg = figures.svg_text(fig)  # type: ignore[arg-type]
    if len(svg) <= MAX_INLINE_SVG_BYTES:
        return svg
    return f'<img alt="figure" src="data:image/png;base64,{figures.png_base64(fig)}">'  # type: ignore[arg-type]


def _table(plans: Sequence[Plan]) -> str:
    """The ranked plans as the CLI tables them: the step-time band beside the step, '=' for the
    layouts tied with the fastest (bands overlap; tied order is robustness, not step time),
    fits as yes / may (within the memory band of the capacity) / no, and device memory."""
    from planner.report import fits_word

    heads = ["#", "layout", "step s (band)", "tied", "tok/s/GPU", "MFU", "peak GiB",
             "usable GiB", "fits", "device GiB", "bubble", "comm s"]
    runs = any(p.run is not None for p in plans)
    if runs:
        heads += ["days", "GPU-hours", "cost USD", "energy MWh", "ckpt GB", "ckpt every min"]
    rows = []
    for p in plans:
        e = p.estimate
        comm = (e.time_tp_comm_s + e.time_cp_comm_s + e.time_ep_comm_s + e.time_pp_comm_s
                + e.time_dp_comm_exposed_s)
        band = (f" ({e.step_time_low_s:.2f}-{e.step_time_high_s:.2f})"
                if e.step_time_high_s > e.step_time_low_s else "")
        device = "-" if e.device_mem_gb != e.device_mem_gb else f"{e.device_mem_gb:.1f}"
        cells = [str(p.rank), f'<td class="layout">{html.escape(str(p.layout))}</td>',
                 f"{e.step_time_s:.3f}{band}", "=" if p.tied_with_best else "",
                 f"{e.tokens_per_s_per_gpu:,.0f}", f"{e.mfu:.1%}",
                 f"{e.peak_mem_gb:.1f}", f"{e.mem_capacity_gb:.1f}", fits_word(e), device,
                 f"{e.time_pp_bubble_s / e.step_time_s:.1%}", f"{comm:.3f}"]
        if runs and p.run is not None:
            r = p.run
            cells += [f"{r.train_days:,.1f}", f"{r.gpu_hours:,.0f}", f"{r.cost_usd:,.0f}",
                      "-" if r.energy_mwh is None else f"{r.energy_mwh:,.0f}",
                      f"{r.checkpoint_gb:,.0f}", f"{r.checkpoint_interval_min:.0f}"]
        tds = "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells)
        cls = ' class="winner"' if p.rank == 1 else ""
        rows.append(f"<tr{cls}>{tds}</tr>")
    head = "".join(f"<th>{h}</th>" for h in heads)
    return (f'<table class="plans" id="plans"><thead><tr>{head}</tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def _tie_paragraph(ranked: Sequence[Plan], top: int, calibrated: bool) -> str:
    """The CLI's tie note under the table (planner.report.tie_note), or nothing."""
    from planner.report import tie_note

    tied = sum(p.tied_with_best for p in ranked)
    if tied <= 1:
        return ""
    note = tie_note(ranked[:top], tied, calibrated, at_least=tied == len(ranked))
    return f'<p id="ties">{html.escape(note)}</p>'


def _changes_table(exp: Explanation, limit: int = 12) -> str:
    """The winner's one-knob neighbours, re-estimated: what each trades for what."""
    rows = []
    for c in exp.changes[:limit]:
        e = c.plan.estimate
        rows.append(f"<tr><td class=\"layout\">{html.escape(c.what)}</td>"
                    f"<td>{c.d_step_rel:+.1%}</td><td>{c.d_peak_gb:+.1f}</td>"
                    f"<td>{e.peak_mem_gb:.1f}</td><td>{'yes' if e.fits else 'no'}</td>"
                    f"<td class=\"layout\">{html.escape(c.main_term)}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("change", "step time", "peak GiB change",
                                             "peak GiB", "fits", "what moves"))
    return (f'<table class="plans" id="changes"><thead><tr>{head}</tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def html_report(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, ranked: Sequence[Plan],
                top: int, exp: Explanation, notes: Sequence[str], title: str,
                groups: Mapping[str, Sequence[Plan]] | None = None) -> str:
    """The report's HTML text (ranked: solve's plans, best first; the first `top` are tabled,
    all of them feed the Pareto figure; groups: ranked plans of clusters compared there)."""
    from planner import figures

    winner = ranked[0]
    figs = [
        ("schedule", figures.schedule_figure(model, cluster, job, winner.layout),
         "Pipeline schedule of the winner, one row per stage, timed with the cost model's "
         "per-pass times of its slowest stage; grey is idle (the bubble)."),
        ("memory", figures.memory_figure(model, cluster, job, winner.layout),
         "Memory of every pipeline stage of the winner, against the usable capacity."),
        ("pareto", figures.pareto_figure(groups or {str(cluster): list(ranked)}),
         f"Step time against peak memory of the best {len(ranked)} plans; the stepped line is "
         "the Pareto front" + ("; right: step time against GPU count per cluster."
                               if groups and len(groups) > 1 else ".")),
    ]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>planner report: {html.escape(model.name)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<h2>Ranked plans (top {min(top, len(ranked))})</h2>", _table(ranked[:top]),
        _tie_paragraph(ranked, top, cluster.gpu.step_time_rel_error is not None),
        "<h2>Why the winner wins</h2>",
        f'<pre id="explanation">{html.escape(chr(10).join([*exp.lines(), *notes]))}</pre>',
        f"<h2>One change at a time (the winner's {min(12, len(exp.changes))} fastest "
        "neighbours, re-estimated)</h2>", _changes_table(exp),
        "<h2>Figures</h2>",
    ]
    for name, fig, caption in figs:
        parts.append(f'<figure id="fig-{name}" class="figure">{_inline(fig)}'
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("<p><small>Predictions of the planner's analytical cost model; see the "
                 "project's docs/costmodel.md for the formulas and docs/accuracy.md for their "
                 "error against published runs.</small></p></body></html>")
    return "\n".join(parts)
