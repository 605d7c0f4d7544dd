"""The search problem: the knob domains, the pins, the evaluated space of candidate layouts, and
the cost model's terms scaled to integers (the one place where floats become solver integers).

The space (rules shared by the CP-SAT search and the exhaustive oracle; see docs/ranking.md):

- tp: powers of two up to the cluster's scale-up domain, dividing the query heads; key/value heads
  are divided by tp or replicated (kv % tp == 0 or tp % kv == 0).
- cp: 1 unless seq_len >= CP_MIN_SEQ_LEN (context parallelism only pays for long sequences, and
  this bounds the space); then powers of two dividing seq_len with an even chunk per rank of at
  least CP_MIN_TOKENS tokens.
- pp: 1..layers (uneven stages allowed: the cost model gives stages floor/ceil layers).
- dp: divides the global batch; tp * pp * dp * cp = GPUs.
- ep, etp: 1 and the TP size for dense models; MoE: ep divides num_experts, expert-TP etp is 1
  or the TP size (Megatron-Core's default; torchtitan's FSDP2 + EP runs etp 1), and etp * ep
  divides tp * cp * dp, the ranks of one pipeline stage (Megatron-Core's MoE parallel folding,
  planner.layout): ep may exceed dp * cp by borrowing TP ranks.
- vpp: 1, or 2..VPP_CAP when pp > 1 and the (pp, vpp) pair passes checks.vpp_searchable: the
  chunks divide the layers or the layers + 2 (Megatron's flags: how Llama 3 405B put 126
  layers on 16 x 8 chunks), or a layout string states them (a pp the flags cannot interleave:
  DeepSeek-V3's 61 layers on pp 8 x vpp 4; such rows carry their layers per virtual stage,
  Space.layout), and the micro-batches per step (grad_accum) divide by pp (Megatron's
  interleaved 1F1B requires it).
- mbs: every divisor of the sequences a DP rank holds per step, global batch / dp, so that
  mbs * grad_accum * dp = global batch (micro_batch_sizes; no cap: the memory model refuses
  the micro-batches that do not fit).
- zero: 0..3 (1..3 only with dp * cp > 1: nothing to shard over otherwise).
- recompute: none, selective, full, and offload where the GPU profile has a host link
  (checks.offload_allowed).  sp: only with tp > 1 (off and on; on only for MoE, which
  Megatron-Core refuses to train with TP but without SP: checks.moe_needs_sp).

A pinned knob (CLI --tp ... --sp) widens its own domain to the pinned value when the value is
structurally possible (e.g. --cp 2 at seq 4096, --mbs 32, --tp 6 for 48 heads). The pins are
constraints of the selection model, not filters of the space, so the same evaluated space answers
"what if this pin were dropped" for the diagnosis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from planner.costmodel import checks
from planner.errors import SpecError
from planner.layout import RECOMPUTE_LEVELS, Layout, group_span_nodes
from planner.specs import ClusterSpec, JobSpec, ModelSpec

STRUCTURE_KNOBS: tuple[str, ...] = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs")
# the space's columns and the pins: planner.layout.KNOBS with expert-TP after ep
KNOBS: tuple[str, ...] = (*STRUCTURE_KNOBS, "zero", "recompute", "sp")
# cp > 1 searched from this sequence length on (or when pinned): NVIDIA's tuned Llama 3.1 70B and
# 405B H100 recipes run cp 2 at seq 8192 (Megatron-Bridge scripts/performance/configs/llama/
# llama31_workload_base_configs.py LLAMA31_405B_PRETRAIN_CONFIG_H100_BF16_V1; dgxc llama3.1 README)
CP_MIN_SEQ_LEN = 8192
# cp searched while each rank keeps at least this many tokens of a sequence (or when pinned):
# two chunks of 512 under the causal load balancing, already below where the profiles' GEMM
# curves collapse (docs/hardware.md 2.1); it bounds the space on large clusters with small
# batches (Mixtral at seq 32768 on 65536 GPUs: cp up to 16384, 2 tokens per rank, 334k
# layouts; 41k with the bound)
CP_MIN_TOKENS = 1024
VPP_CAP = 16  # most virtual stages per GPU searched (Megatron recipes use 2..8)
TIME_UNIT_S = 1e-6  # solver time unit: one microsecond (coarser when the objective needs it)
# CP-SAT rejects a model whose objective could leave int64: the sum of its coefficients over
# the rows it may choose must stay below this (ortools validates objective overflow)
OBJECTIVE_SUM_LIMIT = 2**62
MEM_UNIT_GIB = 1.0 / 1024  # solver memory unit: one MiB
EVAL_CHUNK = 16384  # rows per cost-model call in evaluate (its temporaries: ~100 arrays a row)
MESH_AXES: tuple[str, ...] = ("tp", "cp", "dp", "pp")  # axes whose groups may cross nodes
# The search's exact shortcuts (docs/solve_speed.md): a split or a top-K selection whose optimum
# is unique is taken without CP-SAT, the split search works a window of chunks ahead and keeps
# the K-th best incrementally. False runs CP-SAT on every split and selection, chunk by chunk:
# the reference that tests/search/test_fast_paths.py and `benchmarks/solve_speed.py --check`
# hold the shortcuts to (identical spaces and plans).
EXACT_SHORTCUTS = True

# (model, cluster, job, columns of knob arrays) -> cost columns; planner.costmodel.estimate_batch
BatchCost = Callable[[ModelSpec, ClusterSpec, JobSpec, Mapping[str, np.ndarray]], dict]


def normalize_pins(pins: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check pin names and values: ints for degrees, recompute by name, sp as bool."""
    out: dict[str, Any] = {}
    for key, value in (pins or {}).items():
        if value is None:
            continue
        if key not in KNOBS:
            raise SpecError(f"unknown layout knob '{key}' (knobs: {', '.join(KNOBS)})")
        if key == "recompute":
            value = getattr(value, "value", value)
            if value not in RECOMPUTE_LEVELS:
                raise SpecError(f"--recompute must be one of {', '.join(RECOMPUTE_LEVELS)}")
        elif key == "sp":
            value = bool(value)
        else:
            if isinstance(value, bool) or int(value) != value:
                raise SpecError(f"--{key} must be an integer, got {value!r}")
            value = int(value)
            if key == "zero" and not 0 <= value <= 3:
                raise SpecError(f"--zero must be 0, 1, 2 or 3, got {value}")
            if key != "zero" and value < 1:
                raise SpecError(f"--{key} must be at least 1, got {value}")
        out[key] = value
    return out


