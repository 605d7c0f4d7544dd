"""Measured ceilings of the fitted profile knobs: no fit puts an efficiency above the best measured
kernel of its kind on that GPU, nor a bandwidth above the best measured NCCL bus bandwidth on its
link.

    fit_knobs(profile)        # knobs_for(profile), each upper bound at its measured ceiling
    bound_rows(profile)       # [(knob, lo, hi, source)] for docs and tests

CEILINGS holds the measurements, in the knob's absolute unit (fraction of the dense peak of the
knob's precision, fraction of the HBM spec, GB/s of all-reduce bus bandwidth), keyed by profile
name or GPU class (planner.published.GPU_CLASSES; a profile's own entry first). Where a GPU has no
measured figure the bound is the physical one, and bound_rows says so: an efficiency at most 1
(specs.adjust.knobs_for's), a ring bus bandwidth at most the link spec (inter-node tier: every
ring step crosses the NIC), one with in-switch reduction (NVLS) under twice it (each GPU sends its
S bytes at least once, busbw = algbw x 2(n-1)/n). Lower bounds stay knobs_for's (fractions and
times at least 0; the efficiencies' floors are the search range). The profile fit
(calibrate.fit.fit_values) and the few-shot fit (fewshot._candidate_knobs, whose _theta_bounds
reads the knobs' lo / hi) both take their knobs from fit_knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.specs import GpuProfile
from planner.specs.adjust import Knob, knobs_for


@dataclass(frozen=True)
class Ceiling:
    """A measured upper bound in the knob's absolute unit, with its source."""

    value: float
    source: str


_MAMF = "stas00/ml-engineering @744d01e compute/accelerator/README.md, MAMF tables; " \
        "docs/hardware.md 2.1"
_FA3 = "Shah et al. 2024, FlashAttention-3, arXiv:2407.08608"
_NVLINK4 = Ceiling(482.3, "8x H200 NVLink4 NVSwitch, NVLS all-reduce busbw 482.3 GB/s at 16 GiB, "
                          "the best measured on NVLink4 (8x H100 ~480, nccl-tests #212) "
                          "[docs/hardware.md 2.2]")
# Per-knob ceilings. Efficiencies are fractions of the dense peak of the knob's precision; busbw
# ceilings are GB/s and bound the scale-up (intra) curve's plateau times intra_bw_scale.
CEILINGS: dict[str, dict[str, Ceiling]] = {
    "A100-SXM": {
        "gemm": Ceiling(271.2 / 312, f"A100 SXM BF16 MAMF 271.2 of 312 TFLOP/s [{_MAMF}]"),
        # below Hopper TE runs FlashAttention-2 for attention=cudnn (costmodel.compute), so this
        # rate prices every fused kernel on the A100
        "attention": Ceiling(0.73, "FlashAttention-2 reaches 50-73% of the theoretical maximum "
                                   "FLOP/s on A100 [Dao 2023, arXiv:2307.08691, abstract]"),
        "intra_busbw": Ceiling(234.9, "8x A100 NVLink3 ring all-reduce busbw 234.9 GB/s at "
                                      "16 GiB [docs/hardware.md 2.2]"),
    },
    "A100-SXM4-80GB": {
        "hbm": Ceiling(1.75 / 2.039, "Azure ND A100 v4 STREAM-like 1.61-1.75 TB/s of 2.039 "
                                     "[docs/hardware.md 2.1]"),
    },
    "H100/H200-SXM": {
        "gemm": Ceiling(794.5 / 989, f"H100 SXM BF16 MAMF 794.5 of 989 TFLOP/s (H200 'the "
                                     f"same') [{_MAMF}]"),
        "fp8_gemm": Ceiling(1402.6 / 1979, f"H100 SXM FP8 MAMF 1402.6 of 1979 TFLOP/s [{_MAMF}]"),
        "attention": Ceiling(370 / 989, f"FlashAttention-2 on H100 SXM5, forward, head dim 128, "
                                        f"seq 8k-16k: 370 TFLOP/s, its best [{_FA3}, forward-"
                                        f"speed figure; docs/hardware.md 2.1]"),
        "fused_attention": Ceiling(0.75, f"FlashAttention-3 BF16 on H100 SXM5: 'up to 740 "
                                         f"TFLOPs/s (75% utilization)' [{_FA3}, abstract]; "
                                         f"cuDNN in its figures reaches less (617)"),
    },
    "H100-SXM": {
        "hbm": Ceiling(3.18 / 3.35, "Azure ND H100 v5 STREAM-like 2.90-3.18 TB/s of 3.35 "
                                    "[docs/hardware.md 2.1]"),
        "intra_busbw": _NVLINK4,
    },
    "H100-SXM-96GB": {"intra_busbw": _NVLINK4},
    "H200-SXM": {
        "fp8_gemm": Ceiling(1453.4 / 1979, f"H200 SXM FP8 MAMF 1453.4 of 1979 TFLOP/s [{_MAMF}]"),
        "hbm": Ceiling(4.48 / 4.8, "Azure ND H200 v5 STREAM-like 4.00-4.48 TB/s of 4.8 "
                                   "[docs/hardware.md 2.1]"),
        "intra_busbw": _NVLINK4,
    },
    "B200-SXM": {
        "gemm": Ceiling(1745.0 / 2250, f"B200 SXM BF16 MAMF 1745.0 of 2250 TFLOP/s [{_MAMF}]"),
        "fp8_gemm": Ceiling(3432.5 / 4500, f"B200 FP8 MAMF 3432.5 of 4500 TFLOP/s [{_MAMF}]"),
        "intra_busbw": Ceiling(845.7, "8x B200 NVLink5 all-reduce busbw 845.7 GB/s at 16 GiB "
                                      "(AWS P6-B200) [docs/hardware.md 2.2]"),
    },
    "GB200-NVL72": {
        "gemm": Ceiling(1822.0 / 2500, f"GB200 BF16 MAMF 1822 of 2500 TFLOP/s [{_MAMF}]"),
        "fp8_gemm": Ceiling(3615.6 / 5000, f"GB200 FP8 MAMF 3615.6 of 5000 TFLOP/s [{_MAMF}]"),
        "intra_busbw": Ceiling(845.7, "the best measured on NVLink5: 8x B200 845.7 GB/s at "
                                      "16 GiB [docs/hardware.md 2.2]"),
    },
    "MI300X": {
        "gemm": Ceiling(781.9 / 1300, f"MI300X BF16 MAMF 781.9 of 1300 TFLOP/s (ROCm 6.2; 668.4 "
                                      f"in a later run) [{_MAMF}]"),
        "intra_busbw": Ceiling(312.9, "8x MI300X all-reduce busbw 312.9 GB/s at 4 GiB "
                                      "[docs/hardware.md 2.2]"),
    },
}
# The NIC tier: a ConnectX-7 at NDR (400 Gb/s) 'should achieve up to 48-49 GB/s per NIC' of its
# 50 (NVIDIA, nccl-tests #267 [docs/hardware.md 1.1]); other NICs: the line rate (physical)
NIC_CEILING_OF_LINE = {400.0: Ceiling(49.0 / 50.0, "ConnectX-7 at NDR up to 49 of 50 GB/s per "
                                                   "NIC (nccl-tests #267) [docs/hardware.md 1.1]")}
