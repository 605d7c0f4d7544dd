"""`planner models` through typer's CliRunner: the JSON contract and the table."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from planner.cli import app

CONTRACT_KEYS = {"name", "aliases", "params_b", "active_params_b", "layers", "hidden", "heads",
                 "kv_heads", "ffn_hidden", "vocab"}


def models_json() -> list[dict]:
    result = CliRunner().invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_has_the_contract_keys_for_every_model():
    rows = models_json()
    assert len(rows) == 35  # 28 + Qwen3 8B/32B/30B-A3B/235B-A22B, gpt-oss-20b/120b, Kimi K2
    for row in rows:
        assert CONTRACT_KEYS <= row.keys(), row["name"]
        assert row["active_params_b"] <= row["params_b"]


def test_json_values_for_llama70b():
    row = next(r for r in models_json() if r["name"] == "llama2-70b")
    # hand count: 80 x (2h^2 + 2h*1024 + 3h*28672 + 2h) + h + 2*32000*h, h = 8192
    h = 8192
    params = 80 * (2 * h * h + 2 * h * 1024 + 3 * h * 28672 + 2 * h) + h + 2 * 32000 * h
    assert row["params_b"] == params / 1e9
    assert row["active_params_b"] == row["params_b"]
    assert "llama70b" in row["aliases"]
    assert (row["layers"], row["hidden"], row["heads"], row["kv_heads"]) == (80, 8192, 64, 8)
    assert (row["ffn_hidden"], row["vocab"]) == (28672, 32000)


def test_json_values_for_mixtral():
    row = next(r for r in models_json() if r["name"] == "mixtral-8x7b")
    h = 4096
    attn, expert = 2 * h * h + 2 * h * 1024, 3 * h * 14336
    shared = attn + 8 * h + 2 * h  # attention, router, two norms per layer
    assert row["params_b"] == (32 * (shared + 8 * expert) + h + 2 * 32000 * h) / 1e9
    assert row["active_params_b"] == (32 * (shared + 2 * expert) + h + 2 * 32000 * h) / 1e9
    assert (row["num_experts"], row["experts_per_token"], row["expert_ffn_hidden"]) == (8, 2, 14336)


def test_table_lists_names_aliases_and_sizes():
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("llama2-70b", "llama70b", "68.98", "deepseek-v3", "671.03", "37.55",
                 "gpt3-175b", "174.60"):
        assert text in out, text


def test_models_imports_no_heavy_modules():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from planner.cli import app\n"
        "assert CliRunner().invoke(app, ['models', '--json']).exit_code == 0\n"
        "assert CliRunner().invoke(app, ['models']).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'pandas', 'ortools') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
