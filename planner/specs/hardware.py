"""GpuProfile (one GPU type and its usual node, with measured efficiency curves) and ClusterSpec.

Units inside: bytes, FLOP, seconds. YAML fields carry their unit in the name (GiB, TB/s, GB/s,
Gbit/s, microseconds) and are converted by the accessors. Every number in a built-in profile
names its source in `sources` (field name -> citation)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner import limits
from planner.specs.fields import Fraction, UnitInterval, count, real

GIB = 2**30
Fabric = Literal["nvlink", "nvswitch", "xgmi", "pcie", "loopback"]
Precision = Literal["bf16", "fp16", "fp8", "tf32", "fp32"]


class Curve(BaseModel):
    """A measured y(x) relation as points, read by log-x linear interpolation and clamped at the
    ends. x and y units are stated by the field that holds the curve."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    points: list[tuple[real(limits.MAX_CURVE_X), real(1e30)]] = Field(
        min_length=1, max_length=limits.MAX_CURVE_POINTS,
        description="(x, y) pairs, x strictly increasing."
    )
    source: str = Field(default="", description="Where the points were measured or published.")

    @model_validator(mode="after")
    def _check(self) -> Curve:
        xs = [p[0] for p in self.points]
        if not xs or any(b <= a for a, b in zip(xs, xs[1:], strict=False)) or xs[0] <= 0:
            raise ValueError("curve points need positive, strictly increasing x")
        return self

    def __call__(self, x: float) -> float:
        import numpy as np

        return float(self.interp(np.asarray(x, dtype=float)))

    def interp(self, x):
        """Vectorized y at x (numpy array), log-x linear interpolation, clamped."""
        import numpy as np

        xs = np.log(np.array([p[0] for p in self.points]))
        ys = np.array([p[1] for p in self.points])
        return np.interp(np.log(np.maximum(x, 1e-30)), xs, ys)


