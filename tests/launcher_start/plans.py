"""The plans every launcher's start-up check runs on: dense, MoE, FSDP, context-parallel and
uneven pipeline splits (issue 23's seven, and a ZeRO-2 with TP). Layouts are typed, not searched,
so each check is about the export, not the solver."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from planner import JobSpec, Layout, load_model, parse_cluster
from planner.launchers import LaunchPlan

PLANS = {
    "dense-llama3-70b-128xA100": (
        "llama3-70b", "16x8xA100", JobSpec(seq_len=4096, global_batch=512),
        Layout(tp=8, pp=4, dp=4, vpp=5, mbs=1, zero=1, recompute="selective", sp=True)),
    # 126 layers over 16 x 8 chunks: the even rule's chunks are 0, 1 x 126, 0 (embedding and loss
    # each take a chunk's slot)
    "uneven-405b-pp16-vpp8": (
        "llama3.1-405b", "2048x8xH100", JobSpec(seq_len=8192, global_batch=2048),
        Layout(tp=8, pp=16, dp=128, vpp=8, mbs=1, zero=1, recompute="none", sp=True)),
    "uneven-405b-7-8x14-7": (
        "llama3.1-405b", "2048x8xH100", JobSpec(seq_len=8192, global_batch=2048),
        Layout(tp=8, pp=16, dp=128, mbs=1, zero=1, recompute="none", sp=True,
               stage_layers=(7,) + (8,) * 14 + (7,))),
    # a split no pair of end-stage flags states (Megatron: --pipeline-model-parallel-layout)
    "uneven-llama3-70b-18-22-21-19": (
        "llama3-70b", "8x8xH100", JobSpec(seq_len=8192, global_batch=256),
        Layout(tp=8, pp=4, dp=2, mbs=1, zero=1, recompute="full", sp=True,
               stage_layers=(18, 22, 21, 19))),
    "moe-mixtral-8x7b-64xH100": (
        "mixtral-8x7b", "8x8xH100", JobSpec(seq_len=4096, global_batch=512),
        Layout(tp=2, pp=4, dp=8, ep=8, mbs=1, zero=1, recompute="selective", sp=True)),
    "fsdp-llama3-8b-zero3": (
        "llama3-8b", "8x8xH100", JobSpec(seq_len=8192, global_batch=512),
        Layout(tp=1, pp=1, dp=64, mbs=1, zero=3, recompute="full")),
    "fsdp-llama3-70b-zero2-tp4": (
        "llama3-70b", "8x8xH100", JobSpec(seq_len=8192, global_batch=512),
        Layout(tp=4, pp=1, dp=16, mbs=1, zero=2, recompute="full", sp=True)),
    "cp-llama3-8b-128k": (
        "llama3-8b", "8x8xH100", JobSpec(seq_len=131072, global_batch=64),
        Layout(tp=8, pp=1, dp=1, cp=8, mbs=1, zero=1, recompute="full", sp=True)),
    # 61 layers on 32 stages: the even rule gives 1, 2 x 29, 1, 1
    "moe-deepseek-v3-pp32": (
        "deepseek-v3", "256x8xH100", JobSpec(seq_len=4096, global_batch=4096),
        Layout(tp=2, pp=32, dp=32, ep=32, mbs=1, zero=1, recompute="full", sp=True)),
    # NVIDIA's DeepSeek-V3 layouts (--pipeline-model-parallel-layout): 'Et|(tt|)*30mL' on pp 8 x
    # vpp 4 (layers per virtual stage 1, 2 x 30, 0) and Megatron's docs example on pp 16 x vpp 2
    "moe-deepseek-v3-pp8-vpp4-layout": (
        "deepseek-v3", "128x8xH100", JobSpec(seq_len=4096, global_batch=8192),
        Layout(tp=2, pp=8, dp=64, ep=64, etp=1, vpp=4, mbs=1, zero=1, recompute="full",
               sp=True, stage_layers=(1,) + (2,) * 30 + (0,))),
    "moe-deepseek-v3-pp16-vpp2-layout": (
        "deepseek-v3", "128x8xH100", JobSpec(seq_len=4096, global_batch=8192),
        Layout(tp=2, pp=16, dp=32, ep=64, etp=1, vpp=2, mbs=1, zero=1, recompute="full",
               sp=True, stage_layers=(3,) + (2,) * 29 + (0, 0))),
}

GPU_ARCH = {"A100": 8, "H100": 9, "H200": 9, "B200": 10}  # CUDA compute capability major


def launch_plan(name: str) -> LaunchPlan:
    model, cluster, job, layout = PLANS[name]
    return LaunchPlan(load_model(model), parse_cluster(cluster), job, layout)


def gpu_arch(plan: LaunchPlan) -> int:
    return next(v for k, v in GPU_ARCH.items() if k in str(plan.cluster))


def script_launch(script: str, tmp: Path, program: str) -> dict:
    """What bash runs: the script executed with `torchrun` (or `deepspeed`) shadowed by a function
    that records its arguments after `program` and the CUDA_DEVICE_MAX_CONNECTIONS it sees."""
    path = tmp / "launch.sh"
    path.write_text(script)
    record = ("import json, os, sys; a = sys.argv[1:]; "
              f"i = next(i for i, w in enumerate(a) if w.endswith({program!r})); "
              "print(json.dumps({'argv': a[i + 1:], 'env': {k: os.environ[k] for k in "
              "('CUDA_DEVICE_MAX_CONNECTIONS',) if k in os.environ}}))")
    wrapper = (f"torchrun() {{ python3 -c {json.dumps(record)} \"$@\"; }}; "
               f"deepspeed() {{ torchrun \"$@\"; }}; . \"$0\"")
    # CUDA_DEVICE_MAX_CONNECTIONS: what the script sets, nothing inherited
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    out = subprocess.run(["bash", "-c", wrapper, str(path)], capture_output=True, text=True,
                         env=env, check=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])
