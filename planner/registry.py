"""Name or path -> spec. Lists the built-in model specs and GPU profiles (package data read via
importlib.resources) and parses the cluster grammar of docs/contract.md."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from planner import limits
from planner.errors import SpecError, suggest
from planner.io import require_file
from planner.specs import ClusterSpec, GpuProfile, ModelSpec, PooledCluster

CLUSTER_GRAMMAR = (
    "NxGPU (128xA100), NODESxPERNODExGPU (16x8xH100), a GPU with a variant (64xH100-PCIE), "
    "pools joined by + (64xH100+128xA100), or a path to a cluster/profile YAML"
)
CLUSTER_GRAMMAR_HELP = """\
NxGPU              N GPUs in the GPU's usual nodes: 128xA100 = 16 nodes x 8 A100-SXM4-80GB
NODESxPERNODExGPU  an explicit shape: 16x8xH100, 2x4xA100-40GB (at most a node/NVLink domain)
GPU                a built-in name or alias (planner clusters), with a variant: 64xH100-PCIE;
                   a bare family name is its most common datacenter part (A100 = A100-SXM4-80GB)
Nx./profile.yaml   a GPU profile file (planner profile / calibrate) instead of a built-in name
A+B                pools of two GPU kinds, each in the grammar above: 64xH100+128xA100,
                   8x8xH100+16x8xA100 (pipeline stages are placed on pools)
cluster.yaml       {gpu: NAME | profile path | profile mapping, num_nodes: N, gpus_per_node: P},
                   or {pools: [{gpu, num_nodes, gpus_per_node}, ...]}
profile.yaml       a bare GPU profile: one node of it
--profile P        replaces the built-in profile of the named GPU, keeping the shape"""


def _norm(name: str) -> str:
    """Lookup key: case-insensitive, '_' and '.' and ' ' treated as '-'."""
    return re.sub(r"[\s_.]+", "-", name.strip().lower())


def read_yaml_or_json(path: Path) -> dict[str, Any]:
    """Parse a user's YAML/JSON file into a mapping; SpecError naming the file otherwise."""
    from planner.io import read_text

    text = read_text(path)
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        # libyaml's safe loader when the wheel has it (the same safe schema, 10-50x faster on a
        # large or hostile file than the pure-Python one)
        data = json.loads(text) if path.suffix == ".json" else yaml.load(
            text, Loader=_BUILTIN_YAML_LOADER)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(f"{path}: invalid {kind}: {first}") from None
    except RecursionError:
        raise SpecError(f"{path}: invalid {kind}: nested too deeply") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    odd = next((k for k in data if not isinstance(k, str)), None)
    if odd is not None:
        raise SpecError(f"{path}: field {odd!r}: field names are text, got {type(odd).__name__}")
    return data


def validate_as(cls: type[BaseModel], data: dict[str, Any], where: str) -> Any:
    """Build a pydantic model; a wrong or missing field becomes one SpecError line naming it."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        msg = err["msg"].removeprefix("Value error, ")  # our validators' physics, said plainly
        field = f"field '{loc}': " if loc else ""
        raise SpecError(f"{where}: {field}{msg}{more}") from None


# libyaml's C loader when the wheel has it: reading the built-in specs took 0.6 s of every
# command's start-up with the pure-Python loader, 0.06 s with this one (same safe schema)
_BUILTIN_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_dir(package: str, cls: type[BaseModel]) -> dict[str, Any]:
    out = {}
    for entry in sorted(resources.files(package).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            data = yaml.load(entry.read_text(), Loader=_BUILTIN_YAML_LOADER)
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


def is_file(text: str) -> bool:
    """Whether `text` names an existing file; False for what no file system can hold (a name
    too long, a NUL byte) instead of an OSError."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def _looks_like_path(text: str) -> bool:
    if text.endswith((".yaml", ".yml", ".json")) or "/" in text or is_file(text):
        return True
    try:
        return Path(text).is_dir()  # a folder given for a file: "is a directory"
    except (OSError, ValueError):
        return False


