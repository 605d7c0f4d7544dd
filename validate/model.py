"""A Llama/GPT-style decoder built from a planner ModelSpec, and the synthetic data it trains on.

The module tree follows torchtitan's Llama (tok_embeddings, layers as a ModuleDict keyed by the
global layer index, norm, output) so that pipeline stages are made by deleting what a stage does
not own, and tensor parallelism addresses submodules by name (see parallel.py).

Covers RMSNorm or LayerNorm, RoPE or learned positions, GQA, SwiGLU or GELU MLPs, tied or untied
embeddings and linear biases, and routed SwiGLU experts (validate.moe, top-k, dropless) on the
spec's MoE layers. Multi-head latent attention and shared experts are not built: scaled_spec()
turns such a spec into what is built and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.specs import ModelSpec


@dataclass(frozen=True)
class ModelArgs:
    """Shape of the torch model, elements and counts (the scaled-down spec)."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    swiglu: bool
    rmsnorm: bool
    rope: bool
    max_positions: int
    tied: bool
    qkv_bias: bool
    linear_bias: bool
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    experts: int = 0  # routed experts of an MoE layer (0: dense model)
    top_k: int = 0
    expert_ffn: int = 0
    moe_layers: tuple[int, ...] = ()  # indices of the MoE layers

    @classmethod
    def from_spec(cls, spec: ModelSpec, seq_len: int) -> ModelArgs:
        return cls(
            num_layers=spec.num_hidden_layers,
            hidden=spec.hidden_size,
            heads=spec.num_attention_heads,
            kv_heads=spec.kv_heads,
            head_dim=spec.head_size,
            ffn=spec.intermediate_size,
            vocab=spec.vocab_size,
            swiglu=spec.activation == "swiglu",
            rmsnorm=spec.norm == "rmsnorm",
            rope=spec.position_embedding != "learned",
            max_positions=max(seq_len, spec.max_position_embeddings or 0),
            tied=spec.tie_word_embeddings,
            qkv_bias=spec.attention_bias or spec.linear_bias,
            linear_bias=spec.linear_bias,
            experts=spec.num_experts if spec.is_moe else 0,
            top_k=spec.num_experts_per_tok if spec.is_moe else 0,
            expert_ffn=spec.expert_ffn if spec.is_moe else 0,
            moe_layers=tuple(i for i in range(spec.num_hidden_layers) if spec.is_moe_layer(i)),
        )


def _norm(args: ModelArgs) -> nn.Module:
    if args.rmsnorm:
        return nn.RMSNorm(args.hidden, eps=args.norm_eps)
    return nn.LayerNorm(args.hidden, eps=args.norm_eps)


