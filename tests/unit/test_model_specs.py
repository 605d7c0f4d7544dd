"""Built-in model specs against published sizes, hand formulas and FLOP formulas from papers.

Published numbers are typed here from their sources (cited on each line), not read from the
YAML files, so a wrong spec and a wrong YAML `published_params_b` cannot agree by accident.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

import pytest
from pydantic import BaseModel, ValidationError

from planner.errors import SpecError
from planner.registry import _norm, builtin_models, load_model
from planner.specs import ModelSpec

# Total parameters, billions, as printed by the source (the string keeps the printed precision).
PUBLISHED_TOTAL_B = {
    # HF model pages, "Model size" from the safetensors weights
    "llama2-7b": "6.74",  # huggingface.co/meta-llama/Llama-2-7b-hf
    "llama2-13b": "13.0",  # huggingface.co/meta-llama/Llama-2-13b-hf
    "llama2-70b": "69.0",  # huggingface.co/meta-llama/Llama-2-70b-hf ("69B")
    "llama3-8b": "8.03",  # huggingface.co/meta-llama/Meta-Llama-3-8B
    "llama3-70b": "70.6",  # huggingface.co/meta-llama/Meta-Llama-3-70B
    "llama3.1-405b": "405.9",  # NVIDIA dgxc-benchmarking Llama 3.1 405B README; HF "406B"
    "mistral-7b": "7.24",  # huggingface.co/mistralai/Mistral-7B-v0.1
    "mixtral-8x7b": "46.7",  # mistral.ai/news/mixtral-of-experts ("46.7B total")
    "mixtral-8x22b": "141",  # mistral.ai/news/mixtral-8x22b ("141B")
    "qwen2.5-7b": "7.61",  # huggingface.co/Qwen/Qwen2.5-7B model card
    "qwen2.5-72b": "72.7",  # huggingface.co/Qwen/Qwen2.5-72B model card
    "deepseek-v3": "671",  # DeepSeek-V3 Technical Report (arXiv:2412.19437), abstract
    "gpt-neox-20b": "20.554567680",  # huggingface.co/EleutherAI/gpt-neox-20b card: 20554567680
    # Qwen3 model cards (huggingface.co/Qwen/<repo>, "Number of Parameters")
    "qwen3-8b": "8.2",  # Qwen/Qwen3-8B-Base
    "qwen3-32b": "32.8",  # Qwen/Qwen3-32B
    "qwen3-30b-a3b": "30.5",  # Qwen/Qwen3-30B-A3B-Base
    "qwen3-235b-a22b": "235",  # Qwen/Qwen3-235B-A22B
    # gpt-oss model card (OpenAI 2025, arXiv:2508.10925), Table 1: total parameters
    "gpt-oss-20b": "20.91",
    "gpt-oss-120b": "116.83",
    "kimi-k2": "1",  # in trillions below: huggingface.co/moonshotai/Kimi-K2-Base "1T total"
    # Brown et al. 2020 (arXiv:2005.14165) Table 2.1, n_params
    "gpt3-1.3b": "1.3",
    "gpt3-2.7b": "2.7",
    "gpt3-6.7b": "6.7",
    "gpt3-13b": "13.0",
    "gpt3-175b": "175.0",
    # Narayanan et al. 2021 (arXiv:2104.04473) Table 1, number of parameters (billion)
    "megatron-gpt-1.7b": "1.7",
    "megatron-gpt-3.6b": "3.6",
    "megatron-gpt-7.5b": "7.5",
    "megatron-gpt-18b": "18.4",
    "megatron-gpt-39b": "39.1",
    "megatron-gpt-76b": "76.1",
    "megatron-gpt-145b": "145.6",
    "megatron-gpt-310b": "310.1",
    "megatron-gpt-530b": "529.6",
    "megatron-gpt-1t": "1008.0",
}

PUBLISHED_ACTIVE_B = {
    "mixtral-8x7b": "12.9",  # mistral.ai/news/mixtral-of-experts ("12.9B parameters per token")
    "mixtral-8x22b": "39",  # mistral.ai/news/mixtral-8x22b ("39B active")
    "deepseek-v3": "37",  # DeepSeek-V3 report, abstract ("37B activated for each token")
    "qwen3-235b-a22b": "22",  # model card: "22B activated"
    "gpt-oss-20b": "3.61",  # model card Table 1, active parameters (embedding not counted)
    "gpt-oss-120b": "5.13",  # model card Table 1
    "kimi-k2": "32",  # model card: "32B activated parameters"
}
# Sources that count activated parameters without the input embedding (a lookup, not a matmul):
# DeepSeek-V3 (37.55B with it, which would print as 38B), gpt-oss (Table 1 lists the embedding
# apart from the active count), Kimi K2 (the DeepSeek-V3 architecture and convention).
ACTIVE_WITHOUT_EMBEDDING = {"deepseek-v3", "gpt-oss-20b", "gpt-oss-120b", "kimi-k2"}
# Non-embedding parameters printed on the Qwen3 model cards (billions).
QWEN3_NON_EMBEDDING_B = {"qwen3-8b": "6.95", "qwen3-32b": "31.2", "qwen3-30b-a3b": "29.9",
                         "qwen3-235b-a22b": "234"}

# Exact totals read from the released weights (safetensors header totals shown on the HF model
# pages / model cards), independent of our formulas.
EXACT_TOTAL = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "gpt-neox-20b": 20_554_567_680,
}


def tolerance_b(printed: str) -> float:
    """0.5% of the value, or half a unit of its last printed digit when that is looser: '1.7'
    (Megatron Table 1) stands for anything in [1.65, 1.75)."""
    value = Decimal(printed)
    half_unit = Decimal(1).scaleb(value.as_tuple().exponent) / 2
    return max(0.005 * float(value), float(half_unit))


def megatron_params(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Narayanan et al. 2021, Sec. 5.1: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) = 12lh^2 +
    13lh + (V+s)h (biases, two LayerNorms per layer, tied embedding, learned positions)."""
    return 12 * layers * hidden**2 + 13 * layers * hidden + (vocab + seq) * hidden


