"""Layout: how one training job is laid out on the cluster, and the rank order.

Rank order (one documented mapping, Megatron-LM's default "tp-cp-ep-dp-pp"): tp is innermost
(consecutive ranks), then cp, then dp, and pp outermost:

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

So a TP group is `tp` consecutive ranks (inside one node when tp <= GPUs per node), a CP group
strides by tp, a DP group by tp*cp, and a PP group by tp*cp*dp. The validate subpackage builds
its DeviceMesh with mesh_dim_names ("pp", "dp", "cp", "tp"), outermost first, which is this order.

Expert layers are laid out on the same tp*cp*dp ranks of each pipeline stage, folded anew
(Megatron-Core's MoE parallel folding): expert-TP (etp) innermost, then expert parallelism (ep),
then the expert-data-parallel replicas (edp = tp*cp*dp / (etp*ep)):

    stage-local rank = etp_rank + etp * (ep_rank + ep * edp_rank)

so etp*ep must divide tp*cp*dp, independently of the attention layout (Megatron-LM
megatron/core/parallel_state.py initialize_model_parallel at d98e8a6: expert_data_parallel_size
= world_size // (expert_tensor_parallel_size * expert_model_parallel_size * pp), "world_size is
not divisible by expert_tensor_model_pipeline_parallel size", the pp groups of both generators
equal, expert order "tp-ep-dp-pp" with cp 1; megatron/training/arguments.py: num_experts a
multiple of expert_model_parallel_size, expert_tensor_parallel_size defaulting to the TP size).
torchtitan's FSDP2 + EP (torchtitan/distributed/parallel_dims.py at b5bcd76: ep divides
dp_shard * cp * tp, sparse mesh (pp, dp_replicate, efsdp, ep)) is the etp = 1 case. So ep may
exceed dp*cp by borrowing TP ranks (etp < tp). etp = 0 in a Layout means "the TP size"
(Megatron's default); the layout stores 0 whenever etp equals tp, so the two spellings are one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, get_args

from planner.errors import LayoutError

# offload: nothing recomputed, every layer's activations copied to host memory in forward and
# back in backward (Megatron-Core cpu_offloading; torch.autograd.graph.save_on_cpu in validate)
Recompute = Literal["none", "selective", "full", "offload"]
RECOMPUTE_CODES: dict[str, str] = {
    "none": "none", "selective": "sel", "full": "full", "offload": "offload"}
RECOMPUTE_LEVELS: tuple[str, ...] = get_args(Recompute)  # in this order: codes 0..3 in the search
MESH_DIM_NAMES = ("pp", "dp", "cp", "tp")  # outermost first, see the module docstring
# The knobs of a layout, in this order everywhere (search columns, plan rows, runs tables): the
# fields of Layout before the per-stage ones
KNOBS: tuple[str, ...] = ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero", "recompute", "sp")
# What a knob the user did not give is (estimate, explain --tp/--pp, validate, a launcher config
# that leaves it out: default_layout). Layout()'s own field defaults are the bare layout (ZeRO 0,
# no recompute, no SP): what a layout *is* when a knob is absent, as the runs tables and tests
# build it; these are what a user *gets* when they do not say.
DEFAULT_ZERO = 1  # Megatron's distributed optimizer: the common large-model default
DEFAULT_RECOMPUTE = "selective"  # Korthikanti 2022: selective + SP is Megatron's recommended mode


@dataclass(frozen=True, order=True)
class Layout:
    """Parallel degrees and knobs of one plan. Degrees are counts of GPUs; mbs in sequences."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1  # virtual pipeline stages per GPU (interleaved 1F1B); 1 = plain 1F1B
    mbs: int = 1  # micro-batch size, sequences
    zero: int = 0  # 0..3: ZeRO stage / FSDP sharding over DP
    recompute: Recompute = "none"
    sp: bool = False  # sequence parallelism alongside TP
    # layers per pipeline stage, first to last; () = the even rule (stage_layer_counts below:
    # floor/ceil, the extra layers to the inner stages first). With vpp > 1 either pp entries
    # (each stage's chunks together, the even rule's) or pp * vpp entries: decoder layers per
    # virtual stage (model chunk) in layer order, chunk c on stage c mod pp, as Megatron's
    # --pipeline-model-parallel-layout states them (a chunk may hold none)
    stage_layers: tuple[int, ...] = ()
    # GPU profile name of each pipeline stage on a cluster of pools; () = the cluster's one GPU
    stage_gpu: tuple[str, ...] = ()
    # expert tensor parallelism (MoE): 0 = the TP size (Megatron's default), stored 0 when equal
    etp: int = 0

    def __post_init__(self) -> None:
        if self.etp == self.tp:
            object.__setattr__(self, "etp", 0)
        if not isinstance(self.stage_layers, tuple):  # a list read back from JSON
            object.__setattr__(self, "stage_layers", tuple(int(n) for n in self.stage_layers))
        if not isinstance(self.stage_gpu, tuple):
            object.__setattr__(self, "stage_gpu", tuple(str(g) for g in self.stage_gpu))

    @property
    def expert_tp(self) -> int:
        """GPUs one expert's matrices are split over (etp, or tp where etp is 0)."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert in one pipeline stage: tp*cp*dp / (etp*ep) (at least 1)."""
        return max(self.tp * self.cp * self.dp // (self.expert_tp * self.ep), 1)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def grad_accum(self, global_batch: int) -> int:
        """Micro-batches per DP rank per step (global_batch = mbs * grad_accum * dp)."""
        return global_batch // (self.mbs * self.dp)

    def __str__(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp:
            parts.append(f"etp{self.etp}")
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        parts += [f"mbs{self.mbs}", f"z{self.zero}", RECOMPUTE_CODES[self.recompute]]
        if self.sp:
            parts.append("sp")
        if self.stage_layers and not self.even_split:
            parts.append("L" + format_stage_layers(self.stage_layers))
        if self.stage_gpu:
            runs: list[list] = []
            for name in self.stage_gpu:
                if runs and runs[-1][0] == name:
                    runs[-1][1] += 1
                else:
                    runs.append([name, 1])
            parts.append("@" + "+".join(f"{n}x{name}" for name, n in runs))
        return "-".join(parts)

    @property
    def even_split(self) -> bool:
        """Whether the stages hold what the even rule gives them (always for ())."""
        if not self.stage_layers:
            return True
        total = sum(self.stage_layers)
        if self.virtual_split:
            return list(self.stage_layers) == stage_layer_counts(total, self.pp * self.vpp)
        return list(self.stage_layers) == [
            len(s) for s in stage_layers(total, self.pp, self.vpp)]

    @property
    def virtual_split(self) -> bool:
        """Whether stage_layers lists every virtual stage (pp * vpp entries, vpp > 1)."""
        return self.vpp > 1 and len(self.stage_layers) == self.pp * self.vpp

    def chunk_counts(self, num_layers: int) -> list[int]:
        """Decoder layers of each model chunk in layer order (pp * vpp of them, chunk c on stage
        c mod pp) as the planner costs them: the layers per virtual stage, the explicit layers
        per stage (vpp 1), else the even rule over pp * vpp chunks. What exports write."""
        if self.virtual_split or (self.stage_layers and self.vpp == 1):
            return list(self.stage_layers)
        return stage_layer_counts(num_layers, self.pp * self.vpp)

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Layers of each pipeline stage (its chunks together); () for the even rule."""
        if self.virtual_split:
            return tuple(chunk_totals(self.stage_layers, self.pp))
        return self.stage_layers

    def as_dict(self) -> dict:
        out = asdict(self)
        del out["etp"]
        out["stage_layers"] = list(self.stage_layers)
        if self.stage_gpu:
            out["stage_gpu"] = list(self.stage_gpu)
        else:
            del out["stage_gpu"]  # one GPU kind: the plan names no per-stage GPU
        out["etp"] = self.expert_tp  # the plan column etp (after the contract's columns)
        return out


def stage_layer_counts(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage (or per model chunk) for an uneven split: every one gets
    floor(L/pp); the L mod pp extra layers go first to the inner ones (1 .. pp-2), then to the
    first, then to the last, because the first stage also holds the embedding and the most
    in-flight micro-batches and the last holds the LM head. When pp divides L + 2 this is
    Megatron's account_for_embedding/loss_in_pipeline_split (the embedding and the loss each
    take one layer's slot: L = 126 on 16 stages gives 7, 8 x 14, 7)."""
    base, extra = divmod(num_layers, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + [0] + ([pp - 1] if pp > 1 else [])
    for stage in order[:extra]:
        counts[stage] += 1
    return counts


def chunk_totals(chunks: tuple[int, ...] | list[int], pp: int) -> list[int]:
    """Layers of each pipeline stage from the layers of each model chunk (virtual stage c on
    stage c mod pp, Megatron's interleaving)."""
    out = [0] * pp
    for c, n in enumerate(chunks):
        out[c % pp] += n
    return out


def chunk_layers(chunks: tuple[int, ...] | list[int], pp: int) -> list[list[int]]:
    """Layer indices held by each stage for explicit layers per chunk (chunk c, holding the
    next chunks[c] layers in order, on stage c mod pp)."""
    stages: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for c, n in enumerate(chunks):
        stages[c % pp].extend(range(start, start + n))
        start += n
    return stages


def chunks_of_stages(totals: list[int] | tuple[int, ...], vpp: int,
                     empty_last: bool = False) -> list[int]:
    """Layers per virtual stage (pp * vpp, layer order) for given layers per stage: each
    stage's layers spread over its vpp chunks by stage_layer_counts (the extras to its inner
    chunks first), the first stage's reversed so its first chunk, beside the embedding, holds
    the fewest, as the last stage's last chunk does beside the loss (NVIDIA's DeepSeek-V3
    recipe 'Et|(tt|)*30mL' lightens both end chunks the same way). With stage times linear in
    a stage's layers (costmodel.pipeline) the stages cost the same under any spread, but
    interleaved rounds move at their slowest chunk (costmodel.batch.round_period): the split
    search writes this spread or, with empty_last, the one whose last chunk holds no layer,
    whichever rounds run faster."""
    pp = len(totals)
    per = [stage_chunks(n, vpp, i == 0) for i, n in enumerate(totals)]
    if empty_last and vpp > 1 and totals[-1] >= vpp - 1:
        # the last chunk beside the loss holds no layer, NVIDIA's 'Et|(tt|)*30mL': with a
        # heavy LM head (and MTP) it would otherwise slow the last round (batch.round_period)
        per[-1] = stage_layer_counts(totals[-1], vpp - 1) + [0]
    return [per[c % pp][c // pp] for c in range(pp * vpp)]


def stage_chunks(total: int, vpp: int, first_stage: bool) -> list[int]:
    """One stage's layers over its vpp chunks as chunks_of_stages spreads them: the extras to
    its inner chunks first (stage_layer_counts), the first stage's reversed."""
    counts = stage_layer_counts(total, vpp)
    return counts[::-1] if first_stage else counts


def parse_pipeline_layout(text: str) -> list[tuple[int, int, int, int]]:
    """(embeddings, decoder layers, MTP layers, losses) of each virtual stage of a Megatron
    pipeline layout string, expanded as Megatron-Core does (NVIDIA/Megatron-LM
    megatron/core/transformer/pipeline_parallel_layer_layout.py @ 00caa53,
    PipelineParallelLayerLayout.parse_str_to_list: commas are cosmetic, '(x|y)*n' then 'x*n'
    unrolled, then split on '|'; E embedding, t decoder layer, m MTP layer, L loss) and checked
    by its validate_layer_layout rules: E opens the first virtual stage and L closes the last,
    once each; MTP layers come after every decoder layer. LayoutError otherwise."""
    import re

    s = text.replace(",", "").replace(" ", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    where = f"pipeline layout '{text}'"
    if not s or set(s) - set("ELtm|"):
        raise LayoutError(f"{where}: characters other than E, L, t, m, '|', '(...)*n' and "
                          "'x*n'")
    flat = s.replace("|", "")
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 \
            or flat.count("L") != 1:
        raise LayoutError(f"{where}: the embedding E must open the first stage and the loss L "
                          "close the last, once each")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise LayoutError(f"{where}: decoder layers (t) must come before the MTP layers (m)")
    chunks = s.split("|")
    if not chunks[0].startswith("E"):
        raise LayoutError(f"{where}: the embedding E must open the first stage")
    return [(c.count("E"), c.count("t"), c.count("m"), c.count("L")) for c in chunks]


def implied_vpp(n_counts: int, pp: int, vpp: int | None) -> int:
    """Virtual stages per pipeline stage that `n_counts` explicit layer counts state on `pp`
    stages: vpp (or 1) for one count per stage, vpp for one per virtual stage (n_counts =
    pp * vpp, Megatron's pipeline layout: vpp must be given, as its string's length is read
    with --pipeline-model-parallel-size); LayoutError otherwise."""
    if n_counts == pp:
        return vpp or 1
    if vpp and vpp > 1 and n_counts == pp * vpp:
        return vpp
    chunks = f" (pp*vpp = {pp * vpp} with vpp {vpp})" if vpp and vpp > 1 else ""
    raise LayoutError(f"--stage-layers gives {n_counts} stages but --pp is {pp}{chunks}")


def stage_layers(num_layers: int, pp: int, vpp: int) -> list[list[int]]:
    """Layer indices held by each stage. vpp > 1 (interleaved): the model is cut into pp * vpp
    contiguous chunks (split as stage_layer_counts does), chunk c on stage c mod pp (Megatron's
    interleaving)."""
    return chunk_layers(stage_layer_counts(num_layers, pp * vpp), pp)


def default_layout(num_gpus: int, cluster_name: str, tp: int, pp: int, dp: int | None = None,
                   cp: int | None = None, ep: int | None = None, vpp: int | None = None,
                   mbs: int | None = None, zero: int | None = None, recompute=None,
                   sp: bool | None = None, etp: int | None = None) -> Layout:
    """The layout `estimate` (and `explain` by pins, a launcher config) evaluates: the knobs
    given, the rest at the defaults above (dp = GPUs / (tp pp cp), cp = ep = vpp = mbs = 1,
    etp = tp, DEFAULT_ZERO, DEFAULT_RECOMPUTE, sp on when tp > 1; cli.estimate's ESTIMATE_HELP
    says it)."""
    cp = cp or 1
    if dp is None:
        n = num_gpus
        if n % (tp * pp * cp):
            raise LayoutError(
                f"tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp} does not divide the "
                f"{n} GPUs of {cluster_name}; give degrees whose product is {n}"
            )
        dp = n // (tp * pp * cp)
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep or 1,
        vpp=vpp or 1,
        mbs=mbs or 1,
        zero=DEFAULT_ZERO if zero is None else zero,
        recompute=getattr(recompute, "value", recompute) if recompute is not None
        else DEFAULT_RECOMPUTE,
        sp=(tp > 1) if sp is None else sp,
        etp=etp or 0,
    )


def format_stage_layers(counts: tuple[int, ...] | list[int]) -> str:
    """Layers per stage, compact and readable: runs of one count as NxC, stages joined by ','
    (7,8x14,7 for Llama 3 405B on 16 stages)."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        run = j - i
        parts.append(f"{counts[i]}x{run}" if run > 2 else ",".join([str(counts[i])] * run))
        i = j
    return ",".join(parts)


def rank_coords(rank: int, layout: Layout) -> dict[str, int]:
    """Coordinates (tp, cp, dp, pp) of a global rank under the documented rank order."""
    tp_rank = rank % layout.tp
    rest = rank // layout.tp
    cp_rank = rest % layout.cp
    rest //= layout.cp
    dp_rank = rest % layout.dp
    return {"tp": tp_rank, "cp": cp_rank, "dp": dp_rank, "pp": rest // layout.dp}


def group_span_nodes(layout: Layout, axis: str, gpus_per_node: int) -> int:
    """How many nodes one group along `axis` spans (1 = stays inside a node).

    A group along an axis has `size` members spaced `stride` ranks apart, where stride is the
    product of the inner degrees (rank order above)."""
    order = ["tp", "cp", "dp", "pp"]
    stride = 1
    for name in order[: order.index(axis)]:
        stride *= getattr(layout, name)
    size = getattr(layout, axis)
    span_ranks = stride * (size - 1) + 1
    if size == 1:
        return 1
    if stride >= gpus_per_node:
        return size
    # members packed inside nodes: ceil of the ranks they cover over the node size
    return max(1, -(-span_ranks // gpus_per_node))
