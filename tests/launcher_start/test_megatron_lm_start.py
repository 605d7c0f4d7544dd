"""Every Megatron-LM export starts: the script's own argument list (bash runs it, torchrun
shadowed) goes through Megatron-LM's parse_args, validate_args and TransformerConfig, and the
layers each pipeline rank builds are the plan's."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from planner.costmodel.pipeline import stage_layer_counts
from planner.launchers import export_plan
from tests.launcher_start.plans import PLANS, gpu_arch, launch_plan, script_launch
from tests.launcher_start.sources import skip_reason, source_tree

TREE = source_tree("Megatron-LM", "megatron/training/arguments.py")
pytestmark = pytest.mark.skipif(TREE is None, reason=skip_reason("Megatron-LM"))
RUNNER = Path(__file__).with_name("megatron_lm_start.py")


@cache
def megatron_checks(tmp: Path) -> dict[str, dict]:
    """Megatron-LM's verdict on every plan's export (one subprocess for all: the import is slow)."""
    cases, names = [], []
    for name in PLANS:
        plan = launch_plan(name)
        launch = script_launch(export_plan("megatron", plan).text, tmp, "pretrain_gpt.py")
        launch["env"]["WORLD_SIZE"] = str(plan.cluster.num_gpus)
        cases.append({**launch, "arch": gpu_arch(plan)})
        names.append(name)
    out = subprocess.run([sys.executable, str(RUNNER), str(TREE)], input=json.dumps(cases),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(zip(names, json.loads(out.stdout.strip().splitlines()[-1]), strict=True))


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_lm_export_starts(name, tmp_path_factory):
    verdict = megatron_checks(tmp_path_factory.getbasetemp())[name]
    assert verdict["ok"], verdict["error"]
    plan = launch_plan(name)
    lay = plan.layout
    # the layers of each model chunk, in layer order (chunk c on rank c mod pp), as the planner
    # costs them: explicit per-stage or per-virtual-stage counts, else the even rule over pp x vpp
    # chunks
    want = (list(lay.stage_layers) if lay.stage_layers else
            stage_layer_counts(plan.model.num_hidden_layers, lay.pp * lay.vpp))
    got = [n for row in verdict["chunks"] for n in row]
    assert got == want