def llama_params(layers: int, h: int, heads: int, kv: int, ffn: int, vocab: int,
                 qkv_bias: bool = False) -> int:
    """Hand count of a Llama-style model: q/o (h x h), k/v (h x kv*d), gated MLP, two RMSNorms
    per layer, final RMSNorm, untied embedding and LM head."""
    d = h // heads
    attn = 2 * h * h + 2 * h * kv * d + ((h + 2 * kv * d) if qkv_bias else 0)
    return layers * (attn + 3 * h * ffn + 2 * h) + h + 2 * vocab * h


def test_all_required_models_are_built_in():
    assert set(PUBLISHED_TOTAL_B) == set(builtin_models())


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL_B))
def test_total_params_match_published(name):
    spec = builtin_models()[name]
    printed = PUBLISHED_TOTAL_B[name]
    published = float(printed)
    scale = 1e12 if name == "kimi-k2" else 1e9  # Kimi K2's card prints trillions
    assert spec.num_params / scale == pytest.approx(published, abs=tolerance_b(printed))
    # the YAML carries the same published figure as the source
    assert spec.published_params_b * 1e9 / scale == pytest.approx(published)


@pytest.mark.parametrize("name", sorted(EXACT_TOTAL))
def test_total_params_match_released_weights_exactly(name):
    assert builtin_models()[name].num_params == EXACT_TOTAL[name]