PHYSICAL = "physical bound: no measured figure for this GPU in docs/hardware.md"


def ceiling(profile: GpuProfile, quantity: str) -> Ceiling | None:
    """The measured ceiling of `quantity` (a CEILINGS key: gemm, fp8_gemm, attention,
    fused_attention, hbm, intra_busbw) for the profile: its own entry, else its GPU class's."""
    from planner.published import gpu_class

    for key in (profile.name, gpu_class(profile.name)):
        found = CEILINGS.get(key or "", {}).get(quantity)
        if found is not None:
            return found
    return None


def _top(curve) -> float:
    return max(y for _, y in curve.points)


def _bounds(profile: GpuProfile, knob: Knob) -> tuple[float, str]:
    """(upper bound in the knob's unit, its source) for one knob of `profile`."""
    name = knob.name
    if name in ("gemm_scale", "fp8_gemm_scale"):
        # the GEMM scale moves the FP8 curve too (specs.adjust.fp8_tied_values): both bind it
        curves = [("fp8_gemm", profile.fp8_gemm_efficiency)] if name == "fp8_gemm_scale" else \
            [("gemm", profile.gemm_efficiency)] + ([("fp8_gemm", profile.fp8_gemm_efficiency)]
                                                   if profile.fp8_gemm_efficiency else [])
        hi, why = knob.hi, []
        for quantity, curve in curves:
            c = ceiling(profile, quantity)
            level = c.value if c else 1.0
            hi = min(hi, level / _top(curve))
            why.append(f"{quantity} top <= {level:.3f}: " + (c.source if c else PHYSICAL))
        return hi, "; ".join(why)
    quantity = {"attention_efficiency": "attention", "fused_attention_efficiency":
                "fused_attention", "hbm_efficiency": "hbm"}.get(name)
    if quantity:
        c = ceiling(profile, quantity)
        return (min(knob.hi, c.value), c.source) if c else (knob.hi, f"{PHYSICAL} (<= 1)")
    if name == "intra_bw_scale":
        link, top = profile.intra_node.link_gb_per_s, _top(profile.intra_node.busbw_gb_per_s)
        c = ceiling(profile, "intra_busbw")
        if c:
            return min(knob.hi, c.value / top), c.source
        return (min(knob.hi, 2.0 * link / top),
                f"{PHYSICAL}: busbw < 2 x the link spec {link:g} GB/s (in-switch reduction)")
    if name == "inter_bw_scale":
        link, top = profile.inter_node.link_gb_per_s, _top(profile.inter_node.busbw_gb_per_s)
        c = NIC_CEILING_OF_LINE.get(float(profile.nic_gbit_per_s or 0.0))
        share = c.value if c else 1.0
        return (min(knob.hi, share * link / top),
                c.source if c else f"{PHYSICAL}: ring busbw <= the link spec {link:g} GB/s")
    return knob.hi, "search range: no benchmark bounds it"


def fit_knobs(profile: GpuProfile) -> list[Knob]:
    """knobs_for(profile) with each upper bound lowered to its measured ceiling (never raised;
    never below the lower bound)."""
    out = []
    for knob in knobs_for(profile):
        hi, _ = _bounds(profile, knob)
        out.append(replace(knob, hi=max(knob.lo, min(knob.hi, hi))))
    return out


def bound_rows(profile: GpuProfile) -> list[tuple[str, float, float, str]]:
    """(knob, lower bound, upper bound, source of the upper bound) of every fitted knob."""
    return [(k.name, k.lo, k.hi, _bounds(profile, base)[1])
            for k, base in zip(fit_knobs(profile), knobs_for(profile), strict=True)]
