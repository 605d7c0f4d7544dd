"""Every torchtitan Python export starts, on torchtitan main (the commit of sources.COMMITS,
from PLANNER_LAUNCHER_SRC) and on the release 0.3.0 (installed, or PLANNER_LAUNCHER_SRC/
torchtitan-0.3.0): Trainer.Config, ParallelDims and the stage split of torchtitan's own code
accept it, and the layers of each pipeline chunk are the plan's."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from planner.costmodel.pipeline import stage_layer_counts
from planner.launchers import export_plan
from tests.launcher_start.plans import PLANS, launch_plan
from tests.launcher_start.sources import installed, skip_reason, source_tree

RUNNER = Path(__file__).with_name("torchtitan_start.py")
MARK = "torchtitan/trainer.py"


def trees() -> dict[str, str | None]:
    main = source_tree("torchtitan", MARK)
    release = source_tree("torchtitan-0.3.0", MARK)
    return {"main": str(main) if main else None,
            "0.3.0": str(release) if release else ("installed" if installed("torchtitan")
                                                   else None)}


@cache
def titan_checks(version: str, tmp: Path) -> dict[str, dict]:
    cases, names = [], []
    for name in PLANS:
        plan = launch_plan(name)
        path = tmp / f"{name.replace('-', '_')}.py"
        path.write_text(export_plan("torchtitan", plan).text)
        cases.append({"file": str(path), "world_size": plan.cluster.num_gpus,
                      "layers": plan.model.num_hidden_layers})
        names.append(name)
    out = subprocess.run([sys.executable, str(RUNNER), trees()[version]],
                         input=json.dumps(cases), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(zip(names, json.loads(out.stdout.strip().splitlines()[-1]), strict=True))


@pytest.mark.parametrize("version", ["main", "0.3.0"])
@pytest.mark.parametrize("name", list(PLANS))
def test_torchtitan_export_starts(name, version, tmp_path_factory):
    if trees()[version] is None:
        pytest.skip(skip_reason("torchtitan") if version == "main" else
                    "torchtitan 0.3.0 is not installed (pip install torchtitan==0.3.0)")
    verdict = titan_checks(version, tmp_path_factory.getbasetemp())[name]
    assert verdict["ok"], verdict["error"]
    lay = launch_plan(name).layout
    plan = launch_plan(name)
    want = (list(lay.stage_layers) if lay.stage_layers and lay.vpp == 1 else
            stage_layer_counts(plan.model.num_hidden_layers, lay.pp * lay.vpp))
    assert verdict["chunks"] == want