def test_large_models_within_half_a_percent():
    """From 10B up, 0.5% is tighter than the printed rounding: every one must be within it."""
    for name, printed in PUBLISHED_TOTAL_B.items():
        if float(printed) >= 10 and name != "kimi-k2":  # "1T": one printed digit
            err = builtin_models()[name].num_params / 1e9 / float(printed) - 1
            assert abs(err) < 0.005, (name, err)


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE_B))
def test_active_params_match_published(name):
    spec = builtin_models()[name]
    active = spec.num_active_params
    if name in ACTIVE_WITHOUT_EMBEDDING:
        active -= spec.embedding_params
    printed = PUBLISHED_ACTIVE_B[name]
    assert active / 1e9 == pytest.approx(float(printed), abs=tolerance_b(printed))
    assert spec.published_active_params_b == pytest.approx(float(printed))


def test_dense_models_have_active_equal_total():
    for spec in builtin_models().values():
        if not spec.is_moe:
            assert spec.num_active_params == spec.num_params, spec.name


@pytest.mark.parametrize("name", [n for n in PUBLISHED_TOTAL_B if n.startswith("megatron-gpt")])
def test_megatron_models_follow_the_paper_formula(name):
    spec = builtin_models()[name]
    formula = megatron_params(spec.num_hidden_layers, spec.hidden_size, 51200, 2048)
    # the paper's formula leaves out the final LayerNorm (2h)
    assert spec.num_params == formula + 2 * spec.hidden_size


@pytest.mark.parametrize("name", ["gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-175b"])
def test_gpt3_models_follow_the_megatron_formula(name):
    spec = builtin_models()[name]
    formula = megatron_params(spec.num_hidden_layers, spec.hidden_size, 50257, 2048)
    assert spec.num_params == formula + 2 * spec.hidden_size


@pytest.mark.parametrize(
    ("name", "layers", "h", "heads", "kv", "ffn", "vocab", "qkv_bias"),
    [
        ("llama2-70b", 80, 8192, 64, 8, 28672, 32000, False),
        ("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, False),
        ("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, True),
    ],
)
def test_llama_style_counts_by_hand(name, layers, h, heads, kv, ffn, vocab, qkv_bias):
    spec = builtin_models()[name]
    assert spec.num_params == llama_params(layers, h, heads, kv, ffn, vocab, qkv_bias)


def test_qwen_non_embedding_params_match_model_card():
    # huggingface.co/Qwen/Qwen2.5-7B: "Number of Parameters (Non-Embedding): 6.53B"
    spec = builtin_models()["qwen2.5-7b"]
    assert spec.non_embedding_params / 1e9 == pytest.approx(6.53, abs=0.005)


def test_deepseek_v3_counts_by_hand():
    """MLA + MoE, from the report's Sec. 4.2 shapes, counted module by module."""
    spec = builtin_models()["deepseek-v3"]
    h, a, vocab = 7168, 128, 129280
    q = h * 1536 + 1536 + 1536 * a * (128 + 64)  # q_a_proj, q_a_layernorm, q_b_proj
    kv = h * (512 + 64) + 512 + 512 * a * (128 + 128)  # kv_a_proj_with_mqa, norm, kv_b_proj
    attn = q + kv + a * 128 * h  # o_proj
    expert = 3 * h * 2048
    dense_layer = attn + 3 * h * 18432 + 2 * h
    moe_layer = attn + (256 + 1) * expert + 256 * h + 2 * h  # routed + shared + router
    total = 3 * dense_layer + 58 * moe_layer + 2 * vocab * h + h
    active = 3 * dense_layer + 58 * (moe_layer - 248 * expert) + 2 * vocab * h + h
    assert spec.num_params == total
    assert spec.num_active_params == active
    assert spec.num_moe_layers == 58


def test_mixtral_active_by_hand():
    spec = builtin_models()["mixtral-8x7b"]
    h, ffn, vocab = 4096, 14336, 32000
    attn = 2 * h * h + 2 * h * 1024
    layer_active = attn + 2 * 3 * h * ffn + 8 * h + 2 * h
    assert spec.num_active_params == 32 * layer_active + 2 * vocab * h + h


# ---- FLOPs per token -------------------------------------------------------------------------
def test_gpt3_175b_flops_match_megatron_formula():
    """Narayanan et al. 2021 eq. (3): F = 72 B s l h^2 (1 + s/(6h) + V/(12 h l)) per iteration
    (no recompute: 72 = 3 x 24), i.e. per token divide by B s. Full (non-causal) attention."""
    spec = builtin_models()["gpt3-175b"]
    s, L, h, V = 2048, 96, 12288, 50257
    per_token = 72 * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))
    assert spec.train_flops_per_token(s, causal=False) == pytest.approx(per_token, rel=1e-12)