class LinkProfile(BaseModel):
    """Collective performance of one fabric tier (inside a node, or across nodes)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    fabric: str = Field(description="What the tier is, e.g. 'nvswitch NVLink4', 'IB NDR 8x400G'.")
    link_gb_per_s: real(limits.MAX_LINK_GB_PER_S) = Field(
        description="Per-GPU, per-direction link bandwidth of the tier (spec), GB/s (1e9 B/s)."
    )
    busbw_gb_per_s: Curve = Field(
        description="Measured all-reduce bus bandwidth (nccl-tests busbw) vs message size, end to "
        "end (latency included): x bytes, y GB/s."
    )
    latency_us: real(limits.MAX_LATENCY_US) = Field(
        description="Per-hop (per ring step) latency, microseconds."
    )
    base_latency_us: real(limits.MAX_LATENCY_US, ge=0.0) = Field(
        default=0.0, description="Fixed latency per collective call, microseconds."
    )
    gather_busbw_ratio: float | None = Field(
        default=None, gt=0.0, le=1.0,
        description="All-gather / reduce-scatter busbw over the all-reduce curve's at the same "
        "message size, where it is below 1 (the all-reduce switch-accelerated by NVLink SHARP "
        "/ NVLS, the other collectives not); None: the all-reduce curve serves them all."
    )

    ring_slowdown_per_domain: float | None = Field(
        default=None, ge=0.0,
        description="Ring collectives that span k > 2 scale-up domains (inter-node tier only) run "
        "at this link's busbw / (1 + x (k - 2)): a fabric whose rings lose bandwidth with the "
        "nodes they cross (measured by the ring all-gather / reduce-scatter busbw at several "
        "node counts; NCCL's trees are not affected). None: the curve holds at any k."
    )

    def busbw_bytes_per_s(self, message_bytes, gather: bool = False):
        """Bus bandwidth achieved at this message size, bytes/s (of an all-gather or
        reduce-scatter with `gather`)."""
        bw = self.busbw_gb_per_s.interp(message_bytes) * 1e9
        return bw * self.gather_busbw_ratio if gather and self.gather_busbw_ratio else bw


# The cost model's time terms, the plan columns that add up to step_time_s (planner.plan
# PLAN_COLUMNS takes them from here; docs/contract.md)
STEP_TIME_TERMS: tuple[str, ...] = (
    "time_compute_s", "time_tp_comm_s", "time_cp_comm_s", "time_ep_comm_s", "time_pp_comm_s",
    "time_pp_bubble_s", "time_dp_comm_exposed_s", "time_optimizer_s")


def structural_band(shares: Any, reference: Any, tau: Any, floor: float) -> Any:
    """1-sigma relative band (fraction) of each plan after a calibration: the calibrated width
    `floor` (the profile's step_time_rel_error, the band of layouts like the calibration runs)
    combined with the model's structural error between layouts, which grows with how unlike the
    calibration runs the plan is: sqrt(floor^2 + sum_t tau_t^2 (share_t - reference_t)^2).
    shares: (plans x terms) share of each plan's step in each time term (STEP_TIME_TERMS over
    step_time_s); reference: (terms) the calibration runs' mean shares; tau: (terms) the log
    error per unit of share difference (planner.data.bands.fit_structural_tau)."""
    import numpy as np

    d = np.atleast_2d(np.asarray(shares, dtype=float)) - np.asarray(reference, dtype=float)
    return np.sqrt(floor ** 2 + (d ** 2) @ (np.asarray(tau, dtype=float) ** 2))


class TermBand(BaseModel):
    """What a calibration's band needs to widen for a plan unlike its runs
    (planner.specs.hardware.structural_band): the calibration runs' mean share of the step in each
    time term (STEP_TIME_TERMS) and the model's structural error per unit of share
    difference, tau (log step time), fitted held out on the replayed calibrations
    (benchmarks/bands.py --structural-only)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    shares: dict[str, UnitInterval] = Field(
        description="Time term -> the calibration runs' mean share of their step (fraction).")
    tau: dict[str, real(1e3, ge=0.0)] = Field(
        description="Time term -> structural log error per unit of share difference.")
    source: str = Field(default="", max_length=500, description="Where tau was fitted.")

    @model_validator(mode="after")
    def _terms(self) -> TermBand:
        for name in (*self.shares, *self.tau):
            if name not in STEP_TIME_TERMS:
                raise ValueError(f"unknown time term {name!r}; known: "
                                 f"{', '.join(STEP_TIME_TERMS)}")
        if set(self.shares) != set(self.tau):
            raise ValueError("shares and tau must name the same time terms")
        return self


