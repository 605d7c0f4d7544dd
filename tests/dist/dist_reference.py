"""One process training a scaled model without torch.distributed: the reference every parallel
layout's losses are held to (AdamW, lr 1e-3, seed 0 and the synthetic batches, as the worker)."""

from __future__ import annotations

import math


def train_reference(spec, seq_len: int, batch: int, vocab: int,
                    steps: int) -> tuple[list[float], float]:
    """The loss of each of `steps` steps and step 1's gradient norm."""
    import torch

    from planner.validate.model import ModelArgs, Transformer, cross_entropy, synthetic_batch

    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_spec(spec, seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, norm = [], 0.0
    for step in range(steps):
        tokens, targets = synthetic_batch(batch, seq_len, vocab, 0, step)
        opt.zero_grad()
        loss = cross_entropy(model(tokens), targets)
        loss.backward()
        if step == 0:
            norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
        opt.step()
        losses.append(float(loss.detach()))
    return losses, norm
