"""ModelSpec: the architecture of a transformer LM, in HuggingFace config names, and the counts
derived from it (parameters, FLOPs per token). Units: counts of parameters, FLOP, tokens."""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner import limits
from planner.specs.fields import count, real

Activation = Literal["gelu", "swiglu", "squared_relu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "alibi"]
LayerType = Literal["full_attention", "sliding_attention"]  # HF config.json `layer_types`


class ModelSpec(BaseModel):
    """A decoder-only transformer. Field names follow HuggingFace config.json where one exists."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    name: str = Field(description="Registry name, e.g. 'llama2-70b' (the YAML file's stem).")
    aliases: list[str] = Field(default_factory=list, description="Other names that resolve here.")
    description: str = Field(default="", description="The model in words (family, release, notes).")
    source: str = Field(
        default="",
        description="Citations: the architecture (paper, HF config.json), the published size and "
        "the default seq_len / global_batch.",
    )
    hf_repo: str | None = Field(
        default=None, description="HuggingFace repo whose config.json this spec matches, if any."
    )
    published_params_b: real(1e6) | None = Field(
        default=None, description="Published total parameter count, billions (from `source`)."
    )
    published_active_params_b: real(1e6) | None = Field(
        default=None, description="Published parameters active per token (MoE), billions."
    )

    num_hidden_layers: count(limits.MAX_LAYERS) = Field(description="Transformer layers (blocks).")
    hidden_size: count(limits.MAX_HIDDEN) = Field(
        description="Model width h (residual stream), elements."
    )
    num_attention_heads: count(limits.MAX_HEADS) = Field(description="Query heads a.")
    num_key_value_heads: count(limits.MAX_HEADS) | None = Field(
        default=None, description="Key/value heads (GQA/MQA); None means = num_attention_heads."
    )
    head_dim: count(limits.MAX_HEAD_DIM) | None = Field(
        default=None,
        description="Per-head dimension; None means hidden_size / num_attention_heads.",
    )
    intermediate_size: count(limits.MAX_FFN) = Field(
        description="Dense MLP hidden size (ffn), elements; Mixtral's expert size."
    )
    vocab_size: count(limits.MAX_VOCAB) = Field(
        description="Vocabulary size V (padded as trained)."
    )
    activation: Activation = Field(
        description="MLP type: gelu or squared_relu (2 matrices), swiglu (any gated MLP, 3)."
    )
    norm: Norm = Field(
        default="rmsnorm", description="Normalization: layernorm (weight+bias) or rmsnorm."
    )
    tie_word_embeddings: bool = Field(default=False, description="LM head shares the embedding.")
    position_embedding: PositionEmbedding = Field(default="rope", description="Position encoding.")
    max_position_embeddings: count(limits.MAX_SEQ_LEN) | None = Field(
        default=None, description="Rows of the learned position table (learned only)."
    )
    attention_bias: bool = Field(default=False, description="Biases on the q, k, v projections.")
    linear_bias: bool = Field(
        default=False, description="Biases on every linear (GPT-2/NeoX style): qkv, out, both MLP."
    )

    # Mixture of experts (0 experts = dense).
    num_experts: count(limits.MAX_EXPERTS, lower=0) = Field(
        default=0, description="Routed experts per MoE layer."
    )
    num_experts_per_tok: count(limits.MAX_EXPERTS, lower=0) = Field(
        default=0, description="Routed experts per token (top-k)."
    )
    moe_intermediate_size: count(limits.MAX_FFN) | None = Field(
        default=None, description="Hidden size of one expert's MLP; None means intermediate_size."
    )
    num_shared_experts: count(limits.MAX_EXPERTS, lower=0) = Field(
        default=0, description="Always-active shared experts per MoE layer (DeepSeek)."
    )
    first_k_dense_replace: count(limits.MAX_LAYERS, lower=0) = Field(
        default=0, description="The first k layers are dense even in an MoE model (DeepSeek)."
    )
    moe_layer_freq: count(limits.MAX_LAYERS) = Field(
        default=1, description="Every n-th layer (after the first k) is MoE."
    )

    # Multi-head latent attention (DeepSeek-V2/V3); all None for ordinary attention.
    q_lora_rank: count(limits.MAX_HIDDEN) | None = Field(
        default=None, description="MLA query low-rank size; None = full-rank q_proj."
    )
    kv_lora_rank: count(limits.MAX_HIDDEN) | None = Field(
        default=None, description="MLA key/value low-rank size; set = the model uses MLA."
    )
    qk_nope_head_dim: count(limits.MAX_HEAD_DIM) | None = Field(
        default=None, description="MLA non-rotary q/k head dim."
    )
    qk_rope_head_dim: count(limits.MAX_HEAD_DIM) | None = Field(
        default=None, description="MLA rotary q/k head dim (one rotary key shared by all heads)."
    )
    v_head_dim: count(limits.MAX_HEAD_DIM) | None = Field(
        default=None, description="MLA value head dim."
    )

    # Attention variants of 2025 (HF names): Qwen3 / GLM-4.5 query-key norms, gpt-oss's
    # output-projection bias, attention sinks and alternating sliding-window layers.
    qk_norm: bool = Field(
        default=False,
        description="RMSNorm of head_dim weights on each query and key head (Qwen3 q_norm/k_norm, "
        "GLM-4.5 use_qk_norm): 2 x head_dim parameters per layer.",
    )
    attention_out_bias: bool = Field(
        default=False, description="Bias on the attention output projection o_proj (gpt-oss)."
    )
    attention_sinks: bool = Field(
        default=False,
        description="A learned sink logit per query head (gpt-oss `sinks`): one more softmax "
        "term per query row; num_attention_heads parameters per layer.",
    )
    sliding_window: count(limits.MAX_SEQ_LEN) | None = Field(
        default=None,
        description="Keys a query attends to in a sliding-window layer (itself included), tokens; "
        "None = no sliding-window layers.",
    )
    layer_types: list[LayerType] | None = Field(
        default=None,
        description="Attention type of each layer (full_attention / sliding_attention); None "
        "with a sliding_window = every layer slides.",
    )

    num_nextn_predict_layers: count(limits.MAX_LAYERS, lower=0) = Field(
        default=0,
        description="Multi-token-prediction modules trained beside the model (DeepSeek-V3, "
        "GLM-4.5: 1); not in num_params (the published counts leave them out), see mtp_params "
        "and mtp_flops_per_token.",
    )

    seq_len: count(limits.MAX_SEQ_LEN) = Field(
        default=4096, description="Default sequence length of a job, tokens (as trained)."
    )
    global_batch: count(limits.MAX_GLOBAL_BATCH) = Field(
        default=512, description="Default sequences per optimizer step (as trained)."
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"head size hidden_size / num_attention_heads = {self.hidden_size} / "
                f"{self.num_attention_heads} is not a positive integer (give head_dim, or heads "
                "that divide the hidden size)"
            )
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError(
                f"first_k_dense_replace ({self.first_k_dense_replace}) exceeds num_hidden_layers "
                f"({self.num_hidden_layers})"
            )
        if self.kv_heads > self.num_attention_heads or self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_key_value_heads ({self.kv_heads}) must divide num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError("num_experts_per_tok must be in 1..num_experts for an MoE model")
        if self.position_embedding == "learned" and self.max_position_embeddings is None:
            raise ValueError("learned position embeddings need max_position_embeddings")
        mla_dims = (self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim)
        if self.is_mla and None in mla_dims:
            raise ValueError(
                "MLA (kv_lora_rank) needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim"
            )
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(
                    f"layer_types has {len(self.layer_types)} entries for "
                    f"{self.num_hidden_layers} layers"
                )
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("sliding_attention layers need a sliding_window")
        if self.is_mla and (self.sliding_window is not None or self.attention_sinks):
            raise ValueError("sliding windows and attention sinks are not modelled with MLA")
        return self

    # ---- shape helpers -------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """Key/value heads (defaults to the query heads)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Per-head dimension, elements."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def expert_ffn(self) -> int:
        """Hidden size of one expert MLP, elements."""
        return self.moe_intermediate_size or self.intermediate_size

    def is_moe_layer(self, i: int) -> bool:
        """True when layer i (0-based) has a routed-expert MLP."""
        return (
            self.is_moe
            and i >= self.first_k_dense_replace
            and (i - self.first_k_dense_replace) % self.moe_layer_freq == 0
        )

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    def is_sliding_layer(self, i: int) -> bool:
        """True when layer i (0-based) attends over a sliding window."""
        if self.sliding_window is None:
            return False
        return self.layer_types is None or self.layer_types[i] == "sliding_attention"

    @cached_property
    def num_sliding_layers(self) -> int:
        return sum(self.is_sliding_layer(i) for i in range(self.num_hidden_layers))

    def attended_keys(self, seq_len: int, causal: bool = True) -> float:
        """Keys per query averaged over the sequence and all layers. Causal full attention:
        s/2 (half the s x s square); a causal window of w < s keys: (w^2/2 + (s - w) w) / s
        = w - w^2 / (2s) (the band under the diagonal; Megatron-Bridge flop_utils.py
        `swa_context`, 067f987, has the same count in whole tokens, w - w(w-1)/(2s)).
        Non-causal doubles both: s for a full layer (the Megatron papers' full square)."""
        s = float(seq_len)
        full = s / 2
        n_slide = self.num_sliding_layers
        if n_slide:
            w = float(self.sliding_window or 0)
            band = full if w >= s else w - w * w / (2 * s)
            keys = ((self.num_hidden_layers - n_slide) * full + n_slide * band)
            keys /= self.num_hidden_layers
        else:
            keys = full
        return keys if causal else 2 * keys

    # ---- parameter counts (elements) -----------------------------------------------------
    @property
    def _norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    @property
    def attention_matmul_params(self) -> int:
        """Weight elements of one attention block's projections (q, k, v, out; MLA's low-rank
        down/up projections), no biases or norms."""
        h, d = self.hidden_size, self.head_size
        a, kv = self.num_attention_heads, self.kv_heads
        if self.is_mla:
            nope, rope = self.qk_nope_head_dim or 0, self.qk_rope_head_dim or 0
            v = self.v_head_dim or d
            kv_rank = self.kv_lora_rank or 0
            if self.q_lora_rank:  # q_a_proj, q_b_proj
                q = h * self.q_lora_rank + self.q_lora_rank * a * (nope + rope)
            else:  # q_proj
                q = h * a * (nope + rope)
            # kv_a_proj_with_mqa (compressed kv + shared rope key), kv_b_proj, o_proj
            return q + h * (kv_rank + rope) + kv_rank * a * (nope + v) + a * v * h
        return h * a * d + 2 * h * kv * d + a * d * h

    @property
    def attention_params(self) -> int:
        """Parameters of one attention block (projections, their biases, MLA's inner norms);
        the pre-attention norm is counted in layer_params."""
        params = self.attention_matmul_params
        if self.is_mla:  # q_a_layernorm, kv_a_layernorm (RMSNorm weights)
            return params + (self.q_lora_rank or 0) + (self.kv_lora_rank or 0)
        d, a, kv = self.head_size, self.num_attention_heads, self.kv_heads
        if self.attention_bias or self.linear_bias:
            params += a * d + 2 * kv * d
        if self.linear_bias or self.attention_out_bias:
            params += self.hidden_size
        if self.qk_norm:  # q_norm, k_norm: one RMSNorm weight of head_dim each, shared by heads
            params += 2 * d
        if self.attention_sinks:
            params += a
        return params

    def mlp_matmul_params(self, ffn: int) -> int:
        """Weight elements of one MLP with hidden size `ffn` (2 matrices, 3 when gated)."""
        return (3 if self.activation == "swiglu" else 2) * self.hidden_size * ffn

    def mlp_params(self, ffn: int) -> int:
        """Parameters of one MLP with hidden size `ffn` (weights and biases)."""
        params = self.mlp_matmul_params(ffn)
        if self.linear_bias:  # up (and gate) biases of size ffn, down bias of size h
            params += (2 if self.activation == "swiglu" else 1) * ffn + self.hidden_size
        return params

    @property
    def dense_mlp_params(self) -> int:
        """Parameters of one dense (non-MoE) MLP."""
        return self.mlp_params(self.intermediate_size)

    @property
    def moe_mlp_params(self) -> int:
        """All experts (routed + shared) and the router of one MoE layer."""
        experts = (self.num_experts + self.num_shared_experts) * self.mlp_params(self.expert_ffn)
        return experts + self.router_params

    @property
    def router_params(self) -> int:
        """Router (gate) of one MoE layer: hidden_size x num_experts weights, plus a bias per
        expert with linear_bias (gpt-oss's router is nn.Linear-like with a bias)."""
        return (self.hidden_size + (1 if self.linear_bias else 0)) * self.num_experts

    @property
    def router_matmul_params(self) -> int:
        """Router weight elements (a matmul of h x num_experts)."""
        return self.hidden_size * self.num_experts

    @property
    def moe_mlp_active_params(self) -> int:
        """Parameters one token touches in an MoE layer: top-k routed + shared + router."""
        used = self.num_experts_per_tok + self.num_shared_experts
        return used * self.mlp_params(self.expert_ffn) + self.router_params

    def layer_params(self, i: int) -> int:
        """All parameters of layer i, norms included."""
        mlp = self.moe_mlp_params if self.is_moe_layer(i) else self.dense_mlp_params
        return self.attention_params + mlp + 2 * self._norm_params

    def layer_active_params(self, i: int) -> int:
        """Parameters of layer i one token uses (top-k + shared experts of an MoE layer)."""
        mlp = self.moe_mlp_active_params if self.is_moe_layer(i) else self.dense_mlp_params
        return self.attention_params + mlp + 2 * self._norm_params

    @property
    def embedding_params(self) -> int:
        """Token embedding plus a learned position table, if any."""
        tokens = self.vocab_size * self.hidden_size
        if self.position_embedding == "learned":
            return tokens + self.hidden_size * (self.max_position_embeddings or 0)
        return tokens

    @property
    def lm_head_params(self) -> int:
        """Output projection (0 extra when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        """The norm after the last layer."""
        return self._norm_params

    @cached_property
    def num_params(self) -> int:
        """Total parameters, embeddings included."""
        layers = sum(self.layer_params(i) for i in range(self.num_hidden_layers))
        return layers + self.embedding_params + self.lm_head_params + self.final_norm_params

    @cached_property
    def num_active_params(self) -> int:
        """Parameters used per token (= num_params for dense models), embedding and LM head
        included as Mistral counts Mixtral's 12.9B; DeepSeek's 37B for V3 leaves the input
        embedding out (num_active_params - embedding_params)."""
        layers = sum(self.layer_active_params(i) for i in range(self.num_hidden_layers))
        return layers + self.embedding_params + self.lm_head_params + self.final_norm_params

    @property
    def non_embedding_params(self) -> int:
        """Total parameters less the token/position embedding and an untied LM head."""
        return self.num_params - self.embedding_params - self.lm_head_params

    @property
    def mtp_params(self) -> int:
        """Parameters of the multi-token-prediction modules (DeepSeek-V3 report sec. 2.2: each
        an RMSNorm of h on the hidden state and one on the next token's embedding, a 2h -> h
        projection, one transformer layer like the last one, sharing the embedding and the
        output head; the final norm before the shared head is the model's own, as
        Megatron-Core's MTP block adds one): 11.6B for DeepSeek-V3, whose checkpoint (685B =
        671B + 14B) also stores the module's own copies of the embedding and the head."""
        if not self.num_nextn_predict_layers:
            return 0
        h = self.hidden_size
        module = 2 * self._norm_params + 2 * h * h + self.layer_params(self.num_hidden_layers - 1)
        return self.num_nextn_predict_layers * (module + self._norm_params)

    def mtp_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Training FLOP per token the MTP modules add (forward + backward, 3 x forward): the
        projection, one more layer like the last (its active experts, attention over the
        sequence) and one more pass through the output head. Megatron-Bridge's model FLOPs
        count the same (flop_utils.py: mtp_num_layers more layers and logit passes, 067f987).
        Not part of train_flops_per_token, which is the model's own count."""
        n = self.num_nextn_predict_layers
        if not n:
            return 0.0
        h, last = self.hidden_size, self.num_hidden_layers - 1
        if self.is_moe_layer(last):
            used = self.num_experts_per_tok + self.num_shared_experts
            mlp = used * self.mlp_matmul_params(self.expert_ffn) + self.router_matmul_params
        else:
            mlp = self.mlp_matmul_params(self.intermediate_size)
        matmul = 2 * h * h + self.attention_matmul_params + mlp + self.vocab_size * h
        attention = self.attention_flops_per_token(seq_len, causal) / self.num_hidden_layers
        return 3.0 * n * (2.0 * matmul + attention)

    def summary(self) -> dict[str, object]:
        """One row of `planner models --json`: the CONTRACT.md keys (name, aliases, params_b,
        active_params_b, layers, hidden, heads, kv_heads, ffn_hidden, vocab; billions of
        parameters, embeddings included) and the MoE and job details."""
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "params_b": self.num_params / 1e9,
            "active_params_b": self.num_active_params / 1e9,
            "layers": self.num_hidden_layers,
            "hidden": self.hidden_size,
            "heads": self.num_attention_heads,
            "kv_heads": self.kv_heads,
            "ffn_hidden": self.intermediate_size,
            "vocab": self.vocab_size,
            "num_params": self.num_params,
            "num_active_params": self.num_active_params,
            "num_experts": self.num_experts,
            "experts_per_token": self.num_experts_per_tok,
            "expert_ffn_hidden": self.expert_ffn if self.is_moe else None,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "published_params_b": self.published_params_b,
            "published_active_params_b": self.published_active_params_b,
            "hf_repo": self.hf_repo,
            "description": self.description,
        }

    # ---- FLOPs per token -----------------------------------------------------------------
    @cached_property
    def matmul_params_per_token(self) -> int:
        """Weight elements one token multiplies through in forward: every layer's attention
        projections, its dense MLP or top-k + shared experts and the router, and the LM head
        (tied or not). Biases, norms and the embedding lookup are not matmuls."""
        total = 0
        for i in range(self.num_hidden_layers):
            if self.is_moe_layer(i):
                used = self.num_experts_per_tok + self.num_shared_experts
                mlp = used * self.mlp_matmul_params(self.expert_ffn) + self.router_matmul_params
            else:
                mlp = self.mlp_matmul_params(self.intermediate_size)
            total += self.attention_matmul_params + mlp
        return total + self.vocab_size * self.hidden_size

    def attention_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Forward FLOP per token of the score (QK^T) and context (PV) matmuls over all layers:
        2 x heads x (qk + v head dims) per attended key (attended_keys). Non-causal counts the
        full s x s square, as Megatron's papers do (Narayanan 2021 eq. 3: the s/(6h) term);
        causal counts half (Megatron's current code, average_ratio 0.5). Sliding-window
        layers count their band only. Attention sinks add one logit per query row and head
        (a exp-adds per token and layer against 4 a d s FLOP: left out)."""
        a = self.num_attention_heads
        if self.is_mla:
            qk = (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
            v = self.v_head_dim or self.head_size
        else:
            qk = v = self.head_size
        keys = self.attended_keys(seq_len, causal)
        return 2.0 * keys * a * (qk + v) * self.num_hidden_layers

    def forward_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Model FLOP per token for one forward pass: 2 per weight multiply-add plus attention."""
        return 2.0 * self.matmul_params_per_token + self.attention_flops_per_token(seq_len, causal)

    def train_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Model FLOP per token for forward + backward (backward = 2x forward), no recompute."""
        return 3.0 * self.forward_flops_per_token(seq_len, causal)
