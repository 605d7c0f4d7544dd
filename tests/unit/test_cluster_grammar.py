"""The cluster grammar of CONTRACT.md (planner.registry.parse_cluster): strings, YAML files, and
the one-line errors for bad input. Expected shapes are worked out by hand from the node sizes
(DGX A100/H100: 8 GPUs per node; GB200 NVL72: 4-GPU trays in a 72-GPU NVLink domain)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.errors import PlannerError, SpecError
from planner.registry import CLUSTER_GRAMMAR, load_gpu, parse_cluster

# text -> (num_nodes, gpus_per_node, profile name, NVLink domain of the cluster)
GOOD = [
    ("128xA100", 16, 8, "A100-SXM4-80GB", 8),
    ("16384xH100", 2048, 8, "H100-SXM", 8),
    ("16x8xH100", 16, 8, "H100-SXM", 8),
    ("128xA100-40GB", 16, 8, "A100-SXM4-40GB", 8),
    ("64xH100-PCIE", 8, 8, "H100-PCIE", 8),
    ("64xh100-pcie", 8, 8, "H100-PCIE", 8),
    ("4xH100", 1, 4, "H100-SXM", 4),          # fewer GPUs than a node: one partial node
    ("1xA100", 1, 1, "A100-SXM4-80GB", 1),
    ("2x4xA100-40GB", 2, 4, "A100-SXM4-40GB", 4),
    ("128X A100", 16, 8, "A100-SXM4-80GB", 8),  # case and spaces around the separator
    ("8*8*H200", 8, 8, "H200-SXM", 8),
    ("16\u00d78\u00d7B200", 16, 8, "B200-SXM", 8),  # the multiplication sign
    ("144xGB200", 36, 4, "GB200-NVL72", 72),   # 144 GPUs = 36 trays of 4, NVLink domain 72
    ("2x72xGB200", 2, 72, "GB200-NVL72", 72),  # a node may be the whole NVL72 domain
    ("  32xMI300X ", 4, 8, "MI300X", 8),
]


@pytest.mark.parametrize(("text", "nodes", "per_node", "gpu", "domain"), GOOD)
def test_good_cluster_strings(text, nodes, per_node, gpu, domain):
    cluster = parse_cluster(text)
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.gpu.name) == (nodes, per_node, gpu)
    assert cluster.num_gpus == nodes * per_node
    assert cluster.domain_gpus == domain


# text -> fragments the one-line message must contain
BAD = [
    ("12x", ["malformed cluster '12x'", "no GPU name", "NxGPU (128xA100)"]),
    ("0xH100", ["'0xH100'", "must be positive"]),
    ("4x0xH100", ["must be positive"]),
    ("128xA1000", ["unknown GPU 'A1000'", "did you mean", "A100", "planner clusters"]),
    ("64xH1OO", ["unknown GPU 'H1OO'"]),
    ("H100", ["no GPU count", "NODESxPERNODExGPU"]),
    ("", ["it is empty"]),
    ("8x8x8", ["'8' is not a GPU name"]),
    ("4.5xH100", ["malformed cluster '4.5xH100'"]),
    ("-8xH100", ["malformed cluster"]),
    ("12xH100", ["12 GPUs is not a whole number of H100-SXM nodes of 8", "2x6xH100"]),
    ("2x16xH100", ["16 GPUs per node", "8 per node"]),
    ("2x80xGB200", ["80 GPUs per node", "72 per NVLink domain"]),
    ("nope/cluster.yaml", ["cluster file not found"]),
    ("16x8x./missing-profile.yaml", ["profile file not found"]),
]


@pytest.mark.parametrize(("text", "fragments"), BAD)
def test_bad_cluster_strings_raise_one_readable_line(text, fragments):
    with pytest.raises(SpecError) as info:
        parse_cluster(text)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value, PlannerError) and info.value.exit_code == 2


def test_grammar_text_names_every_form():
    for form in ("NxGPU", "NODESxPERNODExGPU", "64xH100-PCIE", "YAML"):
        assert form in CLUSTER_GRAMMAR


def test_profile_replaces_the_builtin_gpu_and_keeps_the_shape():
    fitted = load_gpu("H100").model_copy(update={"name": "my-h100", "gpus_per_node": 8})
    cluster = parse_cluster("16x8xH100", profile=fitted)
    assert cluster.gpu.name == "my-h100" and cluster.num_gpus == 128
    # with a profile given, the GPU name in the text is not looked up (a calibrated name)
    assert parse_cluster("64xmy-h100", profile=fitted).num_nodes == 8


def _write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_cluster_yaml_with_a_gpu_name(tmp_path):
    f = _write(tmp_path / "c.yaml", {"gpu": "A100-40GB", "num_nodes": 4, "gpus_per_node": 8})
    cluster = parse_cluster(str(f))
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.gpu.name) == (4, 8, "A100-SXM4-40GB")


def test_cluster_yaml_defaults_gpus_per_node_to_the_profile(tmp_path):
    f = _write(tmp_path / "c.yaml", {"gpu": "GB200", "num_nodes": 18})
    cluster = parse_cluster(str(f))
    assert (cluster.num_gpus, cluster.domain_gpus) == (72, 72)


def test_cluster_yaml_states_its_nics(tmp_path):
    """DLPerf's V100 cluster: one 100 Gb/s NIC per 8-GPU node (its README's topology), where the
    profile's DGX-1 has four: 1/8 NIC per GPU instead of 0.5."""
    f = _write(tmp_path / "c.yaml", {"gpu": "V100-SXM2-16GB", "num_nodes": 4, "nics_per_node": 1})
    cluster = parse_cluster(str(f))
    assert cluster.nics_per_gpu == 1 / 8 and cluster.gpu.nics_per_gpu == 0.5
    assert parse_cluster("32xV100-SXM2-16GB").nics_per_gpu == 0.5


