"""`planner stacks` and `--stack` through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys

from planner.stacks import builtin_stacks


def _planner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                          text=True, timeout=120)


def test_stacks_json_lists_every_preset_with_provenance():
    out = _planner("stacks", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["name"] for r in rows] == list(builtin_stacks())
    for row in rows:
        assert {"recipe", "factors", "fitted", "provenance", "layout_defaults"} <= set(row)
        if row["fitted"]:  # a fitted preset says on what and how well
            assert row["provenance"]["fitted_on"] and row["provenance"]["in_sample"]["n"] > 0


def test_stacks_show_a_factor_kept_on_one_gpu_class():
    """megatron-lm-2021's factor was fitted on V100 only (a borrowed GEMM curve): the table and
    the JSON show it on its class, and the transferable factor is the stock one. It is one knob
    (the layer-pass overhead: DLPerf's runs cannot separate two, stackfit.choose_knobs)."""
    rows = {r["name"]: r for r in json.loads(_planner("stacks", "--json").stdout)}
    v100 = rows["megatron-lm-2021"]["gpu_factors"]["V100-SXM2"]
    assert rows["megatron-lm-2021"]["factors"]["gemm_scale"] == 1.0
    assert v100["gemm_scale"] == 1.0 and v100["layer_overhead_us"] > 0
    import os

    out = subprocess.run([sys.executable, "-m", "planner", "stacks"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})
    assert out.returncode == 0
    assert f"V100-SXM2 {v100['layer_overhead_us']:.0f}" in out.stdout


def test_stack_text_and_name_give_the_same_estimate():
    base = ("estimate", "--model", "llama70b", "--cluster", "128xA100", "--tp", "8", "--pp", "4",
            "--json")
    by_name = json.loads(_planner(*base, "--stack", "megatron-lm-2021").stdout)
    by_text = json.loads(_planner(*base, "--stack", "Megatron-LM (commit 8aa4619, 2021)").stdout)
    assert by_name == by_text
    assert by_name["zero"] == 0 and by_name["sp"] is False  # no distributed optimizer, no SP
    default = json.loads(_planner(*base).stdout)
    assert default["zero"] == 1 and default["sp"] is True


def test_solve_honours_what_the_stack_fixes():
    out = _planner("solve", "--model", "llama3-8b", "--cluster", "8xA100", "--stack",
                   "MosaicML Composer/llm-foundry (PyTorch FSDP)", "--top", "3", "--json")
    assert out.returncode == 0, out.stderr
    plans = json.loads(out.stdout)
    assert plans and all(p["tp"] == 1 and p["pp"] == 1 for p in plans)


def test_unknown_stack_is_one_line_exit_2():
    out = _planner("estimate", "--model", "llama70b", "--cluster", "128xA100", "--tp", "8",
                   "--pp", "4", "--stack", "Horovod")
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr
    assert "unknown software stack 'Horovod'" in lines[0] and "megatron-core" in lines[0]
