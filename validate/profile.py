"""Turn the raw numbers of bench.py into a GpuProfile (the schema of the built-in profiles) with
every value's source, and write it as YAML. No torch here.

CPU runs compute in fp32 (validate autocasts to bf16 on GPUs only), so a CPU profile's
peak_bf16_tflops / peak_fp16_tflops hold the best measured fp32 GEMM rate and gemm_efficiency
is the fp32 sweep over it: the cost model's bf16 path then predicts the fp32 CPU runs. On a GPU
that matches a built-in profile, the peaks stay the vendor's and the curves are measured against
them, so MFU keeps its usual meaning.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml

from planner.io import write_text_atomic
from planner.registry import validate_as
from planner.specs import GpuProfile

GIB = 2**30


def _sig(x: float, digits: int = 4) -> float:
    """x rounded to `digits` significant digits (measurements carry no more)."""
    return float(f"{x:.{digits}g}")


def _curve(points: list[list[float]], scale: float, source: str) -> dict:
    """Curve dict from (x, y) pairs, y divided by `scale`; duplicate x dropped."""
    out, last = [], 0.0
    for x, y in sorted((p[0], p[1]) for p in points):
        if x > last:
            out.append([float(x), _sig(float(y) / scale)])
            last = x
    return {"points": out, "source": source}


def _link(sweep: dict[str, list[list[float]]], p2p: list[list[float]], n: int, fabric: str,
          where: str, sources: dict[str, str], prefix: str) -> dict[str, Any]:
    """LinkProfile fields from an all-reduce sweep on n ranks and a send/recv sweep."""
    ar = sweep["all_reduce"]
    busbw = [[s, bw / 1e9] for s, _t, bw in ar]
    plateau = max(b for _s, b in busbw)
    # all-reduce of the smallest message: 2 (n-1) ring steps of pure latency
    smallest = min(ar, key=lambda r: r[0])
    step_us = smallest[1] / (2 * (n - 1)) * 1e6
    p2p_small = min(p2p, key=lambda r: r[0])[1] * 1e6 if p2p else step_us
    sources[f"{prefix}.busbw_gb_per_s"] = (
        f"measured: all-reduce on {n} ranks ({where}), busbw = 2 S (n-1)/n / t (nccl-tests), "
        "median time of the slowest rank")
    sources[f"{prefix}.link_gb_per_s"] = "measured: the all-reduce busbw plateau (no spec exists)"
    sources[f"{prefix}.latency_us"] = (
        f"measured: all-reduce of {int(smallest[0])} B ({smallest[1] * 1e6:.0f} us) / "
        f"2(n-1) ring steps")
    sources[f"{prefix}.base_latency_us"] = (
        "measured: one-way send/recv of the smallest message (half a ping-pong) minus one ring "
        "step's latency")
    return {
        "fabric": fabric,
        "link_gb_per_s": _sig(plateau),
        "busbw_gb_per_s": _curve(busbw, 1.0, f"all-reduce, {n} ranks, {where}"),
        "latency_us": _sig(max(step_us, 0.01)),
        "base_latency_us": _sig(max(p2p_small - step_us, 0.0)),
    }


def build_profile(raw: dict[str, Any], name: str, spec: GpuProfile | None = None) -> GpuProfile:
    """The GpuProfile measured by bench.py. `spec`: the built-in profile of this GPU, if known
    (its vendor peaks, capacity and fabric are kept; everything measurable is measured)."""
    cpu = raw["backend"] == "gloo"
    n = raw["nproc_per_node"]
    if n < 2:
        from planner.errors import SpecError

        raise SpecError("profiling needs at least 2 processes per node (--nproc 2) to measure "
                        "collectives")
    sources: dict[str, str] = {}
    gemm = raw["gemm"]
    dtype = "float32" if cpu else "bfloat16"
    best = max(r for _x, r in gemm[dtype])
    if spec is not None and not cpu:
        peak_bf16, peak_fp16 = spec.peak_bf16_tflops * 1e12, spec.peak_fp16_tflops * 1e12
        sources["peak_bf16_tflops"] = f"vendor spec, from the built-in profile {spec.name}"
        sources["peak_fp16_tflops"] = f"vendor spec, from the built-in profile {spec.name}"
    else:
        peak_bf16 = peak_fp16 = best
        what = ("the fp32 matmuls CPU runs compute in" if cpu else "bf16, no spec known")
        sources["peak_bf16_tflops"] = (f"measured: best {dtype} GEMM rate of the square sweep "
                                       f"({what})")
        sources["peak_fp16_tflops"] = sources["peak_bf16_tflops"]
    threads = raw.get("threads_per_rank")
    sources["gemm_efficiency"] = (
        f"measured: torch.mm {dtype} square sweep, x = 2 n^3 FLOP, y = rate / peak (fastest "
        f"call), all {n} ranks at once" + (f", {threads} threads each" if cpu else "")
        + "".join(f"; {line}" for line in raw.get("sweeps_stopped", [])
                  if line.startswith(f"GEMM {dtype}:")))
    attn = raw["attention"]
    attention_eff = min(1.2, attn["flop_per_s"] / peak_bf16)
    sources["attention_efficiency"] = (
        f"measured: causal SDPA fwd+bwd, b{attn['batch']} h{attn['heads']} s{attn['seq']} "
        f"d{attn['head_dim']} {attn['dtype']}, {attn['flop_per_s'] / 1e9:.1f} GFLOP/s "
        "(model FLOPs: 3 x 4bhs^2d/2) / peak")
    mem = raw["memory"]
    if cpu:
        memory_gib = mem["total_bytes"] / GIB
        sources["memory_gib"] = f"measured: MemTotal of /proc/meminfo / {n} ranks"
        reserve_gib = mem["reserved_bytes"] / GIB
        sources["reserve_gib"] = ("measured: resident set size of one rank after importing torch "
                                  "and joining the process group")
    else:
        memory_gib = mem["total_bytes"] / GIB
        sources["memory_gib"] = "measured: torch.cuda.mem_get_info total"
        reserve_gib = mem["reserved_bytes"] / GIB
        sources["reserve_gib"] = ("measured: device memory in use after CUDA and NCCL "
                                  "initialization (total - free)")
    hbm = raw["copy_bytes_per_s"] / 1e12
    sources["hbm_tb_per_s"] = "measured: large tensor copy, read + write bytes / time (STREAM Copy)"
    sources["hbm_efficiency"] = "1: hbm_tb_per_s is already the achieved copy bandwidth"
    fabric = "gloo over loopback TCP" if cpu else (spec.intra_node.fabric if spec else "unknown")
    intra = _link(raw["intra_node"], raw.get("intra_node_send_recv", []), n, fabric,
                  "one node", sources, "intra_node")
    if "inter_node" in raw:
        world = raw["world_size"]
        inter = _link(raw["inter_node"], raw.get("inter_node_send_recv", []), world,
                      "across nodes", f"{raw['nnodes']} nodes", sources, "inter_node")
    else:
        inter = dict(intra, fabric="not measured (one node): copy of intra_node")
        for key in ("busbw_gb_per_s", "link_gb_per_s", "latency_us", "base_latency_us"):
            sources[f"inter_node.{key}"] = "not measured (profiled on one node): intra_node's"
    nic = spec.nic_gbit_per_s if spec else inter["link_gb_per_s"] * 8
    sources["nic_gbit_per_s"] = (f"from the built-in profile {spec.name}" if spec else
                                 "the inter-node busbw plateau x 8 (no NIC spec)")
    sources["gpus_per_node"] = f"the {n} processes per node the profile was measured with"
    if cpu:
        dp_overlap = 0.0
        sources["dp_overlap"] = ("0: gloo collectives run on the same cores as compute, nothing "
                                 "hides them (not measured; `planner calibrate` fits it)")
    else:
        dp_overlap = spec.dp_overlap if spec else 0.8
        sources["dp_overlap"] = "stock value (not measured; `planner calibrate` fits it)"
    sources["step_overhead_s"] = "0: not measured by profile; `planner calibrate` fits it"
    sources["layer_overhead_us"] = "0: not measured by profile; `planner calibrate` fits it"
    data = {
        "name": name,
        "description": (f"measured by `planner profile` on {raw['hostname']}: {raw['device']}, "
                        f"{raw['nnodes']} node(s) x {n} processes, {raw['backend']}"),
        "peak_bf16_tflops": _sig(peak_bf16 / 1e12),
        "peak_fp16_tflops": _sig(peak_fp16 / 1e12),
        "memory_gib": _sig(memory_gib),
        "hbm_tb_per_s": _sig(hbm),
        "hbm_efficiency": 1.0,
        "reserve_gib": _sig(reserve_gib),
        "gemm_efficiency": _curve(gemm[dtype], peak_bf16, f"torch.mm {dtype} square sweep"),
        "attention_efficiency": _sig(attention_eff),
        "gpus_per_node": n,
        "intra_node_fabric": "loopback" if cpu else (spec.intra_node_fabric if spec else "pcie"),
        "intra_node": intra,
        "inter_node": inter,
        "nic_gbit_per_s": _sig(nic),
        "dp_overlap": dp_overlap,
        "step_overhead_s": 0.0,
        "provenance": {
            "made_by": "planner profile",
            "date": raw.get("date") or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "torch_version": raw.get("torch_version"), "device": raw.get("device"),
            "backend": raw["backend"], "world_size": raw["world_size"],
            "threads_per_rank": threads,
            "gemm_all_dtypes_flop_per_s": {k: [[x, round(r)] for x, r in v]
                                           for k, v in gemm.items()},
            # dtypes not measured (emulated on this CPU) and sweeps the time budget cut short
            "gemm_dtypes_skipped": dict(raw.get("gemm_skipped", {})),
            "sweeps_stopped": list(raw.get("sweeps_stopped", [])),
            "budget_s": raw.get("budget"), "quick": raw.get("quick"),
            "collectives_intra_node": raw["intra_node"],
            "send_recv_intra_node": raw.get("intra_node_send_recv", []),
        },
        "sources": sources,
    }
    if spec is not None and not cpu:
        data["peak_fp8_tflops"] = spec.peak_fp8_tflops
        data["peak_tf32_tflops"] = spec.peak_tf32_tflops
        data["nvlink_domain_gpus"] = spec.nvlink_domain_gpus
        data["nics_per_gpu"] = spec.nics_per_gpu
    return validate_as(GpuProfile, data, f"measured profile {name}")


def profile_yaml(profile: GpuProfile) -> str:
    """The profile as YAML in the built-in files' layout (None fields left out)."""
    header = ("# Measured by `planner profile` (planner.validate.bench); every value's source is "
              "under `sources`.\n")
    data = profile.model_dump(mode="json", exclude_none=True)
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100)


class _Dumper(yaml.SafeDumper):
    """Block style, except a list of numbers (a curve point) on one line: [x, y]."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(isinstance(v, int | float) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def write_profile(profile: GpuProfile, path: str | Path) -> None:
    """Write the profile atomically."""
    write_text_atomic(path, profile_yaml(profile))
