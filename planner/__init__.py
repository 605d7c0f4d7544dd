"""planner: a 3D-parallelism planner for LLM training. The public API is __all__ (a test holds it):

    from planner import JobSpec, Layout, estimate, explain, load_model, parse_cluster, solve
    model = load_model("llama70b")
    cluster = parse_cluster("128xA100")
    job = JobSpec(seq_len=4096, global_batch=512)
    est = estimate(model, cluster, job, Layout(tp=8, pp=4, dp=4, mbs=1, zero=1))
    plans = solve(model, cluster, job, pins={"tp": 8}, top_k=3)   # ranked Plans, best first
    for line in explain(model, cluster, job, plans[0], plans).lines():
        print(line)

Heavy pieces (the cost model, the CP-SAT search, torch validation) are imported lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

from planner.errors import InfeasibleError, LayoutError, PlannerError, SpecError
from planner.layout import KNOBS, Layout, default_layout


def _source_tree_subpackages() -> None:
    """Run from a source tree without the package-dir mapping of pyproject.toml (the checkout
    on sys.path, or an editable install in setuptools' compat mode), planner.model_specs,
    planner.hardware_profiles, planner.software_stacks and planner.validate are the folders at
    the top of the repository: put that folder on planner's path after planner's own. A wheel
    or a mapped editable install has them under planner already and is left as it is."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if (root / "software_stacks" / "__init__.py").is_file() and str(root) not in __path__:
        __path__.append(str(root))


_source_tree_subpackages()

# Everything that needs a third-party package (pydantic, yaml, numpy, ortools) loads on first
# use, so `python -m planner` can tell a missing install apart from a bug (planner/__main__.py).
_LAZY = {
    "builtin_gpus": "planner.registry", "builtin_models": "planner.registry",
    "load_gpu": "planner.registry", "load_model": "planner.registry",
    "parse_cluster": "planner.registry", "parse_cluster_or_pools": "planner.registry",
    "ClusterSpec": "planner.specs", "GpuProfile": "planner.specs", "JobSpec": "planner.specs",
    "ModelSpec": "planner.specs", "PooledCluster": "planner.specs",
    "Estimate": "planner.costmodel", "estimate": "planner.costmodel",
    "Plan": "planner.plan", "solve": "planner.search",
    "Explanation": "planner.explanation", "explain": "planner.explanation",
    "resolve_stack": "planner.stacks", "MeasuredRun": "planner.measured.runs",
    "load_runs": "planner.measured.runs",
}

__all__ = [
    # specs: what is trained, on what, how; one layout and its knobs
    "ClusterSpec", "GpuProfile", "JobSpec", "ModelSpec", "PooledCluster", "Layout", "KNOBS",
    "default_layout",
    # load helpers: built-in names, spec / HF config / profile paths, cluster text, stacks, runs
    "builtin_gpus", "builtin_models", "load_gpu", "load_model", "parse_cluster",
    "parse_cluster_or_pools", "resolve_stack", "load_runs", "MeasuredRun",
    # the planner: one layout's prediction, the ranked plans, one plan explained
    "estimate", "Estimate", "solve", "Plan", "explain", "Explanation",
    # errors: PlannerError is every one the planner raises (CLI exit 2; InfeasibleError exit 1)
    "PlannerError", "SpecError", "LayoutError", "InfeasibleError",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
