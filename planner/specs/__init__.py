"""Validated inputs: model specs, GPU profiles, clusters, jobs (pydantic v2, frozen,
extra=forbid; defer_build: each model's validator is built on its first use, so a command that
reads only GPU profiles, `planner clusters`, does not build ModelSpec's or JobSpec's at import,
~40% of this package's import time)."""

from planner.specs.hardware import (
    GIB,
    ClusterSpec,
    Curve,
    GpuProfile,
    JobSpec,
    LinkProfile,
    PooledCluster,
)
from planner.specs.model import ModelSpec

__all__ = ["GIB", "ClusterSpec", "Curve", "GpuProfile", "JobSpec", "LinkProfile", "ModelSpec",
           "PooledCluster"]
