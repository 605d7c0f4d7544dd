"""`planner clusters [--json]`: the profile list with its numbers, and the cluster grammar.
Expected numbers are the published figures of docs/hardware.md section 1 (typed, not read back)."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from planner.cli import app

KEYS = {"name", "aliases", "peak_bf16_tflops", "peak_fp8_tflops", "memory_gib",
        "usable_memory_gib", "hbm_tb_per_s", "gpus_per_node", "domain_gpus", "intra_node_fabric",
        "nic_gbit_per_s"}


def clusters_json() -> dict:
    result = CliRunner().invoke(app, ["clusters", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_lists_every_profile_with_its_keys():
    data = clusters_json()
    names = {row["name"] for row in data["profiles"]}
    assert {"A100-SXM4-80GB", "A100-SXM4-40GB", "H100-SXM", "H100-PCIE", "H200-SXM", "B200-SXM",
            "GB200-NVL72", "GB300-NVL72", "MI300X", "L40S", "V100-SXM2-16GB",
            "V100-SXM2-32GB"} <= names
    for row in data["profiles"]:
        assert KEYS <= row.keys(), row["name"]
        assert 0 < row["usable_memory_gib"] < row["memory_gib"]


def test_json_numbers_for_h100_and_gb200():
    rows = {row["name"]: row for row in clusters_json()["profiles"]}
    h100 = rows["H100-SXM"]
    assert (h100["peak_bf16_tflops"], h100["peak_fp8_tflops"]) == (989, 1979)  # dense [S1]
    assert (h100["memory_gib"], h100["hbm_tb_per_s"]) == (80, 3.35)
    assert (h100["gpus_per_node"], h100["domain_gpus"], h100["nic_gbit_per_s"]) == (8, 8, 400)
    assert "H100" in h100["aliases"]
    gb200 = rows["GB200-NVL72"]
    assert (gb200["gpus_per_node"], gb200["domain_gpus"], gb200["nic_gbit_per_s"]) == (4, 72, 800)
    assert rows["A100-SXM4-80GB"]["intra_node_busbw_gb_per_s"] == 231.6  # Azure 8 GB busbw [S10]
    assert rows["L40S"]["intra_node_fabric"] == "pcie"


def test_json_carries_the_grammar():
    grammar = clusters_json()["grammar"]
    for form in ("NxGPU", "NODESxPERNODExGPU", "64xH100-PCIE", "cluster.yaml", "--profile"):
        assert form in grammar


def test_table_shows_profiles_numbers_and_grammar():
    result = CliRunner().invoke(app, ["clusters"])
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("A100-SXM4-80GB", "H100-SXM", "GB200-NVL72", "989", "1979", "75.9", "72",
                 "nvswitch", "pcie", "xgmi", "NODESxPERNODExGPU", "16x8xH100"):
        assert text in out, text


def test_clusters_loads_no_heavy_modules():
    code = ("import sys\nfrom planner.cli import main\n"
            "sys.argv = ['planner', 'clusters', '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'ortools', 'pandas') if m in sys.modules), "
            "file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "[]"
    assert json.loads(out.stdout)["profiles"]