_ROPE_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_tables(head_dim: int, seq_len: int, theta: float, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (seq_len, head_dim // 2) (Su et al. 2021, eq. 34).
    Cached per shape and device; plain tensors, not buffers, so stages and FSDP never see them."""
    key = (head_dim, seq_len, theta, str(device))
    if key not in _ROPE_CACHE:
        _ROPE_CACHE[key] = tuple(t.to(device) for t in _rope_tables(head_dim, seq_len, theta))
    return _ROPE_CACHE[key]


def _rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_tables_at(torch.arange(seq_len), head_dim, theta)


def rope_tables_at(positions: torch.Tensor, head_dim: int, theta: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin at the given token positions, each (len(positions), head_dim // 2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(positions.float().cpu(), inv_freq)
    return angles.cos().to(positions.device), angles.sin().to(positions.device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]) of x (batch, seq, heads, head_dim)."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads. Head counts are inferred from the projection
    outputs so that a column-sharded (TP) projection runs on its local heads."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.rope_theta = args.rope_theta if args.rope else None
        self.n_rep = args.heads // args.kv_heads
        self.recompute_core = False  # set by parallel.apply_recompute("selective")
        # Positions of this rank's tokens when context parallelism shards the sequence (set per
        # step by the trainer); None means 0..seq-1.
        self.positions: torch.Tensor | None = None
        self.wq = nn.Linear(args.hidden, args.heads * args.head_dim, bias=args.qkv_bias)
        self.wk = nn.Linear(args.hidden, args.kv_heads * args.head_dim, bias=args.qkv_bias)
        self.wv = nn.Linear(args.hidden, args.kv_heads * args.head_dim, bias=args.qkv_bias)
        self.wo = nn.Linear(args.heads * args.head_dim, args.hidden, bias=args.linear_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape  # the full sequence: with SP, TP gathers it before this module
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        if self.rope_theta is not None:
            if self.positions is not None:
                rope = rope_tables_at(self.positions, self.head_dim, self.rope_theta)
            else:
                rope = rope_tables(self.head_dim, seq, self.rope_theta, x.device)
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.recompute_core:  # selective recomputation: keep q, k, v, redo the attention core
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.wo(out.reshape(bs, seq, -1))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(d)) v, causal; (batch, seq, heads, head_dim) in and out."""
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=2)
            v = v.repeat_interleave(self.n_rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return out.transpose(1, 2)


class FeedForward(nn.Module):
    """SwiGLU (w2(silu(w1 x) * w3 x), Shazeer 2020) or GELU (w2(gelu(w1 x))) MLP."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.swiglu = args.swiglu
        self.w1 = nn.Linear(args.hidden, args.ffn, bias=args.linear_bias)
        self.w2 = nn.Linear(args.ffn, args.hidden, bias=args.linear_bias)
        self.w3 = nn.Linear(args.hidden, args.ffn, bias=args.linear_bias) if args.swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Embeddings(nn.Module):
    """Token embedding plus, for learned positions, the position table (GPT-2)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.tok = nn.Embedding(args.vocab, args.hidden)
        self.pos = None if args.rope else nn.Embedding(args.max_positions, args.hidden)
        self.positions: torch.Tensor | None = None  # as Attention.positions

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        if self.pos is not None:
            positions = self.positions
            if positions is None:
                positions = torch.arange(tokens.shape[1], device=tokens.device)
            h = h + self.pos(positions)
        return h


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, args: ModelArgs, moe: bool = False) -> None:
        super().__init__()
        self.attention_norm = _norm(args)
        self.attention = Attention(args)
        self.ffn_norm = _norm(args)
        if moe:
            from .moe import MoEFeedForward

            self.feed_forward: nn.Module = MoEFeedForward(args.hidden, args.expert_ffn,
                                                          args.experts, args.top_k)
        else:
            self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The whole decoder, or one pipeline stage of it: a stage has `embed` only when it is the
    first, `norm` and `output` only when it is the last (None otherwise)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed: Embeddings | None = Embeddings(args)
        blocks = {str(i): TransformerBlock(args, i in args.moe_layers)
                  for i in range(args.num_layers)}
        self.layers = nn.ModuleDict(blocks)
        self.norm: nn.Module | None = _norm(args)
        self.output: nn.Linear | None = nn.Linear(args.hidden, args.vocab, bias=False)
        self.reset_parameters()
        if args.tied:
            self.output.weight = self.embed.tok.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 style init: N(0, 0.02), output projections scaled by 1/sqrt(2 * layers)
        (Radford et al. 2019, section 2.3); norms to one, biases to zero."""
        std = 0.02
        for name, p in self.named_parameters():
            if p.ndim == 1:
                nn.init.ones_(p) if name.endswith("norm.weight") else nn.init.zeros_(p)
            elif name.endswith(("wo.weight", "w2.weight", "feed_forward.w2")):  # w2: experts
                nn.init.normal_(p, std=std / math.sqrt(2 * self.args.num_layers))
            else:
                nn.init.normal_(p, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (batch, seq) on the first stage, hidden states (batch, seq, hidden) elsewhere;
        logits (batch, seq, vocab) from the last stage."""
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

def set_positions(module: nn.Module, positions: torch.Tensor | None) -> None:
    """Tell every attention and embedding of `module` the positions of its tokens."""
    for m in module.modules():
        if isinstance(m, Attention | Embeddings):
            m.positions = positions


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over the batch's tokens, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


def synthetic_batch(global_batch: int, seq_len: int, vocab: int, seed: int, step: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's tokens and next-token targets, (global_batch, seq_len) each, int64.

    Uniform random tokens from a generator seeded by (seed, step): every rank and the
    single-process reference see the same global batch and slice their share of it."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = torch.randint(0, vocab, (global_batch, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
