"""The benchmark scripts (benchmarks/*.py) loaded as modules for their tests: one loader, each
script loaded once per session (as `<name>_bench`; they import each other by plain name, so
benchmarks/ is on sys.path while one loads)."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@cache
def load_bench(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `<name>_bench`."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"{name}_bench"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def nanotron_sweep() -> Path:
    """The nanotron layout sweep's table (benchmarks/ranking.py SWEEPS_DIR)."""
    return load_bench("ranking").SWEEPS_DIR / "nanotron_sweep_dev.csv"
