"""HuggingFace config.json -> the ModelSpec fields of that architecture.

    fields = hf_model_fields(json.load(open("config.json")), name="my-model", where="config.json")

Reads the fields each transformers architecture uses to size its weights (model_type llama,
mistral, mixtral, qwen2, qwen3, qwen3_moe, gpt_oss, glm4_moe, gpt2, gpt_neox, deepseek_v2,
deepseek_v3, kimi_k2). Defaults follow the
transformers config classes where a key may be absent (e.g. num_key_value_heads). The import has
one direction: planner.registry.model_spec_from_hf validates these fields into a ModelSpec and
gives a model whose architecture equals a built-in's that model's trained seq_len and batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.errors import SpecError
from planner.specs import ModelSpec

# Fields that identify an architecture (everything that sizes weights or FLOPs).
ARCHITECTURE_FIELDS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "activation", "norm", "tie_word_embeddings",
    "position_embedding", "max_position_embeddings", "attention_bias", "linear_bias",
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "num_shared_experts",
    "first_k_dense_replace", "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "qk_norm", "attention_out_bias", "attention_sinks",
    "sliding_window", "layer_types", "num_nextn_predict_layers",
)
DEFAULT_SEQ_LEN = 4096  # a common pre-training length (Llama 2, Qwen2.5, DeepSeek-V3)
DEFAULT_GLOBAL_BATCH = 512


class _Reader:
    """Reads keys of one config, raising SpecError that names the file and the field."""

    def __init__(self, config: dict[str, Any], where: str, model_type: str) -> None:
        self.config, self.where, self.model_type = config, where, model_type

    def need(self, key: str) -> Any:
        value = self.config.get(key)
        if value is None:
            raise SpecError(
                f"{self.where}: missing field '{key}' (needed for model_type '{self.model_type}')"
            )
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value


def _llama_like(r: _Reader) -> dict[str, Any]:
    """LlamaConfig / MistralConfig / MixtralConfig / Qwen2Config: gated MLP, RMSNorm, RoPE."""
    if r.get("mlp_bias", False):
        raise SpecError(f"{r.where}: field 'mlp_bias': true is not supported (no MLP biases)")
    return {
        "num_hidden_layers": r.need("num_hidden_layers"),
        "hidden_size": r.need("hidden_size"),
        "num_attention_heads": r.need("num_attention_heads"),
        "num_key_value_heads": r.get("num_key_value_heads"),
        "head_dim": r.get("head_dim"),
        "intermediate_size": r.need("intermediate_size"),
        "vocab_size": r.need("vocab_size"),
        "activation": "swiglu",  # gate_proj * act(up_proj), then down_proj
        "norm": "rmsnorm",
        "tie_word_embeddings": r.get("tie_word_embeddings", False),
        "position_embedding": "rope",
        # Qwen2 attention always has q/k/v biases (no config key for it)
        "attention_bias": True if r.model_type == "qwen2" else r.get("attention_bias", False),
        # LlamaAttention's o_proj takes bias=config.attention_bias too (modeling_llama.py)
        "attention_out_bias": r.model_type == "llama" and bool(r.get("attention_bias", False)),
    }


def _qwen3(r: _Reader) -> dict[str, Any]:
    """Qwen3Config: Llama-like with per-head q_norm / k_norm and an explicit head_dim;
    attention_bias puts biases on q, k, v and o_proj (modeling_qwen3.py Qwen3Attention).
    Sliding windows only with use_sliding_window, on layers >= max_window_layers
    (configuration_qwen3.py, transformers 02b8f42: layer_types from both)."""
    bias = r.get("attention_bias", False)
    return _llama_like(r) | {"qk_norm": True, "attention_bias": bias,
                             "attention_out_bias": bias} | _qwen_window(r)


def _qwen_window(r: _Reader) -> dict[str, Any]:
    """sliding_window / layer_types of a Qwen3(-MoE) config (none unless use_sliding_window)."""
    if not r.get("use_sliding_window", False) or r.get("sliding_window") is None:
        return {}
    layers = r.need("num_hidden_layers")
    start = r.get("max_window_layers", layers)
    types = r.get("layer_types")
    if types is None and isinstance(layers, int) and isinstance(start, int):
        types = ["sliding_attention" if i >= start else "full_attention" for i in range(layers)]
    return {"sliding_window": r.get("sliding_window"), "layer_types": types}


def _qwen3_moe(r: _Reader) -> dict[str, Any]:
    """Qwen3MoeConfig (configuration_qwen3_moe.py, transformers 008e574): num_experts routed
    experts of moe_intermediate_size, top num_experts_per_tok, no shared expert; every
    decoder_sparse_step-th layer is MoE unless listed in mlp_only_layers."""
    if r.get("mlp_only_layers"):
        raise SpecError(f"{r.where}: field 'mlp_only_layers': dense layers at listed positions "
                        "are not supported (only the first k layers may be dense)")
    step = r.get("decoder_sparse_step", 1)
    if step != 1:
        raise SpecError(f"{r.where}: field 'decoder_sparse_step': {step} is not supported "
                        "(Qwen3-MoE puts an MoE on layers where (i + 1) % step == 0)")
    return _qwen3(r) | {
        "num_experts": r.need("num_experts"),
        "num_experts_per_tok": r.need("num_experts_per_tok"),
        "moe_intermediate_size": r.need("moe_intermediate_size"),
    }


def _gpt_oss(r: _Reader) -> dict[str, Any]:
    """GptOssConfig (configuration_gpt_oss.py, transformers 02b8f42; modular_gpt_oss.py
    ede92a8): every layer MoE (num_local_experts experts of intermediate_size, top
    num_experts_per_tok, SwiGLU with biases on gate_up and down, a router with a bias), q/k/v/o
    with biases, a sink logit per head, and layer_types alternating sliding (128 tokens) and
    full attention, sliding first."""
    layers = r.need("num_hidden_layers")
    types = r.get("layer_types")
    if types is None and isinstance(layers, int) and not isinstance(layers, bool):
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    window = r.get("sliding_window", 128)
    return {
        "num_hidden_layers": layers,
        "hidden_size": r.need("hidden_size"),
        "num_attention_heads": r.need("num_attention_heads"),
        "num_key_value_heads": r.get("num_key_value_heads"),
        "head_dim": r.get("head_dim", 64),
        "intermediate_size": r.need("intermediate_size"),
        "vocab_size": r.need("vocab_size"),
        "activation": "swiglu",
        "norm": "rmsnorm",
        "tie_word_embeddings": r.get("tie_word_embeddings", False),
        "position_embedding": "rope",
        "linear_bias": r.get("attention_bias", True),  # attention, expert and router biases
        "num_experts": r.need("num_local_experts"),
        "num_experts_per_tok": r.need("num_experts_per_tok"),
        "attention_sinks": True,
        "sliding_window": window if types and "sliding_attention" in types else None,
        "layer_types": types,
    }


def _glm4_moe(r: _Reader) -> dict[str, Any]:
    """Glm4MoeConfig (configuration_glm4_moe.py, transformers c7ec229): GQA with q/k/v biases
    (attention_bias; o_proj has none) and optional qk norms, the first first_k_dense_replace
    layers dense, then n_routed_experts (top num_experts_per_tok) + n_shared_experts of
    moe_intermediate_size. The multi-token-prediction layers (num_nextn_predict_layers) are
    not counted, as DeepSeek-V3's are not."""
    return _llama_like(r) | {
        "qk_norm": r.get("use_qk_norm", False),
        "num_experts": r.need("n_routed_experts"),
        "num_experts_per_tok": r.need("num_experts_per_tok"),
        "moe_intermediate_size": r.need("moe_intermediate_size"),
        "num_shared_experts": r.get("n_shared_experts", 1),
        "first_k_dense_replace": r.get("first_k_dense_replace", 1),
        "num_nextn_predict_layers": r.get("num_nextn_predict_layers", 0),
    }


