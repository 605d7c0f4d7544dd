"""planner: a 3D-parallelism planner for LLM training.

    from planner import load_model, parse_cluster, JobSpec, Layout, estimate
    model = load_model("llama70b")
    cluster = parse_cluster("128xA100")
    job = JobSpec(seq_len=4096, global_batch=512)
    est = estimate(model, cluster, job, Layout(tp=8, pp=4, dp=4, mbs=1, zero=1))

Heavy pieces (the cost model, the CP-SAT search, torch validation) are imported lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

from planner.errors import InfeasibleError, LayoutError, PlannerError, SpecError
from planner.layout import Layout

# Everything that needs a third-party package (pydantic, yaml, numpy, ortools) loads on first
# use, so `python -m planner` can tell a missing install apart from a bug (planner/__main__.py).
_LAZY = {
    "builtin_gpus": "planner.registry", "builtin_models": "planner.registry",
    "load_gpu": "planner.registry", "load_model": "planner.registry",
    "parse_cluster": "planner.registry",
    "ClusterSpec": "planner.specs", "GpuProfile": "planner.specs", "JobSpec": "planner.specs",
    "ModelSpec": "planner.specs",
    "estimate": "planner.costmodel", "solve": "planner.search",
}

__all__ = [
    "ClusterSpec", "GpuProfile", "InfeasibleError", "JobSpec", "Layout", "LayoutError",
    "ModelSpec", "PlannerError", "SpecError", "builtin_gpus", "builtin_models", "estimate",
    "load_gpu", "load_model", "parse_cluster", "solve",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
