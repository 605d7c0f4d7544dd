"""The planning commands stay light: importing the CLI never loads torch (STYLE.md)."""

import subprocess
import sys


def test_cli_import_leaves_torch_out():
    code = "import sys, planner.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
