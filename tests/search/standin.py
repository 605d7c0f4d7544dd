"""Test fixtures for the search: small specs built in code, and a stand-in batch cost function.

The stand-in is deliberately simple (textbook formulas: 6*N*D compute, 16 bytes/param sharded by
ZeRO, Korthikanti et al. activations, the 1F1B bubble) and independent of planner.costmodel, so the
search tests check the search (CP-SAT vs the exhaustive oracle), not the cost model."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from planner.specs import GIB, ClusterSpec, GpuProfile, JobSpec, ModelSpec


def make_model(
    layers: int = 8,
    hidden: int = 1024,
    heads: int = 16,
    kv: int = 4,
    ffn: int = 2816,
    vocab: int = 32000,
    experts: int = 0,
    name: str = "toy",
) -> ModelSpec:
    """A llama-style model (swiglu, rmsnorm, rope); MoE when experts > 0 (top-2)."""
    return ModelSpec(
        name=name,
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=ffn,
        vocab_size=vocab,
        activation="swiglu",
        num_experts=experts,
        num_experts_per_tok=2 if experts else 0,
    )


def make_gpu(
    memory_gib: float = 80.0, gpus_per_node: int = 8, name: str = "TOY-80GB",
    host_link_gb_per_s: float | None = None,
) -> GpuProfile:
    """An A100-like profile (312 TFLOP/s bf16, 2 TB/s HBM, NVSwitch 300 GB/s, 200 Gbit/s NIC)."""
    curve = {"points": [(1e6, 100.0), (1e9, 200.0)]}
    return GpuProfile(
        name=name,
        peak_bf16_tflops=312,
        peak_fp16_tflops=312,
        memory_gib=memory_gib,
        hbm_tb_per_s=2.0,
        reserve_gib=2.0,
        gemm_efficiency={"points": [(1e9, 0.5), (1e12, 0.8)]},
        gpus_per_node=gpus_per_node,
        intra_node_fabric="nvswitch",
        intra_node={
            "fabric": "nvswitch",
            "link_gb_per_s": 300,
            "busbw_gb_per_s": curve,
            "latency_us": 5,
        },
        inter_node={
            "fabric": "ib",
            "link_gb_per_s": 25,
            "busbw_gb_per_s": {"points": [(1e6, 10.0), (1e9, 22.0)]},
            "latency_us": 10,
        },
        nic_gbit_per_s=200,
        host_link_gb_per_s=host_link_gb_per_s,
    )


def make_cluster(num_gpus: int, gpu: GpuProfile | None = None) -> ClusterSpec:
    gpu = gpu or make_gpu()
    per_node = min(num_gpus, gpu.gpus_per_node)
    return ClusterSpec(gpu=gpu, num_nodes=num_gpus // per_node, gpus_per_node=per_node)


def standin_batch(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, knobs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Stand-in for planner.costmodel.estimate_batch on the search's knob columns (recompute as
    level codes 0/1/2/3, sp as 0/1): the columns the search reads."""
    col = {
        k: np.asarray(knobs[k], dtype=float)
        for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero")
    }
    rec = np.asarray(knobs["recompute"], dtype=int)
    sp = np.asarray(knobs["sp"], dtype=float)
    layouts = rec  # one entry per layout
    tp, pp, dp, cp, ep, vpp, mbs, zero = (
        col[k] for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero")
    )
    n = cluster.num_gpus
    s, h, a, layers = (
        job.seq_len,
        model.hidden_size,
        model.num_attention_heads,
        model.num_hidden_layers,
    )
    params = model.num_params
    # memory: 2 (weights) + 4 (fp32 grads) + 12 (master + Adam) bytes per parameter (ZeRO paper)
    # expert-TP below tp (MoE): less sharding of the experts, fewer expert collectives
    etp = np.asarray(knobs["etp"], dtype=float) if "etp" in knobs else tp
    shard = params / (tp * pp) / np.where(model.is_moe, ep, 1.0) ** 0.5 * (tp / etp) ** 0.25
    weights = 2 * shard / np.where(zero >= 3, dp * cp, 1)
    grads = 4 * shard / np.where(zero >= 2, dp * cp, 1)
    optim = 12 * shard / np.where(zero >= 1, dp * cp, 1)
    # activations per layer (Korthikanti et al. 2022): s*b*h*(34 + 5*a*s/h) bytes, /tp with sp
    per_layer = s / cp * mbs * h * (34 + 5 * a * s / cp / h)
    per_layer = np.where(rec == 1, s / cp * mbs * h * 34, per_layer)
    per_layer = np.where(rec == 2, s / cp * mbs * h * 2, per_layer)
    per_layer = np.where(rec == 3, s / cp * mbs * h * 1, per_layer)  # offload: a resident layer
    per_layer = per_layer / np.where(sp > 0, tp, np.sqrt(tp))
    in_flight = np.minimum(pp, job.global_batch / (dp * mbs))
    acts = per_layer * np.ceil(layers / pp) * in_flight * (1 + (vpp > 1) * (pp - 1) / (pp * vpp))
    other = np.full(len(layouts), 0.5 * GIB)
    peak = (weights + grads + optim + acts + other) / GIB
    capacity = cluster.gpu.usable_memory_gib
    # time: 6*N*D FLOPs (Kaplan), efficiency falling with tp, + recompute, bubble, comm
    tokens = job.global_batch * s
    compute = 6 * params * tokens / n / (cluster.gpu.peak_bf16_tflops * 1e12)
    compute = compute / (0.6 - 0.02 * np.log2(tp) - 0.01 * np.log2(mbs + 1))
    compute = compute * np.array([1.0, 1.05, 1.33, 1.02])[rec]  # offload: a little copy time
    micro = job.global_batch / (dp * mbs)
    bubble = compute * (pp - 1) / (micro * vpp)
    tp_comm = compute * 0.04 * np.log2(tp) * np.where(sp > 0, 0.9, 1.0)
    tp_comm = tp_comm * np.where(model.is_moe, 0.5 + 0.5 * etp / tp, 1.0)
    pp_comm = 1e-4 * (pp > 1) * micro * vpp
    dp_comm = 2 * 2 * shard / 20e9 * (dp * cp - 1) / (dp * cp) * (1 + 0.5 * (zero >= 3)) * 0.2
    cp_comm = compute * 0.03 * np.log2(cp)
    step = compute + bubble + tp_comm + pp_comm + dp_comm + cp_comm
    return {
        "step_time_s": step,
        "peak_mem_gb": peak,
        "mem_capacity_gb": np.full(len(layouts), capacity),
        "fits": peak <= capacity,
        "mem_weights_gb": weights / GIB,
        "mem_grads_gb": grads / GIB,
        "mem_optimizer_gb": optim / GIB,
        "mem_activations_gb": acts / GIB,
        "mem_other_gb": other / GIB,
        # the terms planner.search.bands' robustness score reads (ties)
        "time_compute_s": compute,
        "time_tp_comm_s": tp_comm,
        "time_cp_comm_s": cp_comm,
        "time_pp_comm_s": pp_comm,
        "time_pp_bubble_s": bubble,
        "time_dp_comm_exposed_s": dp_comm,
    }


def make_job(seq_len: int = 2048, global_batch: int = 64) -> JobSpec:
    return JobSpec(seq_len=seq_len, global_batch=global_batch)