def etp_allowed(tp: int, etp: int, pins: Mapping[str, Any]) -> bool:
    """Expert-TP values searched for a TP size: 1, the TP size, or the pinned --etp."""
    return etp in (1, tp) or etp == pins.get("etp")


def knob_code(knob: str, value: Any) -> int:
    """Integer value of a knob for the solvers (recompute by level index, sp as 0/1)."""
    if knob == "recompute":
        return RECOMPUTE_LEVELS.index(value)
    return int(value)


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def micro_batch_sizes(global_batch: int, dp: int = 1) -> list[int]:
    """Micro-batch sizes searched for a DP degree, sequences: every divisor of the sequences a
    DP rank holds per step (global_batch / dp), powers of two or not. The frameworks' rule:
    Megatron-Core asserts global_batch % (micro_batch * dp) == 0
    (NVIDIA/Megatron-LM megatron/core/num_microbatches_calculator.py@00caa53,
    ConstantNumMicroBatchesCalculator), torchtitan the same of local_batch_size
    (pytorch/torchtitan torchtitan/train.py@000204a); llm-foundry takes any
    device_train_microbatch_size up to the per-rank batch, the last micro-batch uneven if it does
    not divide (mosaicml/llm-foundry llmfoundry/utils/config_utils.py@0081bd2,
    calculate_batch_size_info), and its published MPT recipes run 1..128, non-powers such as
    56 and 104 among them, every one dividing its per-rank batch (planner/data/published_runs.csv,
    llmfoundry_mpt_bench). No upper cap: the largest that fits is the memory model's call."""
    return divisors(global_batch // dp) if global_batch % dp == 0 else []


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


@dataclass(frozen=True)
class Domains:
    """The values each structural knob may take (before the product and divisibility rules)."""

    tp: list[int]
    cp: list[int]
    pp: list[int]
    dp: list[int]
    ep: list[int]
    etp: list[int]
    vpp: list[int]
    mbs: list[int]


def knob_domains(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: Mapping[str, Any],
    tp_across_nodes: bool = False,
) -> Domains:
    """Per-knob domains of the space (module docstring), pinned values added where possible.
    tp_across_nodes: tp may exceed the NVLink domain (`solve --tp-across-nodes`)."""
    n = cluster.num_gpus

    def tp_ok(t: int) -> bool:
        return checks.tp_allowed(model, cluster, t, tp_across_nodes)

    def cp_ok(c: int) -> bool:
        return checks.cp_allowed(job, c)

    tp = [t for t in _powers_of_two(n if tp_across_nodes else min(cluster.domain_gpus, n))
          if tp_ok(t)]
    cp = ([c for c in _powers_of_two(n) if cp_ok(c) and job.seq_len // c >= CP_MIN_TOKENS]
          if job.seq_len >= CP_MIN_SEQ_LEN else [1])
    ep = divisors(model.num_experts) if model.is_moe else [1]
    domains = {
        "tp": tp,
        "cp": cp,
        "pp": list(range(1, model.num_hidden_layers + 1)),
        "dp": [d for d in divisors(job.global_batch) if d <= n],
        "ep": ep,
        "vpp": list(range(1, VPP_CAP + 1)),
        "mbs": micro_batch_sizes(job.global_batch),  # per dp: expand_held_knobs
    }
    widen = {"tp": tp_ok, "cp": cp_ok, "mbs": lambda m: True, "vpp": lambda v: True}
    for knob, ok in widen.items():
        value = pins.get(knob)
        if value is not None and value not in domains[knob] and ok(value):
            domains[knob] = sorted([*domains[knob], value])
    # expert-TP: the TP sizes (etp = tp) and, for MoE, 1 and a pinned --etp (etp_allowed pairs
    # them with tp); a dense model's etp is its tp
    etp_pin = [pins["etp"]] if model.is_moe and pins.get("etp") else []
    domains["etp"] = (sorted({1, *domains["tp"], *etp_pin}) if model.is_moe
                      else list(domains["tp"]))
    return Domains(**domains)


def inner_knobs(tp: int, dp: int, cp: int, pins: Mapping[str, Any],
                offload: bool = False, moe: bool = False) -> list[tuple[int, int, int]]:
    """(zero, recompute code, sp) combinations searched for one set of degrees; offload only
    where the cluster allows it; sp on only for an MoE model with tp > 1."""
    zeros = [0, 1, 2, 3] if dp * cp > 1 else [0]
    if "zero" in pins and pins["zero"] not in zeros:
        zeros.append(pins["zero"])
    sps = ([1] if moe else [0, 1]) if tp > 1 else [0]
    levels = len(RECOMPUTE_LEVELS) if offload else RECOMPUTE_LEVELS.index("offload")
    return [(z, r, s) for z in zeros for r in range(levels) for s in sps]


def expand_structures(
    structures: list[tuple[int, ...]], pins: Mapping[str, Any], offload: bool = False,
    moe: bool = False, support: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Knob columns of the space: each (tp, pp, dp, cp, ep, etp, vpp, mbs) times its inner
    knobs, in structure order then inner_knobs order, without the values the software cannot
    run (`support`, JobSpec.layout_support: supported_rows; the CP-SAT search and the
    exhaustive oracle both expand here). Built with numpy: inner_knobs once per
    distinct (tp, dp, cp), each structure's rows gathered from its padded table (a Python row
    per layout took 0.1 s of Mixtral's 161k rows on 65536 H100 at 2**20 sequences)."""
    width = len(STRUCTURE_KNOBS)
    structs = np.array(sorted(structures), dtype=np.int64).reshape(-1, width)
    if not len(structs):
        return {k: np.zeros(0, dtype=np.int64) for k in KNOBS}
    triples = structs[:, [0, 2, 3]]  # tp, dp, cp: all that inner_knobs reads of a structure
    uniq, group = np.unique(triples, axis=0, return_inverse=True)
    group = group.reshape(-1)
    combos = [inner_knobs(int(t), int(d), int(c), pins, offload, moe) for t, d, c in uniq]
    longest = max(len(c) for c in combos)
    table = np.zeros((len(combos), max(longest, 1), len(KNOBS) - width), dtype=np.int64)
    for g, rows in enumerate(combos):
        if rows:
            table[g, : len(rows)] = rows
    counts = np.array([len(c) for c in combos], dtype=np.int64)[group]
    starts = np.cumsum(counts) - counts
    total = int(counts.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
    inner = table[np.repeat(group, counts), within]
    full = np.concatenate([np.repeat(structs, counts, axis=0), inner], axis=1)
    return supported_rows({k: full[:, i] for i, k in enumerate(KNOBS)}, support or {}, pins)


def supported_rows(knobs: dict[str, Any], support: Mapping[str, Sequence[Any]],
                   pins: Mapping[str, Any]) -> dict[str, Any]:
    """The knob columns without the values the software cannot run (JobSpec.layout_support;
    a pinned knob keeps its pin: the user's word wins, estimate and solve warn)."""
    keep = np.ones(len(knobs["tp"]), dtype=bool)
    for knob, values in support.items():
        if knob in pins or knob not in knobs:
            continue
        keep &= np.isin(knobs[knob], [knob_code(knob, v) for v in values])
    if keep.all():
        return knobs
    return {k: np.asarray(v)[keep] for k, v in knobs.items()}


def expand_held_knobs(structures: list[tuple[int, ...]], domains: Domains, moe: bool,
                      pins: Mapping[str, Any], global_batch: int) -> list[tuple[int, ...]]:
    """Structures enumerated with ep, etp and mbs held at 1 -> every (ep, etp, mbs) of the
    domains that passes their rules, sorted. Holding them is exact: ep = etp = 1 always folds
    (1 divides tp*cp*dp) and mbs = 1 is the weakest batch rule (mbs * dp divides the batch,
    interleaving needs pp to divide grad_accum = batch / (mbs * dp)), so every structure with
    some valid (ep, etp, mbs) is among them. A dense model's etp is its tp."""
    from planner.costmodel.checks import expert_fold_allowed, interleave_batch_allowed

    idx = {k: STRUCTURE_KNOBS.index(k) for k in STRUCTURE_KNOBS}
    out = []
    for st in structures:
        tp, pp, dp, cp, vpp = (st[idx[k]] for k in ("tp", "pp", "dp", "cp", "vpp"))
        experts = [(ep, etp) for ep in domains.ep for etp in domains.etp
                   if etp_allowed(tp, etp, pins) and expert_fold_allowed(tp, cp, dp, ep, etp)
                   ] if moe else [(1, tp)]
        batches = [mbs for mbs in domains.mbs if global_batch % (mbs * dp) == 0
                   and interleave_batch_allowed(pp, vpp, global_batch // (mbs * dp))]
        out += [(tp, pp, dp, cp, ep, etp, vpp, mbs) for ep, etp in experts for mbs in batches]
    return sorted(out)


def crossing_groups(layout: Layout, gpus_per_node: int) -> int:
    """How many of the tp, cp, dp, pp groups span more than one node (0..4): the last tie-break."""
    return sum(group_span_nodes(layout, axis, gpus_per_node) > 1 for axis in MESH_AXES)


def scale_time(step_time_s: np.ndarray, unit_s: float = TIME_UNIT_S) -> np.ndarray:
    """Step time in integer units of unit_s (rounded), saturated at 2**62 (a layout slower than
    that is never chosen; the cast of a larger float to int64 is undefined)."""
    seconds = np.minimum(np.asarray(step_time_s, dtype=float), float(2**62) * unit_s)
    return np.minimum(np.rint(seconds / unit_s), float(2**62)).astype(np.int64)


def scale_memory(
    peak_mem_gb: np.ndarray, fits: np.ndarray, capacity_gib: float
) -> tuple[np.ndarray, int]:
    """Peak memory in integer MEM_UNIT_GIB and the capacity in the same unit. Rounding is clamped
    so that `memory <= capacity` in integers holds exactly where the cost model says `fits`."""
    cap = int(math.floor(capacity_gib / MEM_UNIT_GIB))
    mem = np.rint(np.asarray(peak_mem_gb, dtype=float) / MEM_UNIT_GIB).astype(np.int64)
    fits = np.asarray(fits, dtype=bool)
    return np.where(fits, np.minimum(mem, cap), np.maximum(mem, cap + 1)), cap


def crossing_column(knobs: Mapping[str, np.ndarray], gpus_per_node: int) -> np.ndarray:
    """crossing_groups of every row, computed once per distinct (tp, cp, dp, pp). The four
    degrees are packed into one int64 key (mixed radix, each digit below its column's max + 1)
    so the unique is 1-D: numpy's row-wise unique sorts a structured view, 0.1-0.5 s on the
    161k rows of Mixtral on 65536 H100 at 2**20 sequences (the search builds ~40 spaces)."""
    cols = [np.asarray(knobs[k], dtype=np.int64) for k in ("tp", "cp", "dp", "pp")]
    if not len(cols[0]):
        return np.zeros(0, np.int64)
    key = np.zeros(len(cols[0]), dtype=np.int64)
    radix = 1
    for col in cols:
        base = int(col.max()) + 1
        radix *= base
        key = key * base + col
    if radix >= 2**62:  # cannot pack: the row-wise unique
        degrees = np.stack(cols, axis=1)
        uniq, inverse = np.unique(degrees, axis=0, return_inverse=True)
    else:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        uniq = np.stack(cols, axis=1)[first]
    per_combo = np.array(
        [crossing_groups(Layout(tp=int(t), cp=int(c), dp=int(d), pp=int(p)), gpus_per_node)
         for t, c, d, p in uniq],
        dtype=np.int64,
    )
    return per_combo[inverse.reshape(-1)]


@dataclass
class Space:
    """The evaluated space of one problem: knob columns (one int array per knob, recompute as a
    level code, sp as 0/1), the cost model's columns for them, and the integer-scaled terms."""

    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    knobs: dict[str, np.ndarray]
    columns: dict[str, np.ndarray]
    time_units: np.ndarray = field(init=False)
    time_unit_s: float = field(init=False, default=TIME_UNIT_S)
    mem_units: np.ndarray = field(init=False)
    cap_units: int = field(init=False)
    crossing: np.ndarray = field(init=False)
    # the crossing column of a space with the same (tp, cp, dp, pp) rows (stages._with_splits)
    crossing_given: np.ndarray | None = field(default=None, repr=False)
    # the cost function the columns came from (None: costmodel.estimate_batch); the tie's
    # robustness order costs its rows again with it (planner.search.ties.adverse_columns)
    batch_cost: BatchCost | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self)
        cols = self.columns
        capacity = self.cluster.gpu.usable_memory_gib
        if n:
            capacity = float(np.asarray(cols["mem_capacity_gb"]).reshape(-1)[0])
            self.time_units = scale_time(cols["step_time_s"])
            self.mem_units, self.cap_units = scale_memory(
                cols["peak_mem_gb"], cols["fits"], capacity
            )
            # huge spaces of slow layouts (e.g. DeepSeek-V3 on 256 GPUs: 23k fitting rows of up to
            # 2 h) overflow the objective in microseconds: coarsen the unit by 10 until it fits
            while self._objective_sum_bound() >= OBJECTIVE_SUM_LIMIT:
                self.time_unit_s *= 10
                self.time_units = scale_time(cols["step_time_s"], self.time_unit_s)
        else:
            self.time_units = np.zeros(0, np.int64)
            self.mem_units, self.cap_units = np.zeros(0, np.int64), int(capacity / MEM_UNIT_GIB)
        if self.crossing_given is not None:  # the same degrees as a space already built
            self.crossing = self.crossing_given
        else:
            self.crossing = crossing_column(self.knobs, self.cluster.gpus_per_node)

    def _objective_sum_bound(self) -> float:
        """Upper bound of the objective's coefficient sum over the fitting rows (float)."""
        wt, wm = self.objective_weights
        fit = self.mem_units <= self.cap_units
        return float(np.sum(self.time_units[fit], dtype=float) * wt
                     + np.sum(self.mem_units[fit], dtype=float) * wm + 4.0 * fit.sum())

    def __len__(self) -> int:
        return len(self.knobs["tp"])

    def layout(self, i: int) -> Layout:
        """Layout of row i. Interleaved chunks that Megatron's flags cannot split evenly
        (checks.vpp_allowed false) carry their layers per virtual stage, the even chunk rule's
        (the counts the cost model costs), which a pipeline layout string states."""
        k = self.knobs
        split = tuple(k["stage_layers"][i]) if "stage_layers" in k else ()
        pp, vpp, layers = int(k["pp"][i]), int(k["vpp"][i]), self.model.num_hidden_layers
        split = split or checks.layout_string_chunks(layers, pp, vpp)
        return Layout(
            tp=int(k["tp"][i]),
            pp=pp,
            dp=int(k["dp"][i]),
            cp=int(k["cp"][i]),
            ep=int(k["ep"][i]),
            etp=int(k["etp"][i]),
            vpp=vpp,
            mbs=int(k["mbs"][i]),
            zero=int(k["zero"][i]),
            recompute=RECOMPUTE_LEVELS[int(k["recompute"][i])],  # type: ignore[arg-type]
            sp=bool(k["sp"][i]),
            stage_layers=split,
        )

    @cached_property
    def objective_weights(self) -> tuple[int, int]:
        """(time weight, memory weight) of the lexicographic objective
        time * wt + memory * wm + crossing: step time first, then memory, then crossing groups."""
        span_range = len(MESH_AXES) + 1
        mem_range = self.cap_units + 2  # above the capacity memory only means "does not fit"
        return mem_range * span_range, span_range

    @cached_property
    def keys(self) -> np.ndarray:
        """The objective value of every row (int64), as the solver computes it."""
        wt, wm = self.objective_weights
        mem = np.minimum(self.mem_units, self.cap_units + 1)
        # saturate the time of rows too slow for int64 (never fitting rows: the unit coarsening
        # keeps the fitting rows' sum below 2**62) so no product wraps around
        time = np.minimum(self.time_units, OBJECTIVE_SUM_LIMIT // wt)
        return time * wt + mem * wm + self.crossing

    @cached_property
    def fits(self) -> np.ndarray:
        return self.mem_units <= self.cap_units

    def pin_mask(self, pins: Mapping[str, Any]) -> np.ndarray:
        """Rows that honour every pin."""
        mask = np.ones(len(self), dtype=bool)
        for knob, value in pins.items():
            mask &= self.knobs[knob] == knob_code(knob, value)
        return mask


def evaluate(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    knobs: dict[str, np.ndarray],
    batch_cost: BatchCost | None = None,
) -> Space:
    """Evaluate knob columns with the cost model (planner.costmodel.estimate_batch by default,
    EVAL_CHUNK rows at a time: it is elementwise in the rows, so the columns are the same as in
    one call, and its temporaries stay small; Mixtral on 65536 H100 at 2**20 sequences: 161k
    rows, measured in docs/solve_speed.md). A given batch_cost sees every row at once."""
    chunked = batch_cost is None
    if batch_cost is None:
        from planner.costmodel import estimate_batch as batch_cost
    n = len(knobs["tp"])
    if n <= EVAL_CHUNK or not chunked:
        columns = batch_cost(model, cluster, job, knobs) if n else {}
    else:
        parts = [batch_cost(model, cluster, job, {k: v[i:i + EVAL_CHUNK] for k, v in knobs.items()})
                 for i in range(0, n, EVAL_CHUNK)]
        columns = {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}
    return Space(model, cluster, job, knobs, columns, batch_cost=None if chunked else batch_cost)


@dataclass(frozen=True)
class Split:
    """A split's layers per stage (empty when no split fits) and its objective values: what the
    stage split (search.stages) asks and the CP-SAT split model (search.cpsat) answers."""

    counts: tuple[int, ...] = ()
    slowest: int = 0
    peak: int = 0
