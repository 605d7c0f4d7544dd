"""Collectives: ring volumes, tiers, the hierarchical NIC share, latency beyond the reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from costmodel_fixtures import a100, cluster, flat_gpu

from planner.costmodel import comm
from planner.layout import Layout, group_span_nodes


def test_members_per_domain_agrees_with_group_span_nodes():
    """Vectorized tier logic vs the layout module's scalar group_span_nodes (rank order)."""
    for tp, cp, dp, pp in itertools.product([1, 2, 4, 8], [1, 2], [1, 2, 4, 16], [1, 2, 8]):
        lo = Layout(tp=tp, cp=cp, dp=dp, pp=pp)
        for axis, stride in [("tp", 1), ("cp", tp), ("dp", tp * cp), ("pp", tp * cp * dp)]:
            size = getattr(lo, axis)
            group = comm.Group(cluster(a100(), 1024), np.array([size]), np.array([stride]))
            assert group.domains[0] == group_span_nodes(lo, axis, 8), (lo, axis)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_gather_moves_s_n_minus_1_over_n(n):
    gpu = flat_gpu(intra_gb=100)
    group = comm.Group(cluster(gpu, 8), np.array([n]), np.array([1]))
    t = comm.all_gather_time(group, 1e9)[0]
    assert t * 100e9 == pytest.approx(1e9 * (n - 1) / n, rel=1e-9)
    t_ar = comm.all_reduce_time(group, 1e9)[0]
    assert t_ar == pytest.approx(2 * t, rel=1e-9)  # all-reduce = reduce-scatter + all-gather


def test_group_of_one_costs_nothing():
    group = comm.Group(cluster(a100(), 8), np.array([1]), np.array([1]))
    assert comm.all_reduce_time(group, 1e9)[0] == 0.0
    assert comm.all_to_all_time(group, 1e9)[0] == 0.0


def test_full_node_groups_reach_the_measured_multi_node_busbw():
    """A DP group of whole 8-GPU nodes uses all 8 NICs: 8 x 24 GB/s = 192 GB/s, the DGX A100
    multi-node all-reduce busbw NVIDIA reports (nccl #1576, docs/hardware.md 2.2)."""
    group = comm.Group(cluster(a100(), 128), np.array([128]), np.array([1]))
    assert group.crosses[0] and group.per_domain[0] == 8
    assert group.busbw(8e9)[0] / 1e9 == pytest.approx(192, rel=0.01)
    # one member per node (the DP group of a tp=8 layout): one NIC, ~24 GB/s
    strided = comm.Group(cluster(a100(), 128), np.array([16]), np.array([8]))
    assert strided.busbw(8e9)[0] / 1e9 == pytest.approx(24, rel=0.01)


def test_intra_node_busbw_follows_the_curve():
    group = comm.Group(cluster(a100(), 8), np.array([8]), np.array([1]))
    # the fixture's measured points (Azure ND A100 v4): 166.6 GB/s at 64 MiB
    assert group.busbw(67108864)[0] / 1e9 == pytest.approx(166.6)
    # curves are end to end at 8 ranks: no latency on top
    t = comm.all_reduce_time(group, 67108864)[0]
    assert t == pytest.approx(2 * 67108864 * 7 / 8 / 166.6e9)


def test_latency_grows_beyond_the_reference_ring():
    gpu = flat_gpu(intra_gb=100, inter_gb=10)
    gpu = gpu.model_copy(update={
        "inter_node": gpu.inter_node.model_copy(update={"latency_us": 10.0})})
    # 64 ranks, one per node: 2 x 63 ring steps, all across the network; 2 are in the curve
    group = comm.Group(cluster(gpu, 512), np.array([64]), np.array([8]))
    t = comm.all_reduce_time(group, 1.0)[0]
    assert t == pytest.approx((2 * 63 - 2) * 10e-6, rel=1e-3)


def test_p2p_is_alpha_beta_on_the_plateau():
    gpu = a100()
    t_in = comm.p2p_time(cluster(gpu, 16), 64e6, np.array([False]))[0]
    t_out = comm.p2p_time(cluster(gpu, 16), 64e6, np.array([True]))[0]
    assert t_in == pytest.approx(64e6 / 231.6e9 + (8.4 + 3.4) * 1e-6)
    assert t_out == pytest.approx(64e6 / 24.0e9 + (8.4 + 14.0) * 1e-6)


def test_all_to_all_across_nodes_is_bound_by_each_ranks_nic():
    gpu = flat_gpu(intra_gb=100, inter_gb=10)
    inside = comm.Group(cluster(gpu, 64), np.array([8]), np.array([1]))
    assert comm.all_to_all_time(inside, 8e6)[0] == pytest.approx(8e6 * 7 / 8 / 100e9, rel=1e-6)
    # 16 ranks on two nodes: half of each rank's data crosses its own 10 GB/s NIC
    across = comm.Group(cluster(gpu, 64), np.array([16]), np.array([1]))
    assert comm.all_to_all_time(across, 8e6)[0] == pytest.approx(8e6 * 8 / 16 / 10e9, rel=1e-6)
