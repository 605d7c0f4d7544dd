"""The wheel carries the built-in data: build it from the checkout's sources (tracked and
untracked, not ignored), install it into a new virtualenv, and run `planner models --json` and
`planner clusters --json` from outside the repo.

The new venv gets the wheel without dependencies; the dependencies (pydantic, typer, numpy...) come
from the test interpreter's site-packages through a .pth path entry. A plain path entry does not
run that directory's own .pth files, so the repository's editable install stays invisible and
`planner` can only be imported from the wheel (asserted below)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd,
                            timeout=300)
    assert result.returncode == 0, f"{cmd}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the sources (git's view: tracked and untracked files that
    are not ignored, so no build/ or .venv/); install it; return the venv's bin/."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout to list the source files")
    root = tmp_path_factory.mktemp("pkg")
    src = root / "src"
    tracked = _run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                   cwd=REPO).stdout.split("\0")
    for rel in filter(None, tracked):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    dist = root / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", dist, src)
    wheel = next(dist.glob("llm_3d_planner-*.whl"))
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    vpy = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", vpy, "install", "--no-deps", "-q", wheel)
    purelib = Path(_run(vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                   .stdout.strip())
    (purelib / "deps-from-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


@pytest.mark.slow
def test_installed_wheel_serves_builtin_models_and_gpus(installed, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = _run(installed / "python", "-c", "import planner; print(planner.__file__)",
                 cwd=outside).stdout.strip()
    assert str(installed.parent) in where, f"planner imported from {where}, not the wheel"

    models = json.loads(_run(installed / "planner", "models", "--json", cwd=outside).stdout)
    expected_models = {p.stem for p in (REPO / "model_specs").glob("*.yaml")}
    assert {m["name"] for m in models} == expected_models
    assert any("llama70b" in m["aliases"] for m in models)

    clusters = json.loads(_run(installed / "planner", "clusters", "--json", cwd=outside).stdout)
    expected_gpus = {p.stem for p in (REPO / "hardware_profiles").glob("*.yaml")}
    assert {g["name"] for g in clusters["profiles"]} == expected_gpus
    h100 = next(g for g in clusters["profiles"] if g["name"] == "H100-SXM")
    assert h100["peak_bf16_tflops"] == 989  # dense BF16, docs/hardware.md section 1

    stacks = json.loads(_run(installed / "planner", "stacks", "--json", cwd=outside).stdout)
    expected_stacks = {p.stem for p in (REPO / "software_stacks").glob("*.yaml")}
    assert {s["name"] for s in stacks} == expected_stacks

    # the validate subpackage ships under the planner name, never as a top-level `validate`
    _run(installed / "python", "-c", "import planner.validate", cwd=outside)

    # solve reads package data beyond the specs (the measured step-time bands): a plan comes back
    plans = json.loads(_run(installed / "planner", "solve", "--model", "llama70b", "--cluster",
                            "128xA100", "--top", "1", "--json", cwd=outside).stdout)
    assert plans[0]["tied_with_best"] and plans[0]["step_time_low_s"] < plans[0]["step_time_s"]


@pytest.mark.slow
def test_wheel_contents(installed):
    wheel = next(installed.parent.parent.glob("dist/llm_3d_planner-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert len(list((REPO / "hardware_profiles").glob("*.yaml"))) >= 11
    assert len(list((REPO / "model_specs").glob("*.yaml"))) >= 20
    for gpu in (REPO / "hardware_profiles").glob("*.yaml"):
        assert f"planner/hardware_profiles/{gpu.name}" in names
    for model in (REPO / "model_specs").glob("*.yaml"):
        assert f"planner/model_specs/{model.name}" in names
    for stack in (REPO / "software_stacks").glob("*.yaml"):
        assert f"planner/software_stacks/{stack.name}" in names
    assert not any(n.startswith(("validate/", "tests/", "hardware_profiles/", "software_stacks/"))
                   for n in names)
    for keys in (REPO / "planner" / "launchers" / "known_keys").glob("*.txt"):  # export checks
        assert f"planner/launchers/known_keys/{keys.name}" in names
    for data in (REPO / "planner" / "data").glob("*"):  # runs, bands, sweeps: every data file
        if data.is_file() and data.suffix in (".csv", ".md", ".yaml"):
            assert f"planner/data/{data.name}" in names


def test_source_tree_without_the_mapping_runs(tmp_path):
    """The checkout on PYTHONPATH (no install's package-dir mapping): the top-level data folders
    serve as planner.software_stacks etc. (planner/__init__.py), so a bad cluster is one line and
    exit 2, not a ModuleNotFoundError traceback."""
    # the editable install's finder (which maps the folders) is taken off the import system
    code = ("import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in "
            "repr(f).lower()]; sys.argv = ['planner', 'solve', '--model', 'llama70b', '--cluster', "
            "'128xA1000']; runpy.run_module('planner', run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().startswith("error: cluster '128xA1000': unknown GPU 'A1000'")
    assert len(out.stderr.strip().splitlines()) == 1
