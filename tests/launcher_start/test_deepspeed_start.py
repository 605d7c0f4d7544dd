"""Every DeepSpeed export starts: the script's arguments (bash runs it, torchrun shadowed) pass
Megatron-DeepSpeed's parse_args and validate_args, and the ds_config.json it writes passes
DeepSpeed's DeepSpeedConfig and its pipeline engine's ZeRO rule. Plans DeepSpeed's pipeline
engine cannot run (vpp > 1, ZeRO-2/3 with pp > 1) are refused by the export, and re-planned by
`planner export --to deepspeed`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from planner.errors import LayoutError
from planner.launchers import LaunchPlan, export_plan
from planner.launchers.deepspeed import layout_problems, with_own_split
from tests.launcher_start.plans import PLANS, launch_plan, script_launch
from tests.launcher_start.sources import installed, skip_reason, source_tree

TREE = source_tree("Megatron-DeepSpeed", "megatron/arguments.py")
RUNNER = Path(__file__).with_name("deepspeed_start.py")
RUNNABLE = [n for n in PLANS if not layout_problems(PLANS[n][3])]


def ds_plan(name: str) -> LaunchPlan:
    """The plan with its stages as DeepSpeed's PipelineModule makes them (what `export --to
    deepspeed` does to a plan whose split differs)."""
    plan = launch_plan(name)
    layout = with_own_split(plan.layout, plan.model.num_hidden_layers)
    return LaunchPlan(plan.model, plan.cluster, plan.job, layout)


def test_what_the_pipeline_engine_cannot_run_is_refused():
    refused = [n for n in PLANS if layout_problems(PLANS[n][3])]
    assert refused  # the plans hold interleaved and ZeRO-2/3-with-PP layouts
    for name in refused:
        with pytest.raises(LayoutError, match="cannot run on DeepSpeed"):
            export_plan("deepspeed", launch_plan(name))
    # a split other than DeepSpeed's own: 61 layers on 32 stages are 2 x 29, 1 x 3 there
    with pytest.raises(LayoutError, match=r"1,2x29,1,1: DeepSpeed's PipelineModule splits "
                                          r"2x29,1x3"):
        export_plan("deepspeed", launch_plan("moe-deepseek-v3-pp32"))
    assert ds_plan("moe-deepseek-v3-pp32").layout.stage_layers == (2,) * 29 + (1,) * 3


@pytest.mark.skipif(not installed("deepspeed"), reason="DeepSpeed is not installed")
def test_own_split_is_deepspeeds_partition():
    from deepspeed.runtime.utils import partition_balanced

    from planner.launchers.deepspeed import own_split

    for layers, pp in ((61, 32), (126, 16), (80, 3), (32, 4), (95, 8), (7, 7)):
        # Megatron-DeepSpeed's layer list: embedding, the transformer layers, norm and head
        # (type:transformer weighs 1 per transformer layer, 0 the rest)
        weights = [0] + [1] * layers + [0, 0]
        parts = partition_balanced(weights, pp)
        assert [sum(weights[parts[i]:parts[i + 1]]) for i in range(pp)] == \
            own_split(layers, pp), (layers, pp)


@cache
def ds_checks(tmp: Path) -> dict[str, dict]:
    cases = []
    for name in RUNNABLE:
        plan = ds_plan(name)
        config = tmp / f"{name}.json"
        os.environ["DS_CONFIG"] = str(config)
        try:
            launch = script_launch(export_plan("deepspeed", plan).text, tmp, "pretrain_gpt.py")
        finally:
            del os.environ["DS_CONFIG"]
        launch["env"]["WORLD_SIZE"] = str(plan.cluster.num_gpus)
        cases.append({**launch, "config": json.loads(config.read_text())})
    out = subprocess.run([sys.executable, str(RUNNER), str(TREE)], input=json.dumps(cases),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(zip(RUNNABLE, json.loads(out.stdout.strip().splitlines()[-1]), strict=True))


@pytest.mark.skipif(TREE is None, reason=skip_reason("Megatron-DeepSpeed"))
@pytest.mark.skipif(not installed("deepspeed"), reason="DeepSpeed is not installed (CPU-only: "
                    "DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed)")
@pytest.mark.parametrize("name", RUNNABLE)
def test_deepspeed_export_starts(name, tmp_path_factory):
    verdict = ds_checks(tmp_path_factory.getbasetemp())[name]
    assert verdict["ok"], verdict["error"]


def test_export_to_deepspeed_replans_under_its_rules(tmp_path):
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.launchers import read_config

    runner = CliRunner()
    base = ["export", "--to", "deepspeed", "--model", "llama3-70b", "--cluster", "8x8xH100"]
    for extra in ([], ["--zero", "2"]):
        out = tmp_path / "ds.sh"
        result = runner.invoke(app, [*base, *extra, "--out", str(out)])
        assert result.exit_code == 0, result.output
        got = read_config(out).pins
        assert got["vpp"] == 1 and not (got["pp"] > 1 and got["zero"] > 1), got
    pinned = [*base, "--tp", "8", "--pp", "4", "--dp", "2", "--cp", "1", "--ep", "1", "--vpp",
              "2", "--mbs", "1", "--zero", "1", "--recompute", "full", "--sp"]
    result = subprocess.run([sys.executable, "-m", "planner", *pinned], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no interleaved schedule" in result.stderr


def test_ds_config_without_train_batch_size_uses_deepspeeds_arithmetic(tmp_path):
    from planner.launchers import read_config, resolve

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                                "gradient_accumulation_steps": 4,
                                "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}))
    got = resolve(read_config(path), "llama3-8b", "16xH100", pin_overrides={"tp": 1, "pp": 1})
    # DeepSpeedConfig: train_batch_size = micro 2 x accumulation 4 x data-parallel 16
    assert got.job.global_batch == 2 * 4 * 16