def model_spec_from_hf(config: dict[str, Any], name: str, where: str) -> ModelSpec:
    """A validated ModelSpec from the contents of a HuggingFace config.json (`where` names the
    file in one-line errors). When the architecture equals a built-in model's, the built-in's
    trained seq_len and global_batch are the defaults."""
    from planner.hf_config import architecture, hf_model_fields

    data = hf_model_fields(config, name, where)
    spec = validate_as(ModelSpec, data, where)
    arch = architecture(spec)
    twin = next((m for m in builtin_models().values() if architecture(m) == arch), None)
    if twin is None:
        return spec
    data.update(seq_len=twin.seq_len, global_batch=twin.global_batch,
                description=f"same architecture as the built-in '{twin.name}'")
    return validate_as(ModelSpec, data, where)


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in name or alias, a model spec YAML, or a HuggingFace config.json."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path)
        require_file(path, "model file")
        data = read_yaml_or_json(path)
        if "model_type" in data:  # a HuggingFace config.json
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


_VENDOR_PREFIX = re.compile(r"^(nvidia|tesla|amd-instinct|amd|instinct)-")


def load_gpu(name_or_path: str) -> GpuProfile:
    """A built-in GPU name or alias, or a GPU profile YAML (from `planner profile`/`calibrate`)."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path)
        require_file(path, "profile file")
        data = read_yaml_or_json(path)
        data.setdefault("name", path.stem)
        return validate_as(GpuProfile, data, str(path))
    gpus = builtin_gpus()
    index = _index(gpus)
    key = _norm(name_or_path)
    # torch.cuda.get_device_name() spellings: "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB",
    # "AMD Instinct MI300X" resolve by dropping the vendor prefix
    gpu = index.get(key) or index.get(_VENDOR_PREFIX.sub("", key))
    if gpu is None:
        known = [n for g in gpus.values() for n in [g.name, *g.aliases]]
        raise SpecError(f"unknown GPU '{name_or_path}'{suggest(name_or_path, known)}; "
                        "see `planner clusters`")
    return gpu


def gpu_of_device(device: str) -> GpuProfile | None:
    """The built-in profile whose name or alias appears in a device name as torch reports it
    ('NVIDIA H100 80GB HBM3' -> H100-SXM; the longest match wins), None for a CPU or an unknown
    GPU."""
    text = device.lower().replace(" ", "-")
    if not text or text.startswith("cpu"):
        return None
    best = None
    for gpu in builtin_gpus().values():
        for key in [gpu.name, *gpu.aliases]:
            k = key.lower()
            if k in text and (best is None or len(k) > best[0]):
                best = (len(k), gpu)
    return best[1] if best else None


# NxGPU or NODESxPERNODExGPU; "x", "X", "*" or the multiplication sign separate the counts.
_CLUSTER_RE = re.compile(r"^\s*(\d+)\s*[xX*\u00d7]\s*(?:(\d+)\s*[xX*\u00d7]\s*)?(\S.*?)\s*$")
_GPU_NAME_RE = re.compile(r"^[A-Za-z][\w.\-]*$")
_CLUSTER_KEYS = {"gpu", "num_nodes", "gpus_per_node", "nics_per_node"}


def _malformed(text: str, why: str = "") -> SpecError:
    why = f": {why}" if why else ""
    return SpecError(f"malformed cluster '{text}'{why}; expected {CLUSTER_GRAMMAR}")


def _is_file_ref(text: str) -> bool:
    return text.endswith((".yaml", ".yml", ".json")) or "/" in text or "\\" in text


def parse_cluster_or_pools(text: str, profile: GpuProfile | None = None
                           ) -> ClusterSpec | PooledCluster:
    """parse_cluster, plus pools: `64xH100+128xA100` (each part in the single-pool grammar) or
    a cluster YAML with `pools`. --profile does not apply to pooled clusters (one profile per
    pool: give profile paths in the pool parts)."""
    text = text.strip()
    if "+" in text and not _is_file_ref(text):
        parts = [p.strip() for p in text.split("+")]
        if any(not p for p in parts):
            raise _malformed(text, "an empty pool around '+'")
        if profile is not None:
            raise SpecError("--profile applies to one GPU kind; with pools give a profile path "
                            "in each part (8x8x./h100.yaml+16x8xA100)")
        pools = tuple(parse_cluster(p) for p in parts)
        return _pooled(pools, text)
    if _is_file_ref(text) and Path(text).is_file():
        data = read_yaml_or_json(Path(text))
        if isinstance(data, dict) and "pools" in data:
            return _pools_from_file(Path(text), data, profile)
    return parse_cluster(text, profile)


def _pooled(pools: tuple[ClusterSpec, ...], where: str) -> ClusterSpec | PooledCluster:
    if len(pools) == 1:
        return pools[0]
    names = [p.gpu.name for p in pools]
    if len(set(names)) < len(names):
        raise SpecError(f"cluster '{where}': two pools of {names[0]}; write one pool per GPU "
                        "kind")
    return PooledCluster(pools=pools)


def _pools_from_file(path: Path, data: dict, profile: GpuProfile | None) -> PooledCluster:
    if profile is not None:
        raise SpecError(f"{path}: --profile applies to one GPU kind, not to pools")
    unknown = sorted(set(data) - {"pools"})
    if unknown:
        raise SpecError(f"{path}: field '{unknown[0]}': a pooled cluster YAML has only 'pools'")
    items = data["pools"]
    if not isinstance(items, list) or not items:
        raise SpecError(f"{path}: field 'pools': expected a list of pools "
                        "({gpu, num_nodes, gpus_per_node})")
    pools = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "gpu" not in item:
            raise SpecError(f"{path}: pools[{i}]: expected a mapping with gpu (and num_nodes, "
                            "gpus_per_node)")
        pools.append(_cluster_from_data(item, path, None, where=f"{path}: pools[{i}]"))
    result = _pooled(tuple(pools), str(path))
    if not isinstance(result, PooledCluster):
        raise SpecError(f"{path}: field 'pools': a pooled cluster needs at least two pools")
    return result


def parse_cluster(text: str, profile: GpuProfile | None = None) -> ClusterSpec:
    """Parse the cluster grammar of CONTRACT.md: `NxGPU` (128xA100: N GPUs packed into the GPU's
    usual nodes), `NODESxPERNODExGPU` (16x8xH100), where GPU is a built-in name or alias
    (A100-40GB, H100-PCIE) or a profile YAML path (16x8x./fitted.yaml), or a path to a cluster
    YAML ({gpu: NAME | profile mapping | profile path, num_nodes, gpus_per_node}) or to a bare
    profile YAML (one node of it). `profile` (--profile) replaces the GPU's built-in profile and
    keeps the node shape from the text. SpecError with one readable line otherwise."""
    text = text.strip()
    if "+" in text and not _is_file_ref(text):
        raise SpecError(f"cluster '{text}': a cluster of pools is taken by solve, estimate, "
                        "explain, report and export only (this command takes one GPU kind)")
    m = _CLUSTER_RE.match(text)
    if m is None:
        if _is_file_ref(text) or is_file(text):
            return _cluster_from_file(Path(text), profile)
        if not text:
            raise _malformed(text, "it is empty")
        if re.fullmatch(r"\d+\s*[xX*\u00d7]?(\s*\d+\s*[xX*\u00d7]?)?", text):
            raise _malformed(text, "no GPU name after the counts")
        if _GPU_NAME_RE.match(text):
            raise _malformed(text, "no GPU count before the GPU name")
        raise _malformed(text)
    if any(len(g.lstrip("0")) > 9 for g in (m.group(1), m.group(2) or "") if g):
        raise SpecError(f"cluster '{text}': more than {limits.MAX_GPUS} GPUs, the largest "
                        "cluster accepted")
    first, second, gpu_text = int(m.group(1)), m.group(2), m.group(3)
    if first == 0 or (second is not None and int(second) == 0):
        raise SpecError(f"cluster '{text}': GPU and node counts must be positive")
    if first * (int(second) if second is not None else 1) > limits.MAX_GPUS:
        raise SpecError(f"cluster '{text}': more than {limits.MAX_GPUS} GPUs, the largest "
                        "cluster accepted")
    if profile is not None:
        gpu = profile
    elif _is_file_ref(gpu_text):
        gpu = load_gpu(gpu_text)
    elif _GPU_NAME_RE.match(gpu_text):
        try:
            gpu = load_gpu(gpu_text)
        except SpecError as exc:
            raise SpecError(f"cluster '{text}': {exc}") from None
    else:
        raise _malformed(text, f"'{gpu_text}' is not a GPU name")
    if second is not None:
        nodes, per_node = first, int(second)
        if profile is None and per_node > gpu.domain_gpus:
            raise SpecError(
                f"cluster '{text}': {per_node} GPUs per node is more than a {gpu.name} node holds "
                f"({gpu.gpus_per_node} per node, {gpu.domain_gpus} per NVLink domain)"
            )
        return validate_as(ClusterSpec, dict(gpu=gpu, num_nodes=nodes, gpus_per_node=per_node),
                           f"cluster '{text}'")
    per_node = min(first, gpu.gpus_per_node)
    if first % per_node:
        fit = max(d for d in range(1, per_node + 1) if first % d == 0)
        raise SpecError(
            f"cluster '{text}': {first} GPUs is not a whole number of {gpu.name} nodes of "
            f"{gpu.gpus_per_node}; write NODESxPERNODExGPU to say the shape (e.g. "
            f"{first // fit}x{fit}x{gpu_text})"
        )
    return validate_as(ClusterSpec, dict(gpu=gpu, num_nodes=first // per_node,
                                         gpus_per_node=per_node), f"cluster '{text}'")


def _cluster_from_file(path: Path, profile: GpuProfile | None) -> ClusterSpec:
    """A cluster YAML ({gpu, num_nodes, gpus_per_node}) or a bare GPU profile YAML (one node)."""
    require_file(path, "cluster file")
    return _cluster_from_data(read_yaml_or_json(path), path, profile)


def _cluster_from_data(data: dict, path: Path, profile: GpuProfile | None,
                       where: str | None = None) -> ClusterSpec:
    """One pool from its mapping; `path` locates relative profile paths, `where` names it in
    errors (default: the path)."""
    where = where or str(path)
    if "gpu" not in data and "num_nodes" not in data:  # a bare GPU profile: one node of it
        gpu = validate_as(GpuProfile, dict(data, name=data.get("name", path.stem)), where)
        return validate_as(ClusterSpec, dict(gpu=profile or gpu, num_nodes=1,
                                             gpus_per_node=gpu.gpus_per_node), where)
    unknown = sorted(set(data) - _CLUSTER_KEYS)
    if unknown:
        raise SpecError(f"{where}: field '{unknown[0]}': not a cluster field "
                        f"(a cluster YAML has gpu, num_nodes, gpus_per_node, nics_per_node)")
    if "gpu" not in data:
        raise SpecError(f"{where}: field 'gpu': Field required "
                        "(a GPU name, profile path or mapping)")
    gpu_field = data["gpu"]
    if profile is not None:
        gpu = profile
    elif isinstance(gpu_field, str):
        ref = gpu_field
        if _is_file_ref(ref) and not Path(ref).is_absolute():
            ref = str(path.parent / ref)  # profile paths are relative to the cluster file
        try:
            gpu = load_gpu(ref)
        except SpecError as exc:
            raise SpecError(f"{where}: field 'gpu': {exc}") from None
    elif isinstance(gpu_field, dict):
        gpu = validate_as(GpuProfile, dict(gpu_field, name=gpu_field.get("name", path.stem)),
                          f"{where}: gpu")
    else:
        raise SpecError(f"{where}: field 'gpu': expected a GPU name, profile path or mapping, "
                        f"got {type(gpu_field).__name__}")
    spec = dict(data, gpu=gpu)
    spec.setdefault("gpus_per_node", gpu.gpus_per_node)
    cluster = validate_as(ClusterSpec, spec, where)
    if profile is None and cluster.gpus_per_node > gpu.domain_gpus:
        raise SpecError(f"{where}: field 'gpus_per_node': {cluster.gpus_per_node} is more than a "
                        f"{gpu.name} node holds ({gpu.gpus_per_node} per node, "
                        f"{gpu.domain_gpus} per NVLink domain)")
    return cluster
