"""Name or path -> spec. Lists the built-in model specs and GPU profiles (package data read via
importlib.resources) and parses the cluster grammar of ../shared/CONTRACT.md."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import SpecError, suggest
from planner.specs import ClusterSpec, GpuProfile, ModelSpec

CLUSTER_GRAMMAR = (
    "NxGPU (128xA100), NODESxPERNODExGPU (16x8xH100), a GPU with a variant (64xH100-PCIE), "
    "or a path to a cluster/profile YAML"
)


def _norm(name: str) -> str:
    """Lookup key: case-insensitive, '_' and '.' and ' ' treated as '-'."""
    return re.sub(r"[\s_.]+", "-", name.strip().lower())


def read_yaml_or_json(path: Path) -> dict[str, Any]:
    """Parse a user's YAML/JSON file into a mapping; SpecError naming the file otherwise."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(f"{path}: invalid {'JSON' if path.suffix == '.json' else 'YAML'}: {first}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def validate_as(cls: type[BaseModel], data: dict[str, Any], where: str) -> Any:
    """Build a pydantic model; a wrong or missing field becomes one SpecError line naming it."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise SpecError(f"{where}: field '{loc}': {err['msg']}{more}") from None


def _load_dir(package: str, cls: type[BaseModel]) -> dict[str, Any]:
    out = {}
    for entry in sorted(resources.files(package).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            data = yaml.safe_load(entry.read_text())
            data.setdefault("name", entry.name[: -len(".yaml")])
            out[data["name"]] = validate_as(cls, data, f"{package}/{entry.name}")
    return out


@cache
def builtin_models() -> dict[str, ModelSpec]:
    """Built-in model specs by registry name."""
    return _load_dir("planner.model_specs", ModelSpec)


@cache
def builtin_gpus() -> dict[str, GpuProfile]:
    """Built-in GPU profiles by registry name."""
    return _load_dir("planner.hardware_profiles", GpuProfile)


def _index(specs: dict[str, Any]) -> dict[str, Any]:
    idx = {}
    for name, spec in specs.items():
        for key in [name, *spec.aliases]:
            idx[_norm(key)] = spec
    return idx


def _looks_like_path(text: str) -> bool:
    return text.endswith((".yaml", ".yml", ".json")) or "/" in text or Path(text).is_file()


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in name or alias, a model spec YAML, or a HuggingFace config.json."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path)
        if not path.is_file():
            raise SpecError(f"model file not found: {path}")
        data = read_yaml_or_json(path)
        if "model_type" in data:  # a HuggingFace config.json
            from planner.hf_config import model_spec_from_hf

            # dir/config.json is named after its folder (the HF repo's name), other files by stem
            in_repo_dir = path.name == "config.json" and path.parent.name
            name = path.parent.name if in_repo_dir else path.stem
            return model_spec_from_hf(data, name=name, where=str(path))
        data.setdefault("name", path.stem)
        return validate_as(ModelSpec, data, str(path))
    models = builtin_models()
    spec = _index(models).get(_norm(name_or_path))
    if spec is None:
        known = [n for m in models.values() for n in [m.name, *m.aliases]]
        raise SpecError(f"unknown model '{name_or_path}'{suggest(name_or_path, known)}; "
                        "see `planner models`")
    return spec


def load_gpu(name_or_path: str) -> GpuProfile:
    """A built-in GPU name or alias, or a GPU profile YAML (from `planner profile`/`calibrate`)."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path)
        if not path.is_file():
            raise SpecError(f"profile file not found: {path}")
        data = read_yaml_or_json(path)
        data.setdefault("name", path.stem)
        return validate_as(GpuProfile, data, str(path))
    gpus = builtin_gpus()
    gpu = _index(gpus).get(_norm(name_or_path))
    if gpu is None:
        known = [n for g in gpus.values() for n in [g.name, *g.aliases]]
        raise SpecError(f"unknown GPU '{name_or_path}'{suggest(name_or_path, known)}; "
                        "see `planner clusters`")
    return gpu


_CLUSTER_RE = re.compile(r"^\s*(\d+)\s*[xX*]\s*(?:(\d+)\s*[xX*]\s*)?([A-Za-z][\w.\-]*)\s*$")


def parse_cluster(text: str, profile: GpuProfile | None = None) -> ClusterSpec:
    """Parse `NxGPU`, `NODESxPERNODExGPU` or a cluster YAML path. `profile` replaces the GPU's
    built-in profile (--profile), keeping the node shape from the string."""
    if text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise SpecError(f"cluster file not found: {path}")
        data = read_yaml_or_json(path)
        if "gpu" in data and isinstance(data["gpu"], str):  # {gpu: H100, num_nodes: .., ...}
            data = dict(data, gpu=(profile or load_gpu(data["gpu"])).model_dump())
        elif "gpu" not in data:  # a bare GPU profile: one node of it
            gpu = validate_as(GpuProfile, dict(data, name=data.get("name", path.stem)), str(path))
            return ClusterSpec(gpu=profile or gpu, num_nodes=1, gpus_per_node=gpu.gpus_per_node)
        return validate_as(ClusterSpec, data, str(path))
    m = _CLUSTER_RE.match(text)
    if not m:
        raise SpecError(f"malformed cluster '{text}': expected {CLUSTER_GRAMMAR}")
    first, second, gpu_name = int(m.group(1)), m.group(2), m.group(3)
    gpu = profile or load_gpu(gpu_name)
    if first == 0 or (second is not None and int(second) == 0):
        raise SpecError(f"malformed cluster '{text}': counts must be positive")
    if second is not None:
        nodes, per_node = first, int(second)
    else:
        per_node = min(first, gpu.gpus_per_node)
        if first % per_node:
            raise SpecError(
                f"cluster '{text}': {first} GPUs is not a whole number of {gpu.name} nodes of "
                f"{gpu.gpus_per_node}; write NODESxPERNODExGPU to say the shape"
            )
        nodes = first // per_node
    return ClusterSpec(gpu=gpu, num_nodes=nodes, gpus_per_node=per_node)
