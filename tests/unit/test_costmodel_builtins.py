"""Every built-in model on every built-in GPU: finite, consistent predictions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.costmodel import estimate_batch, layout_violations
from planner.layout import Layout
from planner.plan import MEM_COLUMNS, TIME_COLUMNS
from planner.registry import builtin_gpus, builtin_models
from planner.specs import ClusterSpec, JobSpec


def _layouts(model, cluster, job):
    n = cluster.num_gpus
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16):
            for zero, rc in ((1, "selective"), (3, "full"), (0, "none")):
                ep = 8 if model.is_moe and model.num_experts % 8 == 0 else 1
                if n % (tp * pp):
                    continue
                dp = n // (tp * pp)
                mbs = 1
                lo = Layout(tp=tp, pp=pp, dp=dp, ep=ep if dp % ep == 0 else 1, mbs=mbs,
                            zero=zero, recompute=rc, sp=tp > 1)
                if not layout_violations(model, cluster, job, lo):
                    out.append(lo)
    return out


@pytest.mark.parametrize("gpu_name", sorted(builtin_gpus()))
def test_all_models_give_finite_consistent_columns(gpu_name):
    gpu = builtin_gpus()[gpu_name]
    per = gpu.gpus_per_node
    cluster = ClusterSpec(gpu=gpu, num_nodes=max(1, 256 // per), gpus_per_node=per)
    precision = "fp8" if gpu.peak_fp8_tflops else "bf16"
    for model in builtin_models().values():
        job = JobSpec(seq_len=model.seq_len, global_batch=model.global_batch, precision=precision)
        los = _layouts(model, cluster, job)
        if not los:
            continue
        cols = estimate_batch(model, cluster, job, los)
        step = cols["step_time_s"]
        assert np.all(np.isfinite(step)) and np.all(step > 0), model.name
        assert np.allclose(sum(cols[c] for c in TIME_COLUMNS), step, rtol=1e-12)
        assert np.allclose(sum(cols[c] for c in MEM_COLUMNS), cols["peak_mem_gb"], rtol=1e-12)
        assert np.all(cols["mfu"] < 1.0) and np.all(cols["mfu"] > 0), model.name
        assert np.all(cols["hfu"] >= cols["mfu"] * (1 - 1e-12))
        assert math.isfinite(float(cols["peak_mem_gb"].max()))
