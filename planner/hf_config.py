"""HuggingFace config.json -> the ModelSpec fields of that architecture.

    fields = hf_model_fields(json.load(open("config.json")), name="my-model", where="config.json")

Reads the fields each transformers architecture uses to size its weights (model_type llama,
mistral, mixtral, qwen2, gpt2, gpt_neox, deepseek_v2, deepseek_v3). Defaults follow the
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
    "qk_rope_head_dim", "v_head_dim",
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
    }


def _mixtral(r: _Reader) -> dict[str, Any]:
    return _llama_like(r) | {
        "num_experts": r.need("num_local_experts"),
        "num_experts_per_tok": r.need("num_experts_per_tok"),
    }


def _deepseek(r: _Reader) -> dict[str, Any]:
    """DeepseekV2Config / DeepseekV3Config: MLA attention, shared + routed experts."""
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
