"""Speak the launchers' language: export a plan as Megatron-LM, NeMo / Megatron-Bridge,
torchtitan or DeepSpeed configuration, read such a configuration back (`--config`), and read
their training logs (planner.measured.logs).

    export_plan("megatron", LaunchPlan(model, cluster, job, layout)) -> Export
    read_config(path) -> Imported              launcher detected by content
    resolve(imported, model=..., cluster=...)  -> Resolved(model, cluster, job, pins)

One module per launcher (megatron, nemo, torchtitan, deepspeed), each with its checked-in list of
known keys (known_keys/*.txt, the source file and commit in the header) that every export is
validated against.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from planner.errors import LayoutError, SpecError
from planner.launchers.common import (
    Export,
    Imported,
    LaunchPlan,
    model_from_shape,
    unexported_job_fields,
    unexported_model_fields,
    with_warnings,
)
from planner.specs import ClusterSpec, JobSpec, ModelSpec

LAUNCHERS = ("megatron", "nemo", "torchtitan", "deepspeed")

__all__ = ["LAUNCHERS", "Export", "Imported", "LaunchPlan", "Resolved", "detect", "export_plan",
           "module", "read_config", "resolve"]


def module(launcher: str) -> ModuleType:
    """The launcher's module; SpecError naming the choices otherwise."""
    import importlib

    if launcher not in LAUNCHERS:
        raise SpecError(f"unknown launcher '{launcher}'; choose one of {', '.join(LAUNCHERS)}")
    return importlib.import_module(f"planner.launchers.{launcher}")


# The second written form a launcher has, by file suffix: Megatron-Bridge recipe lines (.py)
# instead of YAML, torchtitan's TOML job file (.toml, torchtitan <= v0.2.2) instead of Python.
FORMS = {("nemo", ".py"): "python", ("torchtitan", ".toml"): "toml"}


def export_plan(launcher: str, plan: LaunchPlan, form: str | None = None) -> Export:
    """The plan as the launcher's configuration text (keys validated against its list). `form`
    picks the second written form where a launcher has one (FORMS). A plan on a cluster of pools
    is refused in one line: a launcher's config names one GPU kind and one layout for every
    stage."""
    if len(set(plan.layout.stage_gpu)) > 1:
        raise SpecError(f"{launcher} cannot express a plan on a cluster of pools (its config "
                        "gives every pipeline stage one GPU kind and layout); export a plan of "
                        "one pool's cluster")
    if form is not None and form in {f for (name, _), f in FORMS.items() if name == launcher}:
        result = module(launcher).export(plan, form=form)
    else:
        result = module(launcher).export(plan)
    return with_warnings(result, unexported_model_fields(plan.model)
                         + unexported_job_fields(plan.job))


def detect(text: str, path: str) -> str:
    """Which launcher wrote this config, by content (DeepSpeed before Megatron: a
    Megatron-DeepSpeed script carries Megatron's argument names too)."""
    for name in ("deepspeed", "torchtitan", "nemo", "megatron"):
        if module(name).looks_like(text, path):
            return name
    raise SpecError(f"{path}: not a launcher config this planner reads (Megatron-LM arguments "
                    "or script, NeMo/Megatron-Bridge YAML, torchtitan config, DeepSpeed JSON)")


def read_config(path: str | Path) -> Imported:
    """Read a launcher config: model shape, layout, job recipe and GPU counts it states.
    `FILE.py:FUNCTION` names one function of a torchtitan config registry or a
    Megatron-Bridge recipe file."""
    path = Path(path)
    function = None
    if not path.exists() and ":" in path.name:
        name, _, function = path.name.rpartition(":")
        path = path.with_name(name)
    from planner.io import read_text

    text = read_text(path, "config")  # one line for a folder, a missing file, non-UTF-8 bytes
    launcher = detect(text, str(path))
    if function is None:
        return module(launcher).read(text, str(path))
    if launcher not in ("torchtitan", "nemo"):
        raise SpecError(f"{path}:{function}: only a torchtitan config registry or a "
                        "Megatron-Bridge recipe file has functions to choose from")
    return module(launcher).read(text, str(path), function)