@pytest.mark.parametrize("name", ["megatron-gpt-1t", "megatron-gpt-145b"])
def test_megatron_models_flops_match_formula(name):
    spec = builtin_models()[name]
    s, L, h, V = 2048, spec.num_hidden_layers, spec.hidden_size, 51200
    per_token = 72 * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))
    assert spec.train_flops_per_token(s) == pytest.approx(per_token, rel=1e-12)


def test_llama2_70b_flops_are_6n_plus_attention():
    """6N + 12 L h s per token (Kaplan et al. 2020 / PaLM appendix B, full attention), N = the
    weights multiplied per token: layers' projections and the LM head, counted by hand."""
    L, h, kv_dim, ffn, V, s = 80, 8192, 1024, 28672, 32000, 4096
    n = L * (2 * h * h + 2 * h * kv_dim + 3 * h * ffn) + V * h
    spec = builtin_models()["llama2-70b"]
    assert spec.matmul_params_per_token == n
    assert spec.train_flops_per_token(s) == pytest.approx(6 * n + 12 * L * h * s, rel=1e-12)
    # causal attention does half the score/context work
    assert spec.train_flops_per_token(s, causal=True) == pytest.approx(6 * n + 6 * L * h * s)


def test_mixtral_flops_count_top2_experts():
    L, h, kv_dim, ffn, V, s = 32, 4096, 1024, 14336, 32000, 4096
    n = L * (2 * h * h + 2 * h * kv_dim + 2 * 3 * h * ffn + 8 * h) + V * h
    spec = builtin_models()["mixtral-8x7b"]
    assert spec.train_flops_per_token(s) == pytest.approx(6 * n + 12 * L * h * s, rel=1e-12)


def test_deepseek_v3_attention_flops_use_mla_head_dims():
    """Scores use the 192-wide (128 nope + 64 rope) q/k heads, context the 128-wide v heads."""
    spec = builtin_models()["deepseek-v3"]
    s = 4096
    assert spec.attention_flops_per_token(s) == 2 * s * 128 * (192 + 128) * 61
    assert spec.attention_flops_per_token(s, causal=True) == s * 128 * (192 + 128) * 61


def test_flops_track_6n_within_a_few_percent_for_dense_models():
    """Sanity check against the 6 x params rule (Kaplan 2020) at short context: the matmul count
    differs from all parameters only by embeddings, norms and biases."""
    for name in ("llama2-70b", "llama3.1-405b", "gpt3-175b"):
        spec = builtin_models()[name]
        ratio = spec.train_flops_per_token(128) / (6 * spec.num_params)
        assert 0.97 < ratio < 1.02, (name, ratio)


# ---- spec hygiene ----------------------------------------------------------------------------
def test_every_model_spec_field_has_a_description():
    missing = [n for n, f in ModelSpec.model_fields.items() if not (f.description or "").strip()]
    assert missing == []


def test_every_builtin_cites_its_sources():
    for spec in builtin_models().values():
        assert spec.description and spec.source and spec.published_params_b, spec.name
        assert re.search(r"(arXiv|huggingface\.co|mistral\.ai|Table)", spec.source), spec.name
        if spec.is_moe:
            assert spec.published_active_params_b, spec.name


