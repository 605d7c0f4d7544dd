"""The public API (planner/__init__.py __all__, as httpx holds its own): every name listed
resolves, nothing else is exported by `import *`, `import planner` stays light (the heavy
packages load on first use), and the README's library example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import planner

README = Path(__file__).resolve().parents[1] / "README.md"

EXPECTED = {
    "ClusterSpec", "GpuProfile", "JobSpec", "ModelSpec", "PooledCluster", "Layout", "KNOBS",
    "default_layout", "builtin_gpus", "builtin_models", "load_gpu", "load_model",
    "parse_cluster", "parse_cluster_or_pools", "resolve_stack", "load_runs", "MeasuredRun",
    "estimate", "Estimate", "solve", "Plan", "explain", "Explanation",
    "PlannerError", "SpecError", "LayoutError", "InfeasibleError",
}


def test_all_is_the_public_api():
    """A name added to or dropped from the API is a decision: this list changes with it."""
    assert set(planner.__all__) == EXPECTED
    assert len(planner.__all__) == len(EXPECTED)  # no duplicate


def test_every_public_name_resolves_to_its_home():
    for name in planner.__all__:
        obj = getattr(planner, name)
        assert obj is not None, name
        if callable(obj) and not isinstance(obj, type):
            assert obj.__doc__, f"planner.{name} has no docstring"
    assert planner.solve.__module__ == "planner.search"
    assert planner.estimate.__module__ == "planner.costmodel"
    assert planner.explain.__module__ == "planner.explanation"


def test_star_import_gives_exactly_all():
    code = "from planner import *; print(sorted(k for k in dir() if not k.startswith('_')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert eval(out) == sorted(planner.__all__)


def test_import_planner_is_light():
    code = ("import sys, planner; print(sorted(m for m in ('pydantic', 'numpy', 'ortools', "
            "'torch', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_readme_library_example_runs():
    """The README's `from planner import ...` block, run as a user would paste it."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = [b for b in blocks if "from planner import JobSpec" in b]
    assert example, "README has no library example"
    out = subprocess.run([sys.executable, "-c", example[0]], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    # it prints the estimate's step time and the best plan's layout, explained
    assert re.search(r"tp8-pp\d+-dp\d+", out.stdout)  # the pinned tp, explained