def test_cluster_yaml_with_a_profile_path_relative_to_the_file(tmp_path):
    profile = load_gpu("H100").model_dump()
    profile["name"] = "lab-h100"
    _write(tmp_path / "lab-h100.yaml", profile)
    f = _write(tmp_path / "c.yml", {"gpu": "lab-h100.yaml", "num_nodes": 2, "gpus_per_node": 8})
    cluster = parse_cluster(str(f))
    assert cluster.gpu.name == "lab-h100" and cluster.num_gpus == 16
    # the same profile file used in the string grammar
    assert parse_cluster(f"4x8x{tmp_path / 'lab-h100.yaml'}").gpu.name == "lab-h100"


def test_cluster_yaml_with_an_inline_profile(tmp_path):
    profile = load_gpu("A100").model_dump()
    profile.pop("name")
    f = _write(tmp_path / "inline.yaml", {"gpu": profile, "num_nodes": 3, "gpus_per_node": 8})
    cluster = parse_cluster(str(f))
    assert cluster.gpu.name == "inline" and cluster.num_gpus == 24


def test_bare_profile_yaml_is_one_node(tmp_path):
    profile = load_gpu("L40S").model_dump()
    f = _write(tmp_path / "l40s-box.yaml", profile)
    cluster = parse_cluster(str(f))
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.gpu.name) == (1, 8, "L40S")


@pytest.mark.parametrize(("data", "fragments"), [
    ({"gpu": "H100", "gpus_per_node": 8}, ["field 'num_nodes'", "Field required"]),
    ({"num_nodes": 2, "gpus_per_node": 8}, ["field 'gpu'", "Field required"]),
    ({"gpu": "H100", "num_nodes": "two"}, ["field 'num_nodes'", "integer"]),
    ({"gpu": "H100", "num_nodes": 0}, ["field 'num_nodes'", "greater than 0"]),
    ({"gpu": "H100", "num_nodes": 2, "gpu_per_node": 8},
     ["field 'gpu_per_node'", "not a cluster field"]),
    ({"gpu": "H100", "num_nodes": 2, "gpus_per_node": 16}, ["field 'gpus_per_node'", "8 per node"]),
    ({"gpu": "H100", "num_nodes": 2, "nics_per_node": 0},
     ["field 'nics_per_node'", "greater than 0"]),
    ({"gpu": "H1000", "num_nodes": 2}, ["field 'gpu'", "unknown GPU 'H1000'", "H100"]),
    ({"gpu": 7, "num_nodes": 2}, ["field 'gpu'", "got int"]),
    ({"gpu": {"name": "x", "memory_gib": 80}, "num_nodes": 2}, ["gpu: field", "Field required"]),
])
def test_bad_cluster_yaml_names_the_field_and_the_file(tmp_path, data, fragments):
    f = _write(tmp_path / "bad-cluster.yaml", data)
    with pytest.raises(SpecError) as info:
        parse_cluster(str(f))
    message = str(info.value)
    assert str(f) in message and "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_invalid_yaml_and_non_mapping(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpu: [H100\nnum_nodes: 2\n")
    with pytest.raises(SpecError, match=r"broken.yaml: invalid YAML"):
        parse_cluster(str(broken))
    listing = _write(tmp_path / "list.yaml", ["H100", 2])
    with pytest.raises(SpecError, match=r"expected a mapping at the top level, got list"):
        parse_cluster(str(listing))
