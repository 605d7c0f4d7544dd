"""Bad hardware input through the real entry point (planner.cli.main, which maps PlannerError to
one stderr line and exit code 2): unknown GPUs, malformed cluster strings, broken YAML. Run as
`python -m planner ...` subprocesses, since typer's CliRunner on `app` bypasses main()."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.cli.options import PrecisionChoice, load_inputs
from planner.errors import SpecError
from planner.registry import load_gpu


def run_planner(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --cluster text -> fragments of the one-line message (CONTRACT.md exit code 2: bad input)
BAD_CLUSTERS = [
    ("128xA1000", ["unknown GPU 'A1000'", "did you mean", "A100"]),
    ("12x", ["malformed cluster '12x'", "NxGPU", "NODESxPERNODExGPU"]),
    ("0xH100", ["must be positive"]),
    ("12xH100", ["not a whole number of H100-SXM nodes"]),
]


@pytest.mark.parametrize(("cluster", "fragments"), BAD_CLUSTERS)
def test_load_inputs_rejects_bad_clusters(cluster, fragments):
    with pytest.raises(SpecError) as info:
        load_inputs("llama70b", cluster, None, None, None, precision=PrecisionChoice.bf16)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_load_inputs_resolves_a_good_cluster():
    _model, cluster, job = load_inputs("llama70b", "128xA100", None, 4096, 1024,
                                       precision=PrecisionChoice.bf16)
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.gpu.name) == (16, 8, "A100-SXM4-80GB")
    assert (job.seq_len, job.global_batch) == (4096, 1024)


def test_load_inputs_profile_replaces_the_gpu(tmp_path):
    fitted = load_gpu("H100").model_dump()
    fitted["name"] = "h100-fitted"
    path = tmp_path / "h100-fitted.yaml"
    path.write_text(yaml.safe_dump(fitted))
    _model, cluster, _job = load_inputs("llama70b", "64xH100", path, None, None,
                                        precision=PrecisionChoice.bf16)
    assert cluster.gpu.name == "h100-fitted" and cluster.num_gpus == 64


@pytest.mark.slow
@pytest.mark.parametrize(("cluster", "fragments"), BAD_CLUSTERS[:3])
def test_estimate_with_a_bad_cluster_exits_2_with_one_line(cluster, fragments):
    result = run_planner("estimate", "--model", "llama70b", "--cluster", cluster,
                         "--tp", "8", "--pp", "1")
    assert_one_line_exit_2(result, *fragments)


@pytest.mark.slow
def test_solve_with_an_unknown_gpu_exits_2_with_one_line():
    result = run_planner("solve", "--model", "llama70b", "--cluster", "128xA1000")
    assert_one_line_exit_2(result, "unknown GPU 'A1000'", "did you mean", "A100")


@pytest.mark.slow
def test_estimate_with_a_cluster_yaml_missing_a_field(tmp_path):
    bad = tmp_path / "cluster.yaml"
    bad.write_text("gpu: H100\ngpus_per_node: 8\n")
    result = run_planner("estimate", "--model", "llama70b", "--cluster", str(bad),
                         "--tp", "8", "--pp", "1")
    assert_one_line_exit_2(result, str(bad), "field 'num_nodes'")


@pytest.mark.slow
def test_unknown_gpu_profile_name_exits_2_with_a_suggestion(tmp_path):
    runs = tmp_path / "runs.jsonl"
    runs.write_text("")
    result = run_planner("calibrate", "--runs", str(runs), "--profile", "H1000",
                         "--out", str(tmp_path / "out.yaml"))
    assert_one_line_exit_2(result, "unknown GPU 'H1000'", "H100", "planner clusters")
    assert not (tmp_path / "out.yaml").exists()


@pytest.mark.slow
def test_profile_yaml_with_a_wrong_field_names_field_and_file(tmp_path):
    profile = load_gpu("A100").model_dump()
    profile["memory_gib"] = "eighty"
    path = tmp_path / "my-a100.yaml"
    path.write_text(yaml.safe_dump(profile))
    result = run_planner("calibrate", "--runs", str(tmp_path / "r.jsonl"), "--profile", str(path),
                         "--out", str(tmp_path / "out.yaml"))
    assert_one_line_exit_2(result, str(path), "field 'memory_gib'", "valid number")


@pytest.mark.slow
def test_profile_yaml_that_is_not_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [oops\n")
    result = run_planner("calibrate", "--runs", str(tmp_path / "r.jsonl"), "--profile", str(path),
                         "--out", str(tmp_path / "out.yaml"))
    assert_one_line_exit_2(result, str(path), "invalid YAML")
