"""Where the launchers' own code is found for the start-up checks (tests/launcher_start).

Megatron-LM's `megatron/training` is in no PyPI wheel (megatron-core ships `megatron/core` only)
and Megatron-DeepSpeed is not on PyPI: their checks run against a checkout named by
PLANNER_LAUNCHER_SRC, a folder holding `Megatron-LM/` (and `torchtitan/`, `Megatron-Bridge/`,
`Megatron-DeepSpeed/`) source trees at the commits in COMMITS. Without it a check is skipped with
the reason. torchtitan and DeepSpeed are taken from the installed package when there is one.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# the commits the exports are checked against (and the option lists of known_keys/ come from)
COMMITS = {
    "Megatron-LM": "d98e8a64ddf34856e74b24714e3bedb2f5a39553",  # 2026-08-22
    "torchtitan": "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a",  # 2026-08-21
}


def source_tree(name: str, marker: str) -> Path | None:
    """PLANNER_LAUNCHER_SRC/<name> when it holds `marker` (a file of the launcher), else None."""
    root = os.environ.get("PLANNER_LAUNCHER_SRC")
    if not root:
        return None
    tree = Path(root) / name
    return tree if (tree / marker).is_file() else None


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def skip_reason(name: str) -> str:
    return (f"{name}'s own code is not here: set PLANNER_LAUNCHER_SRC to a folder holding a "
            f"{name}/ checkout (commit {COMMITS.get(name, 'any')})")