def _mixtral(r: _Reader) -> dict[str, Any]:
    return _llama_like(r) | {
        "num_experts": r.need("num_local_experts"),
        "num_experts_per_tok": r.need("num_experts_per_tok"),
    }


def _deepseek(r: _Reader) -> dict[str, Any]:
    """DeepseekV2Config / DeepseekV3Config (configuration_deepseek_v3.py) and Kimi K2's
    config (model_type kimi_k2, architectures DeepseekV3ForCausalLM, the same fields): MLA
    attention, shared + routed experts, the first first_k_dense_replace layers dense."""
    return {
        "num_hidden_layers": r.need("num_hidden_layers"),
        "hidden_size": r.need("hidden_size"),
        "num_attention_heads": r.need("num_attention_heads"),
        "intermediate_size": r.need("intermediate_size"),
        "vocab_size": r.need("vocab_size"),
        "activation": "swiglu",
        "norm": "rmsnorm",
        "tie_word_embeddings": r.get("tie_word_embeddings", False),
        "position_embedding": "rope",
        "num_experts": r.need("n_routed_experts"),
        "num_experts_per_tok": r.need("num_experts_per_tok"),
        "moe_intermediate_size": r.need("moe_intermediate_size"),
        "num_shared_experts": r.get("n_shared_experts", 0),
        "first_k_dense_replace": r.get("first_k_dense_replace", 0),
        "moe_layer_freq": r.get("moe_layer_freq", 1),
        "q_lora_rank": r.get("q_lora_rank"),  # null in V2-Lite: a full-rank q_proj
        "kv_lora_rank": r.need("kv_lora_rank"),
        "qk_nope_head_dim": r.need("qk_nope_head_dim"),
        "qk_rope_head_dim": r.need("qk_rope_head_dim"),
        "v_head_dim": r.need("v_head_dim"),
        "num_nextn_predict_layers": r.get("num_nextn_predict_layers", 0),
    }


