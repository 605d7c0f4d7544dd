"""Expert parallelism on CPU with torch's own collectives: an MoE layer (planner.validate.moe)
trained with its 8 experts spread over 4 gloo processes (ep 4, expert data parallel 1, each
process its own quarter of the batch, the router's gradient all-reduced) gives the losses of
one process training the whole layer on the whole batch."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.dist, pytest.mark.slow]

HIDDEN, FFN, EXPERTS, TOP_K = 16, 24, 8, 2
TOKENS, STEPS, LR, WORLD = 64, 4, 0.5, 4


def _data(step: int):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(TOKENS, HIDDEN, generator=gen)
    target = torch.randn(TOKENS, HIDDEN, generator=gen)
    return x, target


def _weights():
    gen = torch.Generator().manual_seed(7)
    router = torch.randn(EXPERTS, HIDDEN, generator=gen) * 0.5
    w1 = torch.randn(EXPERTS, HIDDEN, FFN, generator=gen) * 0.2
    w3 = torch.randn(EXPERTS, HIDDEN, FFN, generator=gen) * 0.2
    w2 = torch.randn(EXPERTS, FFN, HIDDEN, generator=gen) * 0.2
    return router, w1, w3, w2


def _train(group, rank: int, world: int) -> list[float]:
    """SGD on the mean squared error of the layer's output; with a group, this rank's share
    of the batch, and the loss (and router gradient) averaged over the ranks."""
    import torch.distributed as dist

    from planner.validate.moe import MoEFeedForward

    router, w1, w3, w2 = _weights()
    layer = MoEFeedForward(HIDDEN, FFN, EXPERTS, TOP_K, group)
    with torch.no_grad():
        layer.router.weight.copy_(router)
    layer.load_experts(w1, w3, w2)
    losses = []
    share = TOKENS // world
    for step in range(STEPS):
        x, target = _data(0)  # one batch: the loss must fall
        x, target = x[rank * share:(rank + 1) * share], target[rank * share:(rank + 1) * share]
        loss = ((layer(x) - target) ** 2).mean()
        layer.zero_grad()
        loss.backward()
        value = loss.detach().clone()
        if group is not None:
            dist.all_reduce(value, group=group)
            value /= world
            dist.all_reduce(layer.router.weight.grad, group=group)  # replicated: data parallel
            layer.router.weight.grad /= world
            for p in (layer.w1, layer.w3, layer.w2):  # each expert's gradient is already summed
                p.grad /= world  # over the ranks that routed to it: the mean over the ranks
        losses.append(float(value))
        with torch.no_grad():
            for p in layer.parameters():
                p -= LR * p.grad
    return losses


def _worker(rank: int, world: int, port: int, out) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        losses = _train(dist.group.WORLD, rank, world)
        if rank == 0:
            out.put(losses)
    finally:
        dist.destroy_process_group()


def test_expert_parallel_losses_match_one_process():
    import torch.multiprocessing as mp

    single = _train(None, 0, 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(WORLD, port, queue), nprocs=WORLD, start_method="spawn")
    parallel = queue.get()
    assert len(parallel) == STEPS
    assert single[0] > single[-1]  # it trains
    assert parallel == pytest.approx(single, rel=1e-5)
