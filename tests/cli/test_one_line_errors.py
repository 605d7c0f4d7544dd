"""Every bad input is one `error: ...` line on stderr and exit 2 (issue 15, section 4): the root
causes found by fuzzing, one test each, through the real entry point (planner.cli.run)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from inproc import assert_one_line_exit_2, invoke

from planner import limits
from planner.registry import load_gpu, load_model

MODEL_CLUSTER = ("--model", "llama70b", "--cluster", "64xA100")


# ---- usage errors: typer/click panels become one line --------------------------------

@pytest.mark.parametrize(("args", "fragments"), [
    (("solve", *MODEL_CLUSTER, "--zero", "7"), ["'--zero'", "3"]),
    (("solve", *MODEL_CLUSTER, "--tp"), ["'--tp' requires an argument"]),
    (("solve", *MODEL_CLUSTER, "--global-batch", "0"), ["'--global-batch'"]),
    (("calibrate", "--profile", "A100"), ["Missing option '--runs'"]),
    (("solve", *MODEL_CLUSTER, "--recompute", "maybe"), ["'--recompute'", "'maybe'"]),
    (("solve", *MODEL_CLUSTER, "--bogus"), ["No such option: --bogus"]),
    (("nosuchcommand",), ["No such command 'nosuchcommand'"]),
    (("estimate", *MODEL_CLUSTER, "--tp", "eight", "--pp", "1"), ["'--tp'", "valid integer"]),
])
def test_usage_errors_are_one_line(args, fragments):
    assert_one_line_exit_2(invoke(*args), *fragments)


def test_bare_planner_and_help_print_the_help_and_exit_0():
    for args in ((), ("--help",), ("solve", "--help")):
        result = invoke(*args)
        assert result.code == 0 and "Usage: planner" in result.stdout and not result.stderr


# ---- output paths -----------------------------------------------------------------------

def test_output_paths_that_cannot_be_files(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("keep me\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    assert_one_line_exit_2(invoke("solve", *MODEL_CLUSTER, "--csv", ""), "--csv", "empty")
    assert_one_line_exit_2(invoke("solve", *MODEL_CLUSTER, "--csv", folder), "is a directory")
    assert_one_line_exit_2(
        invoke("estimate", *MODEL_CLUSTER, "--tp", "8", "--pp", "1", "--csv", plain / "x.csv"),
        f"{plain} is a file, not a folder")
    assert_one_line_exit_2(invoke("calibrate", "--runs", tmp_path / "r.jsonl", "--profile",
                                  "A100", "--out", plain / "x.yaml"), "is a file, not a folder")
    assert_one_line_exit_2(invoke("validate", "--model", "llama2-7b", "--out", folder,
                                  "--print-only"), "--out", "is a directory")
    assert_one_line_exit_2(invoke("validate", "--model", "llama2-7b", "--out",
                                  plain / "runs.jsonl", "--print-only"), "is a file, not a folder")
    assert plain.read_text() == "keep me\n"


def test_write_text_atomic_refuses_a_path_under_a_plain_file(tmp_path):
    from planner.errors import SpecError
    from planner.io import append_jsonl, write_text_atomic

    (tmp_path / "f").write_text("")
    with pytest.raises(SpecError, match="is a file, not a folder"):
        write_text_atomic(tmp_path / "f" / "x.yaml", "a: 1\n")
    with pytest.raises(SpecError, match="is a directory"):
        append_jsonl(tmp_path, {"a": 1})


# ---- input names and files ------------------------------------------------------------

def test_a_300_character_model_name_is_an_unknown_model():
    assert_one_line_exit_2(invoke("solve", "--model", "m" * 300, "--cluster", "8xA100"),
                           "unknown model")


def test_latin1_bytes_in_model_cluster_and_profile_files(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\nhidden_size: 4096\n")
    assert_one_line_exit_2(invoke("solve", "--model", bad, "--cluster", "8xA100"),
                           str(bad), "not UTF-8", "0xe9")
    assert_one_line_exit_2(invoke("solve", "--model", "llama70b", "--cluster", bad),
                           str(bad), "not UTF-8")
    assert_one_line_exit_2(invoke("solve", "--model", "llama70b", "--cluster", "8xA100",
                                  "--profile", bad), str(bad), "not UTF-8")


def test_binary_jsonl_and_a_line_that_is_not_an_object(tmp_path):
    binary = tmp_path / "runs.jsonl"
    binary.write_bytes(bytes(range(256)))
    out = tmp_path / "fitted.yaml"
    assert_one_line_exit_2(invoke("calibrate", "--runs", binary, "--profile", "A100",
                                  "--out", out), "not UTF-8")
    number = tmp_path / "number.jsonl"
    number.write_text("42\n")
    assert_one_line_exit_2(invoke("calibrate", "--runs", number, "--profile", "A100",
                                  "--out", out), "no usable run", "JSON object, got int")
    assert not out.exists()


# ---- huge numbers: bounded (the bound is in the message) before any array is built -----

@pytest.mark.parametrize(("option", "value", "bound"), [
    ("--mbs", str(2**63), limits.MAX_GLOBAL_BATCH),
    ("--top", str(10**30), limits.MAX_TOP),
    ("--seq-len", str(2**31), limits.MAX_SEQ_LEN),
    ("--global-batch", str(10**30), limits.MAX_GLOBAL_BATCH),
    ("--global-batch", str(2**31), limits.MAX_GLOBAL_BATCH),
    ("--tp", str(2**64), limits.MAX_GPUS),
])
def test_huge_options_are_refused_with_the_bound(option, value, bound):
    assert_one_line_exit_2(invoke("solve", "--model", "llama70b", "--cluster", "8xA100",
                                  option, value), option, str(bound))


def test_huge_sizes_in_files_are_refused_with_the_bound(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"gpu": "H100", "num_nodes": 10**30, "gpus_per_node": 8}))
    assert_one_line_exit_2(invoke("solve", "--model", "llama70b", "--cluster", cluster),
                           "num_nodes", str(limits.MAX_GPUS))
    model = load_model("llama2-7b").model_dump()
    model["hidden_size"] = 1e30
    model_path = tmp_path / "huge.yaml"
    model_path.write_text(yaml.safe_dump(model))
    assert_one_line_exit_2(invoke("solve", "--model", model_path, "--cluster", "8xA100"),
                           "hidden_size", str(limits.MAX_HIDDEN))
    profile = load_gpu("A100").model_dump()
    profile["memory_gib"] = float("inf")
    profile_path = tmp_path / "inf.yaml"
    profile_path.write_text(yaml.safe_dump(profile))
    assert_one_line_exit_2(invoke("solve", "--model", "llama70b", "--cluster", "8xA100",
                                  "--profile", profile_path), "memory_gib")
    huge_cluster = "9" * 5000 + "xH100"  # past Python's 4300-digit int() limit
    assert_one_line_exit_2(invoke("solve", "--model", "llama70b", "--cluster", huge_cluster),
                           str(limits.MAX_GPUS))


def test_scale_time_saturates_without_a_numpy_warning():
    from planner.search.problem import scale_time

    units = scale_time(np.array([1.0, 1e30, np.finfo(float).max]))  # filterwarnings=error
    assert units[0] == 10**6 and units[1] == units[2] == 2**62


# ---- physics in the schemas -----------------------------------------------------------

@pytest.mark.parametrize(("change", "fragments"), [
    ({"gemm_efficiency": {"points": [[1e9, 5.0]]}}, ["gemm_efficiency", "at most 1"]),
    ({"reserve_gib": 100.0}, ["reserve_gib (100) must be less than memory_gib (80)"]),
    ({"peak_bf16_tflops": float("inf")}, ["peak_bf16_tflops"]),
    ({"attention_efficiency": 1.1}, ["attention_efficiency", "1"]),
    ({"gpus_per_node": True}, ["gpus_per_node", "boolean"]),
])
def test_profiles_outside_physics_are_refused(tmp_path, change, fragments):
    profile = {**load_gpu("A100").model_dump(), **change}
    path = tmp_path / "bad-profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    assert_one_line_exit_2(invoke("estimate", "--model", "llama70b", "--cluster", "8xA100",
                                  "--profile", path, "--tp", "8", "--pp", "1"),
                           str(path), *fragments)


def test_head_size_must_be_a_positive_integer(tmp_path):
    result = invoke("validate", "--model", "llama2-7b", "--heads", "100", "--hidden", "64",
                    "--out", tmp_path / "runs.jsonl", "--print-only")
    assert_one_line_exit_2(result, "head size", "64 / 100")


def test_hf_config_boolean_is_not_a_count(tmp_path):
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
              "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert_one_line_exit_2(invoke("solve", "--model", path, "--cluster", "8xA100"),
                           "vocab_size", "boolean")


# ---- validate's launcher options --------------------------------------------------------

@pytest.mark.parametrize(("option", "value", "fragment"), [
    ("--rdzv-endpoint", "::::", "not HOST:PORT"),
    ("--rdzv-endpoint", "node0:99999", "not in 1..65535"),
    ("--backend", "", "not a torch.distributed backend"),
    ("--backend", "carrier-pigeon", "not a torch.distributed backend"),
    ("--timeout", "inf", "not a finite number of seconds"),
    ("--timeout", "nan", "--timeout"),
    ("--seed", "-1", "--seed"),
])
def test_validate_launcher_options(tmp_path, option, value, fragment):
    result = invoke("validate", "--model", "llama2-7b", "--out", tmp_path / "runs.jsonl",
                    "--print-only", option, value)
    assert_one_line_exit_2(result, fragment)


def test_a_good_rdzv_endpoint_and_backend_pass(tmp_path):
    result = invoke("validate", "--model", "llama2-7b", "--layers", "2", "--hidden", "64",
                    "--heads", "4", "--ffn", "128", "--vocab", "128", "--seq-len", "32",
                    "--global-batch", "4", "--dp", "2", "--nnodes", "2", "--nproc", "1",
                    "--rdzv-endpoint", "[fd00::1]:29500", "--backend", "GLOO",
                    "--out", tmp_path / "runs.jsonl", "--print-only")
    assert result.code == 0, result.stderr
    assert "--rdzv-endpoint=[fd00::1]:29500" in result.stdout or "[fd00::1]:29500" in result.stdout


# ---- the largest accepted sizes finish with an answer ----------------------------------------

def test_nothing_fits_at_the_gpu_bound_says_so_without_a_bigger_cluster(tmp_path):
    wide = load_model("llama2-7b").model_dump()
    wide.update(name="wide", hidden_size=limits.MAX_HIDDEN, num_attention_heads=2048,
                num_key_value_heads=2048, intermediate_size=limits.MAX_FFN)
    path = tmp_path / "wide.yaml"
    path.write_text(yaml.safe_dump(wide))
    result = invoke("solve", "--model", path, "--cluster", f"{limits.MAX_GPUS}xH100",
                    "--global-batch", str(limits.MAX_GLOBAL_BATCH), "--seq-len",
                    str(limits.MAX_SEQ_LEN))
    assert result.code == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"does not fit even on {limits.MAX_GPUS} H100-SXM" in result.stderr


def test_an_enumeration_cut_short_is_a_one_line_error():
    from planner.errors import SpecError
    from planner.registry import parse_cluster
    from planner.search import enumerate_layouts
    from planner.search.cpsat import SolverConfig
    from planner.specs import JobSpec

    deep = load_model("llama2-7b").model_copy(update={"num_hidden_layers": 4096})
    job = JobSpec(seq_len=2**20, global_batch=2**16)
    with pytest.raises(SpecError, match=r"too large to enumerate within 0.01 s .*; pin some knobs"):
        enumerate_layouts(deep, parse_cluster("16384xH100"), job,
                          config=SolverConfig(time_limit_s=0.01))
