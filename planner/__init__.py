"""planner: a 3D-parallelism planner for LLM training.

    from planner import load_model, parse_cluster, JobSpec, Layout, estimate
    model = load_model("llama70b")
    cluster = parse_cluster("128xA100")
    job = JobSpec(seq_len=4096, global_batch=512)
    est = estimate(model, cluster, job, Layout(tp=8, pp=4, dp=4, mbs=1, zero=1))

Heavy pieces (the cost model, the CP-SAT search, torch validation) are imported lazily.
"""

from __future__ import annotations

from typing import Any

from planner.errors import InfeasibleError, LayoutError, PlannerError, SpecError
from planner.layout import Layout
from planner.registry import builtin_gpus, builtin_models, load_gpu, load_model, parse_cluster
from planner.specs import ClusterSpec, GpuProfile, JobSpec, ModelSpec

__all__ = [
    "ClusterSpec", "GpuProfile", "InfeasibleError", "JobSpec", "Layout", "LayoutError",
    "ModelSpec", "PlannerError", "SpecError", "builtin_gpus", "builtin_models", "estimate",
    "load_gpu", "load_model", "parse_cluster", "solve",
]


def __getattr__(name: str) -> Any:
    if name == "estimate":
        from planner.costmodel import estimate

        return estimate
    if name == "solve":
        from planner.search import solve

        return solve
    raise AttributeError(name)
