"""A small GPU profile for the calibration tests (numbers are the A100-SXM4-80GB facts of
docs/hardware.md, S1/S2/S10), independent of the built-in YAMLs."""

from __future__ import annotations

from planner.specs import Curve, GpuProfile, LinkProfile


def a100_like(name: str = "A100-SXM4-80GB") -> GpuProfile:
    """A100 80GB: 312 TFLOP/s BF16 (S1), 80 GiB, 2.039 TB/s (S3), NVLink3 300 GB/s (S2),
    8x HDR 200 Gb/s (S18); GEMM curve from the Azure cuBLASLt sweep (S10, FLOP = 2 N^3)."""
    gemm = Curve(points=[(2 * 1024**3, 0.38), (2 * 2048**3, 0.71), (2 * 4096**3, 0.73),
                         (2 * 8192**3, 0.81), (2 * 16384**3, 0.82)])
    intra = LinkProfile(fabric="nvswitch", link_gb_per_s=300,
                        busbw_gb_per_s=Curve(points=[(1e4, 5.0), (1e6, 80.0), (1e8, 220.0),
                                                     (1e10, 234.9)]), latency_us=5.0)
    inter = LinkProfile(fabric="ib hdr", link_gb_per_s=25,
                        busbw_gb_per_s=Curve(points=[(1e4, 1.0), (1e6, 10.0), (1e8, 22.0),
                                                     (1e10, 23.0)]), latency_us=10.0)
    return GpuProfile(
        name=name, aliases=["A100"], peak_bf16_tflops=312, peak_fp16_tflops=312, memory_gib=80,
        hbm_tb_per_s=2.039, reserve_gib=3.0, gemm_efficiency=gemm, attention_efficiency=0.5,
        gpus_per_node=8, intra_node_fabric="nvswitch", intra_node=intra, inter_node=inter,
        nic_gbit_per_s=200,
    )
