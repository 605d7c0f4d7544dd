"""Validated inputs: model specs, GPU profiles, clusters, jobs (pydantic v2, frozen,
extra=forbid)."""

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