class GpuProfile(BaseModel):
    """One GPU type with its usual node. Peaks are dense (no sparsity)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    name: str = Field(description="Registry name, e.g. 'A100-SXM4-80GB'.")
    aliases: list[str] = Field(
        default_factory=list, description="Other names ('A100', 'a100-80gb')."
    )
    description: str = Field(default="", description="The part and its usual node, in words.")
    peak_bf16_tflops: real(limits.MAX_TFLOPS) = Field(
        description="Dense BF16 tensor peak, TFLOP/s."
    )
    peak_fp16_tflops: real(limits.MAX_TFLOPS) = Field(
        description="Dense FP16 tensor peak, TFLOP/s."
    )
    peak_fp8_tflops: real(limits.MAX_TFLOPS) | None = Field(
        default=None, description="Dense FP8 peak, TFLOP/s."
    )
    peak_tf32_tflops: real(limits.MAX_TFLOPS) | None = Field(
        default=None, description="Dense TF32 peak, TFLOP/s."
    )
    compute_capability: float | None = Field(
        default=None, ge=1.0, le=20.0,
        description="CUDA compute capability (7.0 V100, 8.0 A100, 9.0 H100); None: not stated. "
        "bf16 tensor cores and FlashAttention need 8.0 or newer (planner.costmodel.checks)."
    )
    memory_gib: real(limits.MAX_MEMORY_GIB) = Field(description="HBM capacity, GiB (2^30 B).")
    hbm_tb_per_s: real(limits.MAX_HBM_TB_PER_S) = Field(
        description="HBM bandwidth (spec), TB/s (1e12 B/s)."
    )
    hbm_efficiency: Fraction = Field(
        default=0.85, description="Achieved fraction of HBM spec (STREAM-like)."
    )
    reserve_gib: real(limits.MAX_MEMORY_GIB, ge=0.0) = Field(
        description="Memory not usable by tensors: CUDA context, NCCL buffers, allocator "
        "fragmentation, GiB.",
    )
    gemm_efficiency: Curve = Field(
        description="Achieved fraction of the BF16 peak for one GEMM vs its size: x FLOP of the "
        "GEMM (2*M*N*K), y fraction."
    )
    fp8_gemm_efficiency: Curve | None = Field(
        default=None, description="As gemm_efficiency, against the FP8 peak."
    )
    fused_attention_efficiency: Fraction | None = Field(
        default=None,
        description="As attention_efficiency, for cuDNN / FlashAttention-3 class kernels "
        "(JobSpec.attention='cudnn'); None: attention_efficiency.",
    )
    tdp_w: real(limits.MAX_TDP_W) | None = Field(
        default=None,
        description="Board power (TDP / max TGP) per GPU, W: the energy of a training run is "
        "GPUs x this x hours x PUE (planner.economics); None: energy is not reported.",
    )
    host_link_gb_per_s: real(limits.MAX_LINK_GB_PER_S) | None = Field(
        default=None,
        description="GPU <-> host memory bandwidth per direction, GB/s, for activation offload "
        "(recompute='offload'); None: offload is not offered on this GPU.",
    )
    sm_count: count(limits.MAX_SM_COUNT) | None = Field(
        default=None,
        description="Streaming multiprocessors, for the GEMM tile and wave quantization "
        "(costmodel.compute); None: not modelled.",
    )
    attention_efficiency: Fraction = Field(
        default=0.5,
        description="Achieved fraction of peak for fused (flash) attention, counted causally.",
    )
    gpus_per_node: count(limits.MAX_GPUS_PER_NODE) = Field(
        description="GPUs per server (the usual node)."
    )
    nvlink_domain_gpus: count(limits.MAX_GPUS_PER_NODE) | None = Field(
        default=None,
        description="GPUs in one scale-up (NVLink) domain; None means gpus_per_node. 72 for NVL72.",
    )
    intra_node_fabric: Fabric = Field(description="Scale-up fabric kind.")
    intra_node: LinkProfile = Field(description="Collectives inside the scale-up domain.")
    inter_node: LinkProfile = Field(
        description="Collectives across domains, per NIC: the busbw of an all-reduce whose "
        "every ring step crosses a NIC (one GPU per node, or the inter-node phase of a "
        "hierarchical all-reduce); a GPU has nics_per_gpu of them."
    )
    nic_gbit_per_s: real(limits.MAX_NIC_GBIT_PER_S) = Field(
        description="Scale-out NIC line rate per GPU, Gbit/s."
    )
    nics_per_gpu: real(limits.MAX_NICS_PER_GPU) = Field(
        default=1.0, description="NICs per GPU (0.5 when two GPUs share one NIC)."
    )

    gemm_curve_from: str | None = Field(
        default=None, max_length=64,
        description="The chip whose measured GEMM curve this profile's gemm_efficiency borrows "
        "(V100 and L40S: A100; GB300: GB200); None when the curve is the chip's own (measured "
        "on it, or scaled from its own die's, as the H100 PCIe/NVL, H800 and H20 from the H100 "
        "SXM). A stack factor fitted on a borrowed curve stays on that GPU class "
        "(curve_is_borrowed).")

    # Fitted by calibration (stock values stated with their source in `sources`).
    dp_overlap: UnitInterval = Field(
        default=0.8,
        description="Fraction of DP gradient communication hidden behind backward.",
    )
    layer_overhead_us: real(limits.MAX_LATENCY_US, ge=0.0) = Field(
        default=0.0,
        description="Host-side time per transformer layer per forward pass of one micro-batch "
        "(kernel launches, framework dispatch), us; a backward counts 2, a full-recompute "
        "forward 1 more. 0 unless fitted by `planner calibrate`.",
    )
    step_overhead_s: real(limits.MAX_STEP_OVERHEAD_S, ge=0.0) = Field(
        default=0.0, description="Fixed per-step overhead (launch, sync), s."
    )
    step_time_rel_error: real(1e3, ge=0.0) | None = Field(
        default=None,
        description="Calibrated relative spread of step-time error (1 sigma); None = uncalibrated.",
    )
    step_time_band_terms: TermBand | None = Field(
        default=None,
        description="Set by a few-shot calibration: the band of a plan widens with how unlike "
        "the calibration runs its time-term shares are (planner.specs.hardware.structural_band); "
        "None = every plan gets step_time_band.")
    provenance: dict = Field(
        default_factory=dict, description="How the profile was made: runs used, date, residuals."
    )
    sources: dict[str, str] = Field(
        default_factory=dict, description="Field name -> citation of its number."
    )

    @model_validator(mode="after")
    def _physics(self) -> GpuProfile:
        if self.reserve_gib >= self.memory_gib:
            raise ValueError(f"reserve_gib ({self.reserve_gib:g}) must be less than memory_gib "
                             f"({self.memory_gib:g}): nothing would be left for tensors")
        for name in ("gemm_efficiency", "fp8_gemm_efficiency"):
            curve = getattr(self, name)
            top = max(y for _, y in curve.points) if curve is not None else 0.0
            if top > 1:
                raise ValueError(f"{name}: a fraction of the peak is at most 1, got {top:g}")
        return self

    @property
    def step_time_band(self) -> float:
        """Relative 1-sigma band of the step time (fraction): the calibrated step_time_rel_error,
        else the error measured on sources left out of every fit for this kind of profile (stack
        named or not, GEMM curve own or borrowed; planner.data.bands.absolute_band)."""
        if self.step_time_rel_error is not None:
            return self.step_time_rel_error
        from planner.data.bands import absolute_band

        return absolute_band(self)

    @property
    def ranking_band(self) -> float:
        """Relative 1-sigma error between layouts of one job (fraction), the tie rule's band:
        the stock one measured on the sweeps (planner.data.bands.ranking_band), never wider
        than the step-time band (a calibrated profile's spread bounds it)."""
        from planner.data.bands import ranking_band

        return min(ranking_band(), self.step_time_band)

    @property
    def domain_gpus(self) -> int:
        """GPUs sharing the scale-up fabric (the limit for TP)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def curve_is_borrowed(self) -> bool:
        """Whether the GEMM curve was measured on another chip (gemm_curve_from: V100 and L40S
        take the A100's, GB300 the GB200's). A stack factor fitted there absorbs the curve's
        error as well as the software's, so it is kept for that GPU class only
        (planner.stacks StackPreset.gpu_factors) and does not travel to other GPUs; the
        absolute band has a cell of its own for it (planner.data.bands.profile_cell)."""
        return self.gemm_curve_from is not None

    @property
    def usable_memory_gib(self) -> float:
        """Capacity tensors may use: HBM minus the reserve, GiB."""
        return self.memory_gib - self.reserve_gib

    def peak_flops(self, precision: Precision) -> float:
        """Dense peak for the matmul precision, FLOP/s."""
        table = {
            "bf16": self.peak_bf16_tflops,
            "fp16": self.peak_fp16_tflops,
            "fp8": self.peak_fp8_tflops,
            "tf32": self.peak_tf32_tflops,
        }
        value = table.get(precision)
        if value is None:
            from planner.errors import SpecError

            raise SpecError(f"GPU {self.name} has no {precision} peak in its profile")
        return value * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        """Achieved HBM bandwidth, bytes/s."""
        return self.hbm_tb_per_s * 1e12 * self.hbm_efficiency

    def summary(self) -> dict[str, object]:
        """One object of `planner clusters --json`: peaks (TFLOP/s, dense), memory (GiB), HBM
        (TB/s), node shape, fabrics, measured bus-bandwidth plateaus (GB/s) and NIC (Gbit/s)."""
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "description": self.description,
            "peak_bf16_tflops": self.peak_bf16_tflops,
            "peak_fp16_tflops": self.peak_fp16_tflops,
            "peak_fp8_tflops": self.peak_fp8_tflops,
            "memory_gib": self.memory_gib,
            "reserve_gib": self.reserve_gib,
            "usable_memory_gib": round(self.usable_memory_gib, 3),
            "hbm_tb_per_s": self.hbm_tb_per_s,
            "gpus_per_node": self.gpus_per_node,
            "domain_gpus": self.domain_gpus,
            "intra_node_fabric": self.intra_node_fabric,
            "intra_node": self.intra_node.fabric,
            "intra_node_link_gb_per_s": self.intra_node.link_gb_per_s,
            "intra_node_busbw_gb_per_s": self.intra_node.busbw_gb_per_s.points[-1][1],
            "inter_node": self.inter_node.fabric,
            "inter_node_busbw_gb_per_s": self.inter_node.busbw_gb_per_s.points[-1][1],
            "nic_gbit_per_s": self.nic_gbit_per_s,
            "calibrated": self.step_time_rel_error is not None,
        }


class ClusterSpec(BaseModel):
    """A homogeneous cluster: `num_nodes` nodes of `gpus_per_node` GPUs of one profile."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    gpu: GpuProfile = Field(description="The GPU profile.")
    num_nodes: count(limits.MAX_GPUS) = Field(description="Servers.")
    gpus_per_node: count(limits.MAX_GPUS_PER_NODE) = Field(
        description="GPUs per server (may be fewer than the profile's node)."
    )
    nics_per_node: real(limits.MAX_NICS_PER_GPU * limits.MAX_GPUS_PER_NODE) | None = Field(
        default=None,
        description="Scale-out NICs per server (each at the profile's inter_node curve) where "
        "the cluster differs from the profile's node design; None: gpus_per_node x nics_per_gpu.",
    )

    @model_validator(mode="after")
    def _size(self) -> ClusterSpec:
        if self.num_nodes * self.gpus_per_node > limits.MAX_GPUS:
            raise ValueError(f"{self.num_nodes} x {self.gpus_per_node} GPUs is more than "
                             f"{limits.MAX_GPUS}, the largest cluster accepted")
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def nics_per_gpu(self) -> float:
        """Scale-out NICs per GPU: nics_per_node / gpus_per_node, else the profile's."""
        if self.nics_per_node is None:
            return self.gpu.nics_per_gpu
        return self.nics_per_node / self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs reachable over the scale-up fabric from one GPU (capped by the cluster size)."""
        return min(
            self.gpu.domain_gpus if self.gpu.nvlink_domain_gpus else self.gpus_per_node,
            self.num_gpus,
        )

    def __str__(self) -> str:
        return f"{self.num_nodes}x{self.gpus_per_node}x{self.gpu.name}"


class PooledCluster(BaseModel):
    """A cluster of several pools, each homogeneous (its own GPU profile and node shape): e.g.
    64 H100 + 128 A100. A plan places whole pipeline stages on pools (a stage never spans two;
    its TP and DP groups stay inside its pool); the pools are joined by the slower network."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    pools: tuple[ClusterSpec, ...] = Field(min_length=2, description="The pools, in order.")

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)

    @property
    def gpu(self) -> GpuProfile:
        """The first pool's GPU (for what needs one name: titles, defaults)."""
        return self.pools[0].gpu

    def __str__(self) -> str:
        return "+".join(str(p) for p in self.pools)