@dataclass
class Resolved:
    """Specs and layout pins from a config with the command line's overrides applied."""

    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    pins: dict[str, Any]
    imported: Imported
    notes: list[str] = field(default_factory=list)


def _cluster(imported: Imported, cluster: str | ClusterSpec | None,
             profile: Any) -> ClusterSpec:
    """--cluster as given; a bare GPU name takes the config's node shape or GPU count."""
    from planner.registry import parse_cluster

    if isinstance(cluster, ClusterSpec):
        return cluster
    if cluster is None:
        raise SpecError(f"{imported.path} does not name the GPU type: give --cluster (a bare "
                        "GPU name such as H100 takes the config's GPU count)")
    if re.match(r"^\d+x", cluster.strip().lower()) or cluster.endswith((".yaml", ".yml",
                                                                         ".json")):
        return parse_cluster(cluster, profile=profile)
    if imported.num_nodes and imported.gpus_per_node:
        return parse_cluster(f"{imported.num_nodes}x{imported.gpus_per_node}x{cluster}",
                             profile=profile)
    n = imported.world_size()
    if not n:
        raise SpecError(f"{imported.path} does not say how many GPUs: give --cluster NxGPU")
    return parse_cluster(f"{n}x{cluster}", profile=profile)


def resolve(imported: Imported, model: str | None, cluster: str | ClusterSpec | None,
            profile: Any = None,
            job_overrides: dict[str, Any] | None = None,
            pin_overrides: dict[str, Any] | None = None) -> Resolved:
    """The config's model, cluster, job and pins, each overridden by what the command line
    gives (`model`, `cluster`, job fields, layout pins). dp is derived from the GPU count."""
    from planner.registry import load_model

    notes = list(imported.notes)
    job_fields = {k: v for k, v in imported.job.items()}
    job_fields.update({k: v for k, v in (job_overrides or {}).items() if v is not None})
    if model is not None:
        model_spec = load_model(model)
        from planner.launchers.common import states_as

        differ = [k for k, v in imported.shape.items() if not states_as(model_spec, k, v)]
        if differ:
            notes.append(f"--model {model} overrides the config's {', '.join(differ)}")
    elif imported.model_name:
        model_spec = load_model(imported.model_name)
    elif imported.shape:
        model_spec = model_from_shape(imported.shape, Path(imported.path).stem,
                                      job_fields.get("seq_len"), job_fields.get("global_batch"))
    else:
        raise SpecError(f"{imported.path} states no model shape: give --model")
    cluster_spec = _cluster(imported, cluster, profile)
    pins = dict(imported.pins)
    pins.update({k: v for k, v in (pin_overrides or {}).items() if v is not None})
    split = getattr(module(imported.launcher), "resolve_split", None)
    if split is not None:  # a split that needs the model's layer count (torchtitan)
        split(imported, model_spec.num_hidden_layers, pins)
    n = cluster_spec.num_gpus
    inner = math.prod(pins.get(k, 1) for k in ("tp", "pp", "cp"))
    if n % inner:
        raise LayoutError(f"tp*pp*cp = {inner} from {imported.path} does not divide the {n} GPUs "
                          f"of {cluster_spec}")
    if "dp" not in pins:
        pins["dp"] = n // inner
    if pins["dp"] * inner != n:
        raise LayoutError(f"{imported.path}: tp*pp*dp*cp = {pins['dp'] * inner} but the cluster "
                          f"{cluster_spec} has {n} GPUs; give --dp or --cluster")
    local = imported.deferred.get("local_batch_size")
    if local and "global_batch" not in job_fields:
        job_fields["global_batch"] = local * pins["dp"]
    job_fields.setdefault("seq_len", model_spec.seq_len)
    job_fields.setdefault("global_batch", model_spec.global_batch)
    from planner.registry import validate_as

    job = validate_as(JobSpec, job_fields, f"job read from {imported.path}")
    return Resolved(model_spec, cluster_spec, job, pins, imported, notes)
