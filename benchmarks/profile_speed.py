"""How long `planner profile` takes here, against its targets (issue 15: the default run within
120 s and --quick within 30 s on a 2-core CPU host), with the load average before and after
(other work on the machine slows it).

    python benchmarks/profile_speed.py                # default and --quick, --nproc 2
    python benchmarks/profile_speed.py --only quick

Prints one line per run: wall seconds, the target, the load, what the budget skipped or cut.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = {"default": 120.0, "quick": 30.0}


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def time_profile(mode: str, nproc: int) -> tuple[float, str]:
    """Wall seconds of `planner profile` in `mode` and what its profile says was left out."""
    from planner.registry import load_gpu

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cpu.yaml"
        cmd = [sys.executable, "-m", "planner", "profile", "--out", str(out), "--nproc",
               str(nproc)] + (["--quick"] if mode == "quick" else [])
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(f"error: planner profile failed: {res.stderr.strip()[-500:]}")
        prov = load_gpu(str(out)).provenance
    left_out = [f"{k} {v}" for k, v in prov.get("gemm_dtypes_skipped", {}).items()]
    left_out += prov.get("sweeps_stopped", [])
    return wall, "; ".join(left_out) or "nothing left out"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(TARGET_S))
    parser.add_argument("--nproc", type=int, default=2)
    ns = parser.parse_args(argv)
    print(f"{os.cpu_count()} cores", flush=True)
    for mode in [ns.only] if ns.only else ["default", "quick"]:
        before = _load()
        wall, left_out = time_profile(mode, ns.nproc)
        verdict = "ok" if wall <= TARGET_S[mode] else "OVER"
        print(f"{mode:8} {wall:6.1f} s (target {TARGET_S[mode]:.0f} s, {verdict}); load "
              f"{before} -> {_load()}; {left_out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