class JobSpec(BaseModel):
    """What one training step processes."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    seq_len: count(limits.MAX_SEQ_LEN) = Field(description="Tokens per sequence.")
    global_batch: count(limits.MAX_GLOBAL_BATCH) = Field(
        description="Sequences per optimizer step."
    )
    precision: Literal["bf16", "fp16", "fp8"] = Field(
        default="bf16", description="Matmul precision; master weights and Adam state stay fp32."
    )
    grad_dtype: Literal["auto", "half", "fp32", "half+fp32"] = Field(
        default="auto",
        description=(
            "Gradient bytes per parameter. auto: by ZeRO stage (Megatron fp32 main grads 4 B at "
            "ZeRO 0/1, 2 B at ZeRO 2/3); half: 2 B (DeepSpeed fp16/bf16 ZeRO-1); fp32: 4 B; "
            "half+fp32: 2 B plus an unsharded 4 B fp32 accumulator (DeepSpeed BF16_Optimizer)."
        ),
    )
    grad_reduce_dtype: Literal["auto", "half", "fp32"] = Field(
        default="auto",
        description=(
            "Width of the gradients the data-parallel reduction sends, apart from how they are "
            "kept (grad_dtype sets the memory). auto: the recipe's reduced buffer (4 B when an "
            "fp32 gradient buffer exists, else 2 B: Megatron-Core reduces its grad buffer in "
            "place); half: 2 B (Megatron-LM 2021 local DDP all-reduces the 16-bit .grad unless "
            "--fp32-allreduce; DeepSpeed communication_data_type fp16/bf16); fp32: 4 B."
        ),
    )
    grad_overlap: bool = Field(
        default=True,
        description=(
            "Whether the data-parallel gradient reduction overlaps the backward (Megatron-Core "
            "overlap_grad_reduce, FSDP); False: it runs after the last backward (Megatron-LM "
            "2021 local DDP, DeepSpeed's pipeline engine ReduceGrads)."
        ),
    )
    dp_bucket_mb: float | None = Field(
        default=None,
        gt=0,
        description=(
            "MiB of 16-bit gradients per data-parallel reduction call (torch DDP bucket_cap_mb; "
            "nanotron 25). None: Megatron-Core's buckets, max(40M, 1M x dp) parameters. Sets "
            "the message size (and the call count) of the gradient all-reduce / "
            "reduce-scatter; the ZeRO-1/2 parameter all-gather keeps Megatron's buckets."
        ),
    )
    param_gather_overlap: bool = Field(
        default=True,
        description=(
            "Whether the ZeRO-1/2 (distributed optimizer) all-gather of the updated parameters "
            "overlaps the next step's forward (Megatron-Core overlap_param_gather, on in the "
            "NeMo / Megatron-Bridge recipes); False: it runs after the optimizer step with "
            "nothing to hide behind (nanotron ZeroDistributedOptimizer.step), and the gradient "
            "reduce-scatter hides only behind the last backward."
        ),
    )
    zero1_grad_all_reduce: bool = Field(
        default=False,
        description=(
            "Whether ZeRO-1 reduces the gradients with one blocking all-reduce of the whole "
            "gradient buffer after the last backward (nothing hidden) instead of a "
            "reduce-scatter per bucket during it: nanotron with accumulate_grad_in_fp32 builds "
            "no DDP at zero_stage > 0 and runs sync_gradients_across_dp(reduce_scatter=False)."
        ),
    )
    tp_comm_overlap: bool = Field(
        default=False,
        description=(
            "Whether the TP/SP all-gathers and reduce-scatters overlap the GEMMs they feed "
            "(Megatron-Core tp_comm_overlap with Transformer Engine userbuffers; needs sp). "
            "Off by default, as in Megatron-LM; NeMo / Megatron-Bridge performance recipes "
            "turn it on."
        ),
    )
    p2p_overlap: bool = Field(
        default=True,
        description=(
            "Whether interleaved 1F1B overlaps its pipeline sends/receives with the next "
            "chunk's compute (Megatron-Core overlap_p2p_comm, on by default; plain 1F1B and "
            "GPipe block on them)."
        ),
    )
    p2p_scatter_gather: bool = Field(
        default=False,
        description=(
            "Whether, without SP, each TP rank sends only its 1/tp share of a pipeline "
            "activation or gradient and the receiver all-gathers it over TP (DeepSpeed's "
            "PipelineEngine under TP: is_pipe_partitioned / is_grad_partitioned; Megatron-LM "
            "before Megatron-Core: scatter_gather_tensors_in_pipeline). False: every TP rank "
            "sends the whole tensor (Megatron-Core)."
        ),
    )
    attention: Literal["flash", "cudnn", "triton", "unfused"] = Field(
        default="flash",
        description=(
            "Attention kernel: flash (FlashAttention-2 class, fused, no s x s tensors kept; "
            "profile.attention_efficiency), cudnn (Transformer Engine's cuDNN fused attention, "
            "FlashAttention-3 class on Hopper and later; profile.fused_attention_efficiency), "
            "triton (FlashAttention in Triton, the FlashAttention-1-era kernel of llm-foundry's "
            "attn_impl triton: flash's memory at flash's rate / 1.4 forward, / 2.0 backward) or "
            "unfused (Megatron 2021-22: score tensors kept, softmax memory-bound, QK^T and AV "
            "as batched GEMMs)."
        ),
    )
    moe_dispatcher: Literal["alltoall", "allgather", "deepep"] = Field(
        default="alltoall",
        description=(
            "MoE token dispatcher (Megatron-Core moe_token_dispatcher_type): alltoall (NCCL "
            "all-to-all over EP, all-gather over expert-TP), allgather (every token gathered "
            "over the expert-TP x EP group) or deepep (the flex dispatcher's DeepEP kernels, "
            "at DeepEP's measured bandwidths). Dense models ignore it."
        ),
    )
    moe_capacity_factor: float | None = Field(
        default=None, gt=0, le=1024,
        description=(
            "MoE expert capacity factor (Megatron-Core moe_expert_capacity_factor): tokens "
            "beyond factor x the mean per expert are dropped, which caps the router's load "
            "imbalance; None = dropless (the imbalance counts in full)."
        ),
    )
    software: Literal["current", "deepspeed-2022", "megatron-2021"] = Field(
        default="current",
        description=(
            "Training software whose runtime memory (and step passes) the model adds. "
            "current: Megatron-Core / "
            "FSDP / Transformer Engine with lazily loaded CUDA kernels (the GPU profile's "
            "reserve). deepspeed-2022: DeepSpeed 0.5-0.6 (Megatron-DeepSpeed): an fp32 copy of "
            "the largest gradient, the ZeRO-1 reduce bucket, a CUDA context that loads every "
            "kernel at start-up, the NCCL communicators of its extra process groups. "
            "megatron-2021: Megatron-LM before July 2021 (fp16, local DDP): the 16-bit .grad "
            "beside the fp32 main grads, local DDP's flat gradient copy, dropout masks (its 0.1 "
            "defaults), a CUDA context that loads every kernel at start-up; in time, the "
            "dropout over unfused attention scores and the fp16 step's memory passes "
            "(costmodel.compute)."
        ),
    )
    moe_routing: Literal["aux_loss", "loss_free", "force_balanced"] = Field(
        default="aux_loss",
        description=(
            "How the MoE router balances the experts, which sets the most loaded EP rank's "
            "share (planner.costmodel.moe.load_factor): aux_loss (a load-balancing loss, "
            "MaxVio 0.52), loss_free (expert bias, DeepSeek-V3's; MaxVio 0.04) or "
            "force_balanced (random logits, Megatron-Core moe_router_force_load_balancing, "
            "as vendor benchmarks run). Dense models ignore it."
        ),
    )
    moe_ep_overlap: bool = Field(
        default=False,
        description=(
            "Overlap the MoE dispatch and combine with another micro-batch's compute "
            "(Megatron-Core overlap_moe_expert_parallel_comm, the combined 1F1B schedule): "
            "only the part of a micro-batch's EP time beyond its stage's compute stays "
            "exposed. Dense models ignore it."
        ),
    )

    layout_support: tuple[tuple[str, tuple[int | bool | str, ...]], ...] = Field(
        default=(),
        description=(
            "Layout knob values the training software can run ((knob, values) pairs; a knob "
            "absent: any; pairs keep the spec hashable), from its stack preset "
            "(StackPreset.supports): the search leaves the other values out unless a pin asks "
            "for one. nanotron: (('zero', (0, 1)),)."
        ),
    )

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
