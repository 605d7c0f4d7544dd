"""The adjustable parameters of a GPU profile, and the profile they give: what `planner
calibrate` fits (calibrate.fit) and what a software stack's efficiency factors set (stacks.py).

    apply_values(profile, {"gemm_scale": 0.9})   # the GEMM efficiency curve x 0.9
    knobs_for(profile)                           # every parameter with its physical bounds
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from planner.specs.hardware import Curve, GpuProfile

# layer_overhead_us is log-spaced from 1 us (a kernel launch, the smallest host cost a layer pass
# can add) to 0.1 s; its floor stands for none, the stock profiles' value
LAYER_OVERHEAD_FLOOR_US = 1.0


@dataclass(frozen=True)
class Knob:
    """One fitted parameter: bounds in its own unit, log-spaced or linear in the unit box."""

    name: str
    lo: float
    hi: float
    log: bool
    doc: str

    def to_value(self, u: float) -> float:
        if self.log:
            return math.exp(math.log(self.lo) + u * (math.log(self.hi) - math.log(self.lo)))
        return self.lo + u * (self.hi - self.lo)

    def to_unit(self, value: float) -> float:
        value = min(max(value, self.lo), self.hi)
        if self.log:
            return (math.log(value) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))
        return (value - self.lo) / (self.hi - self.lo)


def knobs_for(profile: GpuProfile) -> list[Knob]:
    """The fittable parameters of `profile` and their physical bounds."""
    top_gemm = max(y for _, y in profile.gemm_efficiency.points)
    knobs = [
        Knob("gemm_scale", 0.1, 1.0 / top_gemm, True,
             "factor on the GEMM efficiency curve (capped so no point exceeds 1)"),
        Knob("gemm_size_log2", -8.0, 8.0, False,
             "size dependence: the curve's x moves by 2^k FLOP (k > 0: bigger GEMMs needed)"),
        Knob("attention_efficiency", 0.05, 1.0, True,
             "fraction of peak for flash (FlashAttention-2 class) attention"),
        Knob("hbm_efficiency", 0.2, 1.0, True, "achieved fraction of the HBM spec"),
        Knob("intra_bw_scale", 0.02, 2.0, True, "factor on the scale-up busbw curve"),
        Knob("intra_size_log2", -6.0, 12.0, False,
             "latency of the scale-up tier: its busbw curve's x moves by 2^k bytes (k > 0: "
             "bigger messages needed for the same bandwidth, a larger fixed cost per call)"),
        Knob("intra_latency_us", 0.1, 2e4, True, "scale-up per-step latency, us (ms on gloo)"),
        Knob("intra_base_latency_us", 1.0, 1e5, True,
             "scale-up fixed cost per collective call, us (large for gloo on CPUs)"),
        Knob("inter_bw_scale", 0.02, 2.0, True, "factor on the scale-out busbw curve"),
        Knob("inter_size_log2", -6.0, 12.0, False,
             "latency of the scale-out tier: its busbw curve's x moves by 2^k bytes"),
        Knob("inter_latency_us", 0.1, 2e4, True, "scale-out per-step latency, us"),
        Knob("inter_base_latency_us", 1.0, 1e5, True,
             "scale-out fixed cost per collective call, us"),
        Knob("dp_overlap", 0.0, 1.0, False, "fraction of DP communication hidden by backward"),
        Knob("step_overhead_s", 0.0, 30.0, False, "fixed per-step overhead, s"),
        Knob("layer_overhead_us", LAYER_OVERHEAD_FLOOR_US, 1e5, True,
             "host time per layer per micro-batch pass (launches, dispatch), us; the floor "
             "(1 us) means none"),
    ]
    if profile.fused_attention_efficiency is not None:
        # a profile without it runs attention=cudnn at attention_efficiency (TE picks
        # FlashAttention-2 below Hopper; costmodel.compute), so that knob calibrates both
        knobs.insert(3, Knob("fused_attention_efficiency", 0.05, 1.0, True,
                             "fraction of peak for cuDNN / FlashAttention-3 class attention "
                             "(attention=cudnn)"))
    if profile.fp8_gemm_efficiency is not None:
        top8 = max(y for _, y in profile.fp8_gemm_efficiency.points)
        knobs.insert(1, Knob("fp8_gemm_scale", 0.1, 1.0 / top8, True,
                             "factor on the FP8 GEMM efficiency curve"))
    return knobs


def stock_values(profile: GpuProfile) -> dict[str, float]:
    """The knob values that reproduce `profile` unchanged."""
    return {
        "gemm_scale": 1.0, "fp8_gemm_scale": 1.0, "gemm_size_log2": 0.0,
        "attention_efficiency": min(profile.attention_efficiency, 1.0),
        "fused_attention_efficiency": min(
            profile.fused_attention_efficiency or profile.attention_efficiency, 1.0),
        "hbm_efficiency": profile.hbm_efficiency,
        "intra_bw_scale": 1.0, "intra_size_log2": 0.0, "inter_size_log2": 0.0,
        "intra_latency_us": profile.intra_node.latency_us,
        "inter_bw_scale": 1.0, "inter_latency_us": profile.inter_node.latency_us,
        "intra_base_latency_us": profile.intra_node.base_latency_us,
        "inter_base_latency_us": profile.inter_node.base_latency_us,
        "dp_overlap": profile.dp_overlap, "step_overhead_s": profile.step_overhead_s,
        "layer_overhead_us": profile.layer_overhead_us,
    }


def fp8_tied_values(values: dict[str, float]) -> dict[str, float]:
    """`values` with fp8_gemm_scale = gemm_scale where only gemm_scale is given: a fitted GEMM
    scale is what training reaches of the measured curve (real shapes, clocks under load, the
    kernels a framework picks), and Transformer Engine's FP8 layers run the same cuBLASLt GEMMs
    in the same layers, so it moves both curves. Their ratio stays the measured one: H100 FP8 /
    BF16 MAMF 1402.6 / 794.5 = 1.77, GB200 3615.6 / 1822 = 1.98 [stas00/ml-engineering @744d01e
    compute/accelerator/README.md, MAMF tables; docs/hardware.md 2.1]. Scaled alone, the BF16
    curve fitted on BF16-only runs (H100 x0.73 on llm-foundry's) left FP8 GEMMs 2.4x faster
    than BF16, and NeMo's FP8 runs on H100 15.9% too fast held out (benchmarks/accuracy.py
    --loso)."""
    if "gemm_scale" in values and "fp8_gemm_scale" not in values:
        return {**values, "fp8_gemm_scale": values["gemm_scale"]}
    return values


def _scaled(curve: Curve, y_factor: float, x_factor: float = 1.0,
            cap: float | None = None) -> Curve:
    points = [(x * x_factor, y * y_factor if cap is None else min(cap, y * y_factor))
              for x, y in curve.points]
    return Curve(points=points, source=curve.source)


def apply_values(profile: GpuProfile, values: dict[str, float]) -> GpuProfile:
    """`profile` with the knob values applied (missing knobs keep the profile's value). The FP8
    curve follows gemm_scale unless fp8_gemm_scale is given (fp8_tied_values)."""
    v = {**stock_values(profile), **fp8_tied_values(values)}
    size = 2.0 ** v["gemm_size_log2"]
    update: dict[str, Any] = {
        "gemm_efficiency": _scaled(profile.gemm_efficiency, v["gemm_scale"], size, cap=1.0),
        "attention_efficiency": v["attention_efficiency"],
        "hbm_efficiency": v["hbm_efficiency"],
        "dp_overlap": v["dp_overlap"],
        "step_overhead_s": v["step_overhead_s"],
        "layer_overhead_us": (v["layer_overhead_us"]
                              if v["layer_overhead_us"] > LAYER_OVERHEAD_FLOOR_US else 0.0),
        "intra_node": profile.intra_node.model_copy(update={
            "busbw_gb_per_s": _scaled(profile.intra_node.busbw_gb_per_s, v["intra_bw_scale"],
                                      2.0 ** v["intra_size_log2"]),
            "latency_us": v["intra_latency_us"],
            "base_latency_us": v["intra_base_latency_us"]}),
        "inter_node": profile.inter_node.model_copy(update={
            "busbw_gb_per_s": _scaled(profile.inter_node.busbw_gb_per_s, v["inter_bw_scale"],
                                      2.0 ** v["inter_size_log2"]),
            "latency_us": v["inter_latency_us"],
            "base_latency_us": v["inter_base_latency_us"]}),
    }
    if profile.fused_attention_efficiency is not None or "fused_attention_efficiency" in values:
        update["fused_attention_efficiency"] = v["fused_attention_efficiency"]
    if profile.fp8_gemm_efficiency is not None:
        update["fp8_gemm_efficiency"] = _scaled(profile.fp8_gemm_efficiency, v["fp8_gemm_scale"],
                                                size, cap=1.0)
    return profile.model_copy(update=update)
