"""Explain one plan: where every second and GiB goes, what binds, which single change helps
most (with its predicted effect), and why its neighbours in the ranking lose.

    exp = explain(model, cluster, job, plan, ranked)   -> Explanation
    exp.lines()                                         -> readable text (CLI, HTML report)

Every number is the cost model's: the effects of changes are the estimates of the changed
layouts (estimate_many over every valid one-knob neighbour), never constants in the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from planner.layout import KNOBS, RECOMPUTE_LEVELS, Layout
from planner.plan import MEM_COLUMNS, TIME_COLUMNS, Plan
from planner.specs import ClusterSpec, JobSpec, ModelSpec

# Memory within this fraction of the usable capacity is called binding: an allocator's
# fragmentation alone moves peaks by a few percent (the profiles' reserve holds 2.3% of HBM
# of slack, docs/hardware.md 3.5), so a plan this close has no room for a longer sequence or
# a larger micro-batch.
MEMORY_BINDS_WITHIN = 0.05
# A time term at or above this share of the step is named among what binds.
TERM_BINDS_SHARE = 0.05
# A change's effect names the time and memory terms that move by at least this fraction of the
# step time / peak memory (a readability threshold, not a model constant).
MOVE_SHOWN = 0.005


@dataclass(frozen=True)
class Change:
    """One neighbour of the plan: what changes and its predicted effect."""

    what: str  # e.g. "recompute selective -> full"
    plan: Plan
    d_step_s: float  # new - old step time, s
    d_step_rel: float  # relative to the old step time
    d_peak_gb: float  # new - old peak memory, GiB
    main_term: str  # the time or memory term that moves most, with its old and new values

    def text(self) -> str:
        from planner.costmodel import memory_status

        status = memory_status(self.plan.estimate)
        fits = "" if status == "fits" else (", may not fit" if status.startswith("may")
                                             else ", does not fit")
        mem = (f"frees {-self.d_peak_gb:.1f} GiB" if self.d_peak_gb < 0
               else f"needs {self.d_peak_gb:.1f} GiB more")
        return (f"{self.what}: step {self.d_step_rel:+.1%} ({self.d_step_s:+.3f} s), {mem}"
                f"{fits}; {self.main_term}")


@dataclass
class Explanation:
    """The explanation of one plan (see the module docstring)."""

    plan: Plan
    time_terms: list[tuple[str, float, float]]  # (label, seconds, share of the step)
    # forward / backward / recompute / weights' FP8 cast / launch overhead seconds per step,
    # then 'of which FP8 casts' (a part of the terms before it, not another term)
    compute_split: dict[str, float]
    mem_terms: list[tuple[str, float, float]]  # (label, GiB, share of the peak)
    binds: list[str]
    groups: list[str]  # which process groups leave the node / NVLink domain
    changes: list[Change]  # every valid one-knob neighbour, best step time first
    best_change: Change | None
    memory_change: Change | None  # the neighbour that frees the most memory per second lost
    neighbours: list[str] = field(default_factory=list)
    blocked_change: Change | None = None  # faster than best_change, but does not fit

    def lines(self) -> list[str]:
        p, e = self.plan, self.plan.estimate
        head = f"plan {p.layout}" + (f" (rank {p.rank})" if p.rank else "")
        out = [f"{head}: step {e.step_time_s:.3f} s, MFU {e.mfu:.1%}, peak "
               f"{e.peak_mem_gb:.1f} of {e.mem_capacity_gb:.1f} GiB usable",
               "where the step goes:"]
        for label, sec, share in self.time_terms:
            extra = ""
            if label.startswith("compute"):
                extra = " (" + ", ".join(f"{k} {v:.3f} s" for k, v in self.compute_split.items()
                                         if v > 0) + ")"
            out.append(f"  {label:<34} {sec:9.4f} s {share:6.1%}{extra}")
        out.append(f"where the memory goes (pipeline stage {e.peak_stage}, {e.in_flight:g} "
                   "micro-batches in flight):")
        for label, gib, share in self.mem_terms:
            out.append(f"  {label:<34} {gib:9.2f} GiB {share:6.1%}")
        out.append(f"  {'peak allocated by PyTorch':<34} {e.peak_mem_gb:9.2f} GiB "
                   "(max_memory_allocated; fits reads this)")
        if e.device_mem_gb == e.device_mem_gb:  # not NaN
            out.append(f"  {'device shows (nvidia-smi)':<34} {e.device_mem_gb:9.2f} GiB "
                       "(+ allocator cache, CUDA context, NCCL buffers)")
        out.append("what binds:")
        out += [f"  - {b}" for b in self.binds]
        out += [f"  - {g}" for g in self.groups]
        out.append("the change that helps most:")
        if self.best_change is not None:
            out.append(f"  {self.best_change.text()}")
        else:
            out.append("  no single-knob change that fits is faster")
        if self.blocked_change is not None:
            out.append(f"  faster, but needs memory it does not have: {self.blocked_change.text()}")
        if self.memory_change is not None and self.memory_change is not self.best_change:
            out.append(f"  to free memory: {self.memory_change.text()}")
        if self.neighbours:
            out.append("why the neighbours in the ranking lose (or win):")
            out += [f"  {n}" for n in self.neighbours]
        return out


def _pools(cluster: Any) -> tuple:
    """The homogeneous clusters a cluster is made of: itself, or its pools."""
    return tuple(getattr(cluster, "pools", None) or (cluster,))


def _group_lines(cluster: ClusterSpec, lo: Layout) -> list[str]:
    """Which groups span more than one NVLink domain (Megatron's order: tp, cp, dp, pp)."""
    out = []
    domain = min(p.domain_gpus for p in _pools(cluster))
    for name in ("TP", "CP", "DP", "PP", "EP"):
        size, domains = _group_span(cluster, lo, name)
        if domains > 1:
            out.append(f"the {name} group ({size} ranks) leaves the NVLink domain of "
                       f"{domain} GPUs: {domains} domains, the slower tier")
    return out or [f"every process group stays inside one NVLink domain of {domain}"]


# The process group behind each communication term (its size and its rank stride, Megatron's
# order tp, cp, dp, pp; the DP term's group is dp x cp).
TERM_GROUPS = {"time_tp_comm_s": "TP", "time_cp_comm_s": "CP", "time_ep_comm_s": "EP",
               "time_pp_comm_s": "PP", "time_dp_comm_exposed_s": "DP"}


def _group_span(cluster: ClusterSpec, lo: Layout, name: str) -> tuple[int, int]:
    """(ranks, NVLink domains spanned) of one group of the layout."""
    from planner.costmodel import comm

    size, stride = {"TP": (lo.tp, 1), "CP": (lo.cp, lo.tp), "DP": (lo.dp * lo.cp, lo.tp),
                    "PP": (lo.pp, lo.tp * lo.cp * lo.dp), "EP": (lo.ep, lo.tp)}[name]
    if size <= 1:
        return size, 1
    pools = _pools(cluster)  # on pools: TP, CP, DP, EP groups stay in a pool, the PP group not
    domains = max(int(comm.Group(p, size, stride).domains) for p in pools)
    return size, max(domains, len(pools)) if name == "PP" else domains


def _binds(plan: Plan, cluster: ClusterSpec) -> list[str]:
    from planner.report import MEM_LABELS, TIME_LABELS

    e = plan.estimate
    out = []
    head = e.mem_capacity_gb - e.peak_mem_gb
    top_mem = max(MEM_COLUMNS, key=lambda c: getattr(e, c))
    if not e.fits:
        out.append(f"memory: {-head:.1f} GiB over the usable capacity; the largest term is "
                   f"{MEM_LABELS[top_mem]} ({getattr(e, top_mem):.1f} GiB)")
    elif head < MEMORY_BINDS_WITHIN * e.mem_capacity_gb:
        out.append(f"memory: only {head:.1f} GiB ({head / e.mem_capacity_gb:.1%}) of headroom; "
                   f"the largest term is {MEM_LABELS[top_mem]} ({getattr(e, top_mem):.1f} GiB)")
    else:
        out.append(f"memory does not bind: {head:.1f} GiB of headroom "
                   f"({head / e.mem_capacity_gb:.0%})")
    terms = [(c, getattr(e, c)) for c in TIME_COLUMNS if c != "time_compute_s"]
    terms.sort(key=lambda t: -t[1])
    named = [(c, v) for c, v in terms if e.step_time_s and v / e.step_time_s >= TERM_BINDS_SHARE]
    for c, v in named:
        where = ""
        if c in TERM_GROUPS:
            size, domains = _group_span(cluster, plan.layout, TERM_GROUPS[c])
            where = (f" ({TERM_GROUPS[c]} group of {size} leaves the node: {domains} NVLink "
                     "domains, the scale-out network)" if domains > 1 else
                     f" ({TERM_GROUPS[c]} group of {size} stays on NVLink)")
        out.append(f"{TIME_LABELS[c]}: {v:.3f} s, {v / e.step_time_s:.1%} of the step{where}")
    if not named:
        out.append(f"compute: {e.time_compute_s / e.step_time_s:.1%} of the step; no other term "
                   f"reaches {TERM_BINDS_SHARE:.0%}")
    return out


def neighbour_layouts(lo: Layout, num_gpus: int) -> list[tuple[str, Layout]]:
    """Every layout one knob away (a degree moves by a factor 2 against dp, so the GPU count
    stays; a trade of tp against pp), each named by what changes."""
    out: list[tuple[str, Layout]] = []

    def add(what: str, **kw: Any) -> None:
        if lo.stage_layers and ("pp" in kw or "vpp" in kw):
            kw["stage_layers"] = ()  # another pipeline: the even rule's stages
        new = replace(lo, **kw)
        if new != lo and new.tp * new.pp * new.dp * new.cp == num_gpus:
            out.append((what, new))
            if "vpp" not in kw and new.vpp > 1:  # a new pp may not admit the old vpp
                out.append((what + ", vpp 1", replace(new, vpp=1)))

    for r in RECOMPUTE_LEVELS:
        add(f"recompute {lo.recompute} -> {r}", recompute=r)
    for z in range(4):
        add(f"zero {lo.zero} -> {z}", zero=z)
    if lo.tp > 1:
        add(f"sp {'on -> off' if lo.sp else 'off -> on'}", sp=not lo.sp)
    for v in {1, lo.vpp * 2, max(lo.vpp // 2, 1)}:
        add(f"vpp {lo.vpp} -> {v}", vpp=v)
    for mb in {lo.mbs * 2, max(lo.mbs // 2, 1)}:
        add(f"mbs {lo.mbs} -> {mb}", mbs=mb)
    for knob in ("tp", "pp", "cp"):
        cur = getattr(lo, knob)
        if lo.dp % 2 == 0:
            add(f"{knob} {cur} -> {cur * 2} (dp {lo.dp} -> {lo.dp // 2})",
                **{knob: cur * 2, "dp": lo.dp // 2})
        if cur % 2 == 0:
            add(f"{knob} {cur} -> {cur // 2} (dp {lo.dp} -> {lo.dp * 2})",
                **{knob: cur // 2, "dp": lo.dp * 2})
    if lo.pp % 2 == 0:
        add(f"tp {lo.tp} -> {lo.tp * 2}, pp {lo.pp} -> {lo.pp // 2}", tp=lo.tp * 2, pp=lo.pp // 2)
    if lo.tp % 2 == 0:
        add(f"tp {lo.tp} -> {lo.tp // 2}, pp {lo.pp} -> {lo.pp * 2}", tp=lo.tp // 2, pp=lo.pp * 2)
    if lo.ep > 1 or lo.ep * 2 <= lo.dp * lo.cp:
        for ep in {lo.ep * 2, max(lo.ep // 2, 1)}:
            add(f"ep {lo.ep} -> {ep}", ep=ep)
    seen, uniq = set(), []
    for what, new in out:
        if new not in seen:
            seen.add(new)
            uniq.append((what, new))
    return uniq


def _main_term(old: Plan, new: Plan) -> str:
    """The time or memory term that moves most between two plans, as 'label old -> new'."""
    from planner.report import MEM_LABELS, TIME_LABELS

    a, b = old.estimate, new.estimate
    t = max(TIME_COLUMNS, key=lambda c: abs(getattr(b, c) - getattr(a, c)))
    m = max(MEM_COLUMNS, key=lambda c: abs(getattr(b, c) - getattr(a, c)))
    dt = abs(getattr(b, t) - getattr(a, t)) / max(a.step_time_s, 1e-12)
    dm = abs(getattr(b, m) - getattr(a, m)) / max(a.peak_mem_gb, 1e-12)
    time_part = f"{TIME_LABELS[t]} {getattr(a, t):.3f} -> {getattr(b, t):.3f} s"
    mem_part = f"{MEM_LABELS[m]} {getattr(a, m):.1f} -> {getattr(b, m):.1f} GiB"
    parts = [p for p, d in ((time_part, dt), (mem_part, dm)) if d >= MOVE_SHOWN]
    return "; ".join(parts) or f"{time_part} (nothing moves by {MOVE_SHOWN:.0%})"


def one_knob_changes(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                     plan: Plan) -> list[Change]:
    """Every valid one-knob neighbour inside the search's space (the caps of
    planner.search.problem: a change the search never offers would not be a fair reason for
    the ranking), estimated by the cost model, fastest first."""
    from planner.costmodel import estimate_many, layout_violations
    from planner.search.problem import VPP_CAP

    def searched(lo: Layout) -> bool:  # every micro-batch dividing batch / dp is searched
        return lo.vpp <= VPP_CAP and lo.tp & (lo.tp - 1) == 0

    if len(_pools(cluster)) > 1:
        cands, ests = _placed_on_pools(model, cluster, job, plan, searched)
    else:
        cands = [(w, lo) for w, lo in neighbour_layouts(plan.layout, cluster.num_gpus)
                 if searched(lo) and not layout_violations(model, cluster, job, lo)]
        ests = estimate_many(model, cluster, job, [lo for _, lo in cands]) if cands else []
    if not cands:
        return []
    old = plan.estimate
    out = []
    for (what, lo), est in zip(cands, ests, strict=True):
        new = Plan(layout=lo, estimate=est)
        out.append(Change(what, new, est.step_time_s - old.step_time_s,
                          est.step_time_s / old.step_time_s - 1, est.peak_mem_gb - old.peak_mem_gb,
                          _main_term(plan, new)))
    out.sort(key=lambda c: (c.d_step_s, c.d_peak_gb))
    return out


def _placed_on_pools(model: ModelSpec, cluster: Any, job: JobSpec, plan: Plan,
                     searched: Any) -> tuple[list, list]:
    """The one-knob neighbours of a plan on a cluster of pools, each placed as the plan is (its
    pools in the same order, the plan's layers per stage where pp is unchanged, else the even
    rule's): ([(what, placed layout)], [Estimate])."""
    from planner.costmodel import Estimate
    from planner.costmodel.pools import estimate_pooled, pool_order
    from planner.errors import LayoutError

    order = pool_order(cluster, [plan.layout])
    base = replace(plan.layout, stage_gpu=())
    cands, ests = [], []
    for what, lo in neighbour_layouts(replace(base, stage_layers=()), cluster.num_gpus):
        if not searched(lo):
            continue
        if lo.pp == base.pp:
            lo = replace(lo, stage_layers=base.stage_layers)
        try:
            placed, cols = estimate_pooled(model, cluster, job, lo, order)
        except LayoutError:
            continue
        cands.append((what, placed))
        ests.append(Estimate.from_batch(cols, 0))
    return cands, ests


def _knob_diff(a: Layout, b: Layout) -> str:
    da, db = a.as_dict(), b.as_dict()
    keys = (*KNOBS, "stage_layers") if da["pp"] == db["pp"] else KNOBS  # layers per stage
    return ", ".join(f"{k} {db[k]} instead of {da[k]}" for k in keys
                     if da[k] != db[k]) or "same knobs"


def compare(plan: Plan, other: Plan) -> str:
    """Why `other` ranks where it does relative to `plan`: the knobs that differ and the terms
    that move most (cost-model numbers)."""
    from planner.report import TIME_LABELS

    a, b = plan.estimate, other.estimate
    d = b.step_time_s - a.step_time_s
    moves = sorted(TIME_COLUMNS, key=lambda c: -abs(getattr(b, c) - getattr(a, c)))[:3]
    terms = "; ".join(f"{TIME_LABELS[c]} {getattr(b, c) - getattr(a, c):+.3f} s" for c in moves
                      if abs(getattr(b, c) - getattr(a, c)) > 1e-6)
    verdict = "loses" if d > 0 else ("wins" if d < 0 else "ties")
    tail = ""
    if d == 0:
        tail = f" (peak {b.peak_mem_gb:.1f} vs {a.peak_mem_gb:.1f} GiB decides)"
    return (f"#{other.rank} {other.layout} {verdict} by {abs(d / a.step_time_s):.1%} "
            f"({d:+.3f} s) [{_knob_diff(plan.layout, other.layout)}]: {terms or 'no term moves'}"
            + tail)


def explain(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan,
            ranked: Sequence[Plan] = ()) -> Explanation:
    """The explanation of `plan`; `ranked` (solve's plans, best first) gives the neighbours."""
    from planner.costmodel import estimate_batch, memory_status
    from planner.report import MEM_LABELS, TIME_LABELS

    e = plan.estimate
    times = [(TIME_LABELS[c], getattr(e, c), getattr(e, c) / e.step_time_s) for c in TIME_COLUMNS]
    cols = estimate_batch(model, cluster, job, [plan.layout])
    m = e.grad_accum
    split = {"forward": m * float(cols["fwd_mb_s"][0]),
             "backward": m * float(cols["bwd_mb_s"][0]),
             "recompute": m * float(cols["recompute_mb_s"][0])}
    casts = m * float(cols["fp8_cast_mb_s"][0]) + float(cols["fp8_weight_cast_s"][0])
    split["weights' FP8 cast"] = float(cols["fp8_weight_cast_s"][0])
    split["launch overhead"] = max(e.time_compute_s - sum(split.values()), 0.0)
    split["of which FP8 casts"] = casts  # inside the passes above (compute.fp8_cast_times)
    mems = [(MEM_LABELS[c], getattr(e, c), getattr(e, c) / e.peak_mem_gb) for c in MEM_COLUMNS]
    changes = one_knob_changes(model, cluster, job, plan)
    # a change that lands within the memory band of the capacity "may not fit": not offered as
    # the change that helps (the ranking puts such plans after those with headroom)
    fitting = [c for c in changes if memory_status(c.plan.estimate) == "fits"]
    best = next((c for c in fitting if c.d_step_s < 0), None)
    if not e.fits:  # the cheapest change that makes it fit helps most
        best = fitting[0] if fitting else None
    limit = best.d_step_s if best is not None else 0.0
    blocked = next((c for c in changes if c not in fitting and c.d_step_s < limit), None)
    savers = [c for c in fitting if c.d_peak_gb < 0]
    mem_change = min(savers, key=lambda c: (max(c.d_step_s, 0.0) / -c.d_peak_gb, c.d_step_s),
                     default=None)
    neighbours = []
    if ranked:
        pos = next((i for i, p in enumerate(ranked) if p.layout == plan.layout), None)
        if pos is None:
            neighbours.append(compare(plan, ranked[0]) + " (the best plan; this one is not "
                              f"among the top {len(ranked)})")
        else:
            for j in (pos - 1, pos + 1, pos + 2):
                if 0 <= j < len(ranked) and j != pos:
                    neighbours.append(compare(plan, ranked[j]))
    return Explanation(plan, times, split, mems, _binds(plan, cluster),
                       _group_lines(cluster, plan.layout), changes, best, mem_change, neighbours,
                       blocked)
