"""A mixture-of-experts feed-forward layer with expert parallelism over a process group, on
torch.distributed's own collectives (all_to_all_single; gloo runs it on CPU in torch 2.13, with
autograd through the functional collectives' all_to_all_single_autograd).

Top-k softmax routing without capacity (dropless, Megatron-Core's default), SwiGLU experts. With
an EP group of n ranks each rank holds E/n experts (ranks own consecutive expert ids); a rank
routes its tokens, sends each routed copy to the rank owning its expert (dispatch), runs its
local experts on what it received, and sends the outputs back (combine), where they are weighted
by the router's probabilities and summed per token. The alltoall dispatcher of
planner.costmodel.moe, with expert-TP 1.

`planner validate` builds it for MoE specs (validate.model) and lays it out with
localize() over the EP groups of the DP ranks (validate.parallel.apply_ep); the dist test
tests/dist/test_moe_ep.py trains this layer with EP on 4 CPU processes and checks its losses
against one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class MoEFeedForward(nn.Module):
    """E SwiGLU experts of width ffn, top-k routing; experts [first, first + local) live here."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        size = dist.get_world_size(group) if group is not None else 1
        rank = dist.get_rank(group) if group is not None else 0
        if experts % size:
            raise ValueError(f"{size} EP ranks do not divide {experts} experts")
        self.experts, self.top_k, self.group, self.size = experts, top_k, group, size
        self.local = experts // size
        self.first = rank * self.local
        self.router = nn.Linear(hidden, experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(self.local, hidden, ffn))  # gate
        self.w3 = nn.Parameter(torch.empty(self.local, hidden, ffn))  # up
        self.w2 = nn.Parameter(torch.empty(self.local, ffn, hidden))  # down

    def localize(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        """Keep only this EP rank's experts (rank of `size` in `group`) of a layer built whole."""
        if self.experts % size:
            raise ValueError(f"{size} EP ranks do not divide {self.experts} experts")
        local = self.experts // size
        sl = slice(rank * local, (rank + 1) * local)
        self.w1 = nn.Parameter(self.w1.detach()[sl].clone())
        self.w3 = nn.Parameter(self.w3.detach()[sl].clone())
        self.w2 = nn.Parameter(self.w2.detach()[sl].clone())
        self.group, self.size, self.local, self.first = group, size, local, rank * local

    def expert_params(self) -> list[nn.Parameter]:
        """This rank's expert weights (not replicated over the EP group)."""
        return [self.w1, self.w3, self.w2]

    def load_experts(self, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> None:
        """Take this rank's slice of the full (E, ...) expert weights."""
        sl = slice(self.first, self.first + self.local)
        with torch.no_grad():
            self.w1.copy_(w1[sl])
            self.w3.copy_(w3[sl])
            self.w2.copy_(w2[sl])

    def _experts(self, x: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """Local experts on rows x (expert: each row's local expert index)."""
        out = torch.zeros_like(x)
        for e in range(self.local):
            rows = (expert == e).nonzero(as_tuple=True)[0]
            if len(rows):
                h = x[rows]
                out = out.index_add(0, rows, (F.silu(h @ self.w1[e]) * (h @ self.w3[e]))
                                    @ self.w2[e])
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(x), dim=-1)
        weight, expert = probs.topk(self.top_k, dim=-1)  # (T, k)
        token = torch.arange(x.shape[0], device=x.device).repeat_interleave(self.top_k)
        expert = expert.reshape(-1)
        order = torch.argsort(expert, stable=True)  # copies grouped by owning rank
        token, expert = token[order], expert[order]
        copies = x[token]
        if self.group is None:
            out = self._experts(copies, expert - self.first)
        else:
            out = self._exchange(copies, expert)
        y = torch.zeros_like(x).index_add(0, token, out * weight.reshape(-1)[order][:, None])
        return y.reshape(shape)

    def _exchange(self, copies: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """Dispatch the copies to their experts' ranks, run the local experts, combine back."""
        from torch.distributed._functional_collectives import (
            all_to_all_single_autograd as all_to_all_single,
        )

        owner = expert // self.local
        send = torch.bincount(owner, minlength=self.size)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)  # how many copies each rank sends
        send_sizes, recv_sizes = send.tolist(), recv.tolist()
        got = all_to_all_single(copies, recv_sizes, send_sizes, group=self.group)
        got = got.wait() if hasattr(got, "wait") else got
        got_expert = torch.empty(sum(recv_sizes), dtype=expert.dtype, device=expert.device)
        dist.all_to_all_single(got_expert, expert, recv_sizes, send_sizes, group=self.group)
        out = self._experts(got, got_expert - self.first)
        back = all_to_all_single(out, send_sizes, recv_sizes, group=self.group)
        return back.wait() if hasattr(back, "wait") else back