def test_names_and_aliases_are_unique():
    seen: dict[str, str] = {}
    for spec in builtin_models().values():
        for key in [spec.name, *spec.aliases]:
            assert _norm(key) not in seen, (key, spec.name, seen.get(_norm(key)))
            seen[_norm(key)] = spec.name


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("llama70b", "llama2-70b"),
        ("llama3-405b", "llama3.1-405b"),
        ("llama3.1-405b", "llama3.1-405b"),
        ("Llama-3.1-405B", "llama3.1-405b"),
        ("gpt3-175b", "gpt3-175b"),
        ("mixtral-8x7b", "mixtral-8x7b"),
        ("llama2-7b", "llama2-7b"),
        ("llama-7b", "llama2-7b"),
        ("llama3.1-70b", "llama3-70b"),
        ("llama3.1-8b", "llama3-8b"),
        ("megatron-gpt-529.6b", "megatron-gpt-530b"),
        ("deepseek_v3", "deepseek-v3"),
    ],
)
def test_aliases_resolve(alias, name):
    assert load_model(alias).name == name


def test_llama70b_says_it_is_llama2():
    assert "Llama 2" in builtin_models()["llama2-70b"].description


@pytest.mark.parametrize(
    ("name", "seq_len", "global_batch"),
    [
        ("llama2-70b", 4096, 1024),  # Touvron 2023 Sec. 2.2: 4k context, 4M-token batches
        ("llama3.1-405b", 8192, 2048),  # Llama 3 herd paper Table 4: 16M tokens of 8192
        ("gpt3-175b", 2048, 1536),  # Brown 2020 n_ctx 2048; Megatron-LM GPT-3 recipe 1536
        ("gpt3-6.7b", 2048, 1024),  # Brown 2020 Table 2.1: 2M tokens
        ("megatron-gpt-1t", 2048, 3072),  # Narayanan 2021 Table 1
        ("deepseek-v3", 4096, 15360),  # DeepSeek-V3 report Sec. 4.2
    ],
)
def test_default_jobs_are_the_trained_ones(name, seq_len, global_batch):
    spec = builtin_models()[name]
    assert (spec.seq_len, spec.global_batch) == (seq_len, global_batch)


def test_invalid_specs_are_rejected():
    base = dict(name="x", num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
                intermediate_size=128, vocab_size=100, activation="swiglu")
    with pytest.raises(ValidationError, match="must divide"):
        ModelSpec(**base, num_key_value_heads=3)
    with pytest.raises(ValidationError, match="num_experts_per_tok"):
        ModelSpec(**base, num_experts=4, num_experts_per_tok=0)
    with pytest.raises(ValidationError, match="max_position_embeddings"):
        ModelSpec(**base, position_embedding="learned")
    with pytest.raises(ValidationError, match="qk_nope_head_dim"):
        ModelSpec(**base, kv_lora_rank=16)
    with pytest.raises(ValidationError, match="extra"):
        ModelSpec(**base, hidden_dim=64)
    assert isinstance(ModelSpec(**base), BaseModel)


