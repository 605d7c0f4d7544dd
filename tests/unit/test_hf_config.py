"""HuggingFace config.json import: real configs (tests/data/hf) against the built-in specs of the
same models, a hand count for GPT-2, and one-line errors for bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planner.errors import SpecError
from planner.hf_config import READERS, architecture
from planner.registry import builtin_models, load_model, model_spec_from_hf

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
TWINS = sorted(p.stem for p in HF.glob("*.json") if p.stem in builtin_models())


def read(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def test_hf_import_has_one_direction():
    """The registry calls the HF reader; the reader never imports the registry."""
    import ast

    source = (Path(__file__).resolve().parents[2] / "planner" / "hf_config.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ImportFrom)}
    assert "planner.specs" in imported and "planner.registry" not in imported


def test_fixtures_cover_every_model_type():
    types = {read(p.stem)["model_type"] for p in HF.glob("*.json")}
    assert {"llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt_neox", "deepseek_v3", "qwen3",
            "qwen3_moe", "gpt_oss", "kimi_k2", "glm4_moe"} <= types
    assert types <= set(READERS)


@pytest.mark.parametrize("name", TWINS)
def test_import_matches_the_builtin_spec(name):
    spec = load_model(str(HF / f"{name}.json"))
    builtin = builtin_models()[name]
    assert architecture(spec) == architecture(builtin)
    assert spec.num_params == builtin.num_params
    assert spec.num_active_params == builtin.num_active_params
    assert spec.train_flops_per_token(4096) == builtin.train_flops_per_token(4096)
    # same shapes: the built-in's trained job becomes the default
    assert (spec.seq_len, spec.global_batch) == (builtin.seq_len, builtin.global_batch)
    assert spec.name == name  # a file other than config.json is named by its stem


def test_gpt2_small_by_hand():
    """openai-community/gpt2: 124,439,808 parameters (the count HF and nanoGPT report: 124M),
    here summed module by module: wte, wpe, 12 blocks, ln_f."""
    h, layers, vocab, pos = 768, 12, 50257, 1024
    block = (
        2 * h  # ln_1
        + h * 3 * h + 3 * h  # c_attn (q, k, v with biases)
        + h * h + h  # attn c_proj
        + 2 * h  # ln_2
        + h * 4 * h + 4 * h  # mlp c_fc
        + 4 * h * h + h  # mlp c_proj
    )
    by_hand = vocab * h + pos * h + layers * block + 2 * h
    assert by_hand == 124_439_808
    spec = load_model(str(HF / "gpt2.json"))
    assert spec.num_params == by_hand
    assert spec.tie_word_embeddings and spec.position_embedding == "learned"
    assert spec.seq_len == 1024  # capped by n_positions


def test_deepseek_v2_lite_style_full_rank_query():
    """q_lora_rank null (DeepSeek-V2-Lite) means a full-rank q_proj: h x heads*(nope+rope)."""
    cfg = read("deepseek-v3") | {"q_lora_rank": None, "model_type": "deepseek_v2"}
    spec = model_spec_from_hf(cfg, name="v2-lite-like", where="cfg.json")
    h, a = 7168, 128
    q = h * a * (128 + 64)
    kv = h * (512 + 64) + 512 + 512 * a * (128 + 128)
    assert spec.attention_params == q + kv + a * 128 * h


def test_config_json_in_a_repo_folder_is_named_after_the_folder(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    shutil.copy(HF / "llama3-8b.json", folder / "config.json")
    spec = load_model(str(folder / "config.json"))
    assert spec.name == "Meta-Llama-3-8B"
    assert spec.num_params == 8_030_261_248


def test_unknown_architecture_keeps_generic_defaults():
    cfg = read("llama2-7b") | {"num_hidden_layers": 3, "max_position_embeddings": 131072}
    spec = model_spec_from_hf(cfg, name="tiny", where="cfg.json")
    assert (spec.seq_len, spec.global_batch) == (4096, 512)
    assert spec.description == ""


def test_glm45_by_hand():
    """GLM-4.5 (zai-org/GLM-4.5; technical report arXiv:2508.06471 Table 1: 92 layers, 3 dense,
    160 + 1 experts of 1536, top 8, 96 heads of 128, 8 KV heads, QK-norm): q/k/v biases, no
    o_proj bias, the MTP layer not counted. The report's 355B counts differently by about
    0.6% (352.80B here; 356.7B with the MTP layer): within 1%."""
    spec = load_model(str(HF / "glm-4.5.json"))
    h, a, kv, d, vocab = 5120, 96, 8, 128, 151552
    attn = h * a * d + a * d + 2 * (h * kv * d + kv * d) + a * d * h + 2 * d
    dense = attn + 3 * h * 12288 + 2 * h
    expert = 3 * h * 1536
    moe = attn + 161 * expert + 160 * h + 2 * h
    assert spec.num_params == 3 * dense + 89 * moe + 2 * vocab * h + h
    assert spec.num_params / 1e9 == pytest.approx(355, rel=0.01)
    assert (spec.num_active_params - spec.embedding_params) / 1e9 == pytest.approx(32, rel=0.03)


def test_qwen3_sliding_window_only_when_enabled():
    """configuration_qwen3.py: sliding_window is used only with use_sliding_window, on the
    layers from max_window_layers on."""
    cfg = read("qwen3-8b")
    assert load_model(str(HF / "qwen3-8b.json")).sliding_window is None
    cfg |= {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28}
    spec = model_spec_from_hf(cfg, name="q", where="cfg.json")
    assert spec.sliding_window == 4096 and spec.num_sliding_layers == 36 - 28
    assert not spec.is_sliding_layer(27) and spec.is_sliding_layer(28)


def test_gpt_oss_default_layer_types_alternate():
    """GptOssConfig.__post_init__: sliding on even 0-based layers when layer_types is absent."""
    cfg = read("gpt-oss-20b")
    del cfg["layer_types"]
    spec = model_spec_from_hf(cfg, name="g", where="cfg.json")
    assert spec.layer_types == load_model(str(HF / "gpt-oss-20b.json")).layer_types
    assert spec.is_sliding_layer(0) and not spec.is_sliding_layer(1)


def test_qwen3_moe_unsupported_layouts_are_one_line(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps(read("qwen3-30b-a3b") | {"mlp_only_layers": [0, 5]}))
    assert "mlp_only_layers" in one_line_error(path)
    path.write_text(json.dumps(read("qwen3-30b-a3b") | {"decoder_sparse_step": 2}))
    assert "decoder_sparse_step" in one_line_error(path)


# ---- bad input: one line naming the file and the field --------------------------------------
def one_line_error(path: Path) -> str:
    with pytest.raises(SpecError) as err:
        load_model(str(path))
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


def test_unknown_model_type(tmp_path):
    path = tmp_path / "t5.json"
    path.write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    message = one_line_error(path)
    assert "'model_type'" in message and "'t5'" in message and "llama" in message


def test_missing_field_names_it(tmp_path):
    cfg = read("mixtral-8x7b")
    del cfg["num_local_experts"]
    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(cfg))
    message = one_line_error(path)
    assert "num_local_experts" in message and "mixtral" in message


def test_missing_field_of_gpt2(tmp_path):
    cfg = read("gpt2")
    del cfg["n_embd"]
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps(cfg))
    assert "'n_embd'" in one_line_error(path)


def test_wrong_value_names_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(read("llama2-7b") | {"hidden_size": "wide"}))
    assert "hidden_size" in one_line_error(path)


def test_unsupported_mlp_bias(tmp_path):
    path = tmp_path / "bias.json"
    path.write_text(json.dumps(read("llama3.1-405b") | {"mlp_bias": True}))
    assert "mlp_bias" in one_line_error(path)


def test_invalid_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"model_type": "llama", ')
    assert "invalid JSON" in one_line_error(path)


def test_not_a_mapping():
    with pytest.raises(SpecError, match="JSON object"):
        model_spec_from_hf([1, 2], name="x", where="list.json")  # type: ignore[arg-type]


def test_missing_model_type():
    with pytest.raises(SpecError, match="'model_type': missing"):
        model_spec_from_hf({"hidden_size": 8}, name="x", where="cfg.json")