def _gpt2(r: _Reader) -> dict[str, Any]:
    """GPT2Config: learned positions, LayerNorm, GELU MLP of n_inner (default 4h), biases
    everywhere, LM head tied to the token embedding (GPT2LMHeadModel)."""
    hidden = r.need("n_embd")
    return {
        "num_hidden_layers": r.need("n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": r.need("n_head"),
        # GPT-2's default n_inner is 4 x n_embd (a number only: 4 x a string is no size)
        "intermediate_size": r.get("n_inner") or (
            4 * hidden if isinstance(hidden, int) and not isinstance(hidden, bool) else hidden),
        "vocab_size": r.need("vocab_size"),
        "activation": "gelu",
        "norm": "layernorm",
        "tie_word_embeddings": r.get("tie_word_embeddings", True),
        "position_embedding": "learned",
        "max_position_embeddings": r.need("n_positions"),
        "linear_bias": True,
    }


def _gpt_neox(r: _Reader) -> dict[str, Any]:
    """GPTNeoXConfig: rotary (partial), LayerNorm, GELU MLP, biases everywhere, untied head."""
    return {
        "num_hidden_layers": r.need("num_hidden_layers"),
        "hidden_size": r.need("hidden_size"),
        "num_attention_heads": r.need("num_attention_heads"),
        "intermediate_size": r.need("intermediate_size"),
        "vocab_size": r.need("vocab_size"),
        "activation": "gelu",
        "norm": "layernorm",
        "tie_word_embeddings": r.get("tie_word_embeddings", False),
        "position_embedding": "rope",
        "linear_bias": True,
    }


READERS: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _llama_like,
    "mixtral": _mixtral,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gpt_oss": _gpt_oss,
    "glm4_moe": _glm4_moe,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
}


def architecture(spec: ModelSpec) -> dict[str, Any]:
    """The fields of `spec` that size its weights and FLOPs (no names, sources, job defaults),
    defaults resolved (kv heads, head size, expert size) so equal shapes compare equal."""
    arch = {key: getattr(spec, key) for key in ARCHITECTURE_FIELDS}
    arch.update(num_key_value_heads=spec.kv_heads, head_dim=spec.head_size,
                moe_intermediate_size=spec.expert_ffn if spec.is_moe else None)
    return arch


def hf_model_fields(config: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    """The ModelSpec fields (unvalidated) of the contents of a HuggingFace config.json. `where`
    (the file) is named in errors: an unknown model_type or a missing field raises one-line
    SpecError. seq_len is min(max_position_embeddings, 4096), global_batch 512."""
    if not isinstance(config, dict):
        raise SpecError(f"{where}: expected a JSON object at the top level")
    model_type = config.get("model_type")
    reader = READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        shown = "missing" if model_type is None else f"'{model_type}'"
        raise SpecError(
            f"{where}: field 'model_type': {shown} is not supported "
            f"(supported: {', '.join(sorted(READERS))})"
        )
    fields = reader(_Reader(config, where, model_type))
    max_pos = config.get("max_position_embeddings") or config.get("n_positions")
    counted = isinstance(max_pos, int) and not isinstance(max_pos, bool) and max_pos > 0
    seq_len = min(max_pos, DEFAULT_SEQ_LEN) if counted else DEFAULT_SEQ_LEN
    return {"name": name, "source": f"HuggingFace config {where}", **fields,
            "seq_len": seq_len, "global_batch": DEFAULT_GLOBAL_BATCH}