def test_bad_spec_yaml_is_one_line_spec_error(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("num_hidden_layers: 2\nhidden_size: -64\n")
    with pytest.raises(SpecError) as err:
        load_model(str(path))
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "hidden_size" in message


def test_spec_yaml_round_trip(tmp_path):
    """A spec written from a built-in loads back to the same counts (user files use the schema)."""
    import yaml

    spec = builtin_models()["mixtral-8x7b"]
    path = tmp_path / "my-mixtral.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(exclude={"name"})))
    loaded = load_model(str(path))
    assert loaded.name == "my-mixtral"
    assert loaded.num_params == spec.num_params
    assert math.isclose(loaded.train_flops_per_token(4096), spec.train_flops_per_token(4096))


@pytest.mark.parametrize("name", sorted(QWEN3_NON_EMBEDDING_B))
def test_qwen3_non_embedding_params_match_model_cards(name):
    printed = QWEN3_NON_EMBEDDING_B[name]
    spec = builtin_models()[name]
    assert spec.non_embedding_params / 1e9 == pytest.approx(float(printed),
                                                            abs=tolerance_b(printed))


def test_qwen3_30b_a3b_active_params():
    """The card prints 3.3B activated; the module count is 3.353B (3.340B without the 48
    routers), which rounds to 3.4: the card truncates (or leaves the router out). Checked to
    2%, with the count itself pinned by hand below."""
    spec = builtin_models()["qwen3-30b-a3b"]
    h, layers, vocab, d = 2048, 48, 151936, 128
    attn = h * 32 * d + 2 * h * 4 * d + 32 * d * h + 2 * d  # q, k, v, o, q_norm + k_norm
    layer = attn + 8 * 3 * h * 768 + h * 128 + 2 * h  # top-8 experts, router, two RMSNorms
    assert spec.num_active_params == layers * layer + 2 * vocab * h + h
    assert spec.num_active_params / 1e9 == pytest.approx(3.3, rel=0.02)


def test_qwen3_235b_counts_by_hand():
    """Qwen3-235B-A22B module by module: GQA 64/4 heads of 128 (q/o are 4096 x 8192), per-head
    q/k RMSNorm weights (2 x 128 per layer), 128 experts of 1536, router, untied head."""
    spec = builtin_models()["qwen3-235b-a22b"]
    h, d, vocab = 4096, 128, 151936
    attn = 2 * h * 64 * d + 2 * h * 4 * d + 2 * d
    expert = 3 * h * 1536
    layer = attn + 128 * expert + h * 128 + 2 * h
    assert spec.num_params == 94 * layer + 2 * vocab * h + h
    assert spec.num_active_params == 94 * (layer - 120 * expert) + 2 * vocab * h + h


def test_gpt_oss_120b_counts_by_hand():
    """gpt-oss-120b (modular_gpt_oss.py): q/k/v/o with biases, 64 sink logits, 128 experts
    with gate_up (h x 2f + 2f) and down (f x h + h) biases, a router with a bias; the model
    card's Table 1 splits it into MLP 114.71B, attention 0.96B, embed + unembed 1.16B."""
    spec = builtin_models()["gpt-oss-120b"]
    h, f, a, kv, d, e, vocab, layers = 2880, 2880, 64, 8, 64, 128, 201088, 36
    attn = (h * a * d + a * d) + 2 * (h * kv * d + kv * d) + (a * d * h + h) + a
    expert = (h * 2 * f + 2 * f) + (f * h + h)
    router = h * e + e
    mlp = e * expert + router
    assert spec.num_params == layers * (attn + mlp + 2 * h) + 2 * vocab * h + h
    assert layers * mlp / 1e9 == pytest.approx(114.71, abs=0.005)
    assert layers * (attn + 2 * h) / 1e9 == pytest.approx(0.96, abs=0.005)
    assert 2 * vocab * h / 1e9 == pytest.approx(1.16, abs=0.005)
    assert spec.num_sliding_layers == 18 and spec.attention_sinks


def test_kimi_k2_counts_by_hand():
    """Kimi K2: DeepSeek-V3's modules with 64 MLA heads, 384 + 1 experts, 1 dense layer."""
    spec = builtin_models()["kimi-k2"]
    h, a, vocab = 7168, 64, 163840
    q = h * 1536 + 1536 + 1536 * a * (128 + 64)
    kv = h * (512 + 64) + 512 + 512 * a * (128 + 128)
    attn = q + kv + a * 128 * h
    expert = 3 * h * 2048
    dense = attn + 3 * h * 18432 + 2 * h
    moe = attn + (384 + 1) * expert + 384 * h + 2 * h
    assert spec.num_params == dense + 60 * moe + 2 * vocab * h + h
    assert spec.num_active_params == dense + 60 * (moe - 376 * expert) + 2 * vocab * h + h
