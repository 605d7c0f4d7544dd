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


def _spread_group(latency_us: float = 10.0, ranks: int = 64):
    """`ranks` ranks one per node (stride 8) on flat curves: intra 100, one NIC at 10 GB/s."""
    gpu = flat_gpu(intra_gb=100, inter_gb=10)
    gpu = gpu.model_copy(update={
        "inter_node": gpu.inter_node.model_copy(update={"latency_us": latency_us})})
    return comm.Group(cluster(gpu, 8 * ranks), np.array([ranks]), np.array([8]))


def test_latency_grows_beyond_the_reference_ring():
    # 64 ranks, one per node: a reduce-scatter takes 63 ring steps across the network, of which
    # the 2-node reference curve holds 1
    t = comm.reduce_scatter_time(_spread_group(), 1.0)[0]
    assert t == pytest.approx((63 - 1) * 10e-6, rel=1e-3)


def test_small_all_reduce_across_many_nodes_takes_the_tree():
    """1 B on 64 nodes: the ring pays (2 x 63 - 2) x 10 us = 1.24 ms beyond the curve; NCCL's
    tree pays 2 (log2 64 - 1) x 14 us = 140 us (tuning.cc), so NCCL and the model take the tree."""
    t = comm.all_reduce_time(_spread_group(), 1.0)[0]
    assert t == pytest.approx(2 * (6 - 1) * 14e-6, rel=1e-3)


def test_large_all_reduce_keeps_the_ring_with_its_plateau_latency():
    """1 GiB on 64 nodes at 10 GB/s: wire 2 S 63/64 / 10 GB/s = 0.2114 s; the ring's extra
    latency 1.24 ms x 1.4 (NCCL's plateau factor, chunks >= 64 B per channel); the tree's
    bandwidth is 0.92 x (correction 1 at 1 GiB): 0.2298 s + 140 us. The ring wins."""
    nbytes = 2.0 ** 30
    wire = 2 * nbytes * 63 / 64 / 10e9
    t = comm.all_reduce_time(_spread_group(), nbytes)[0]
    assert t == pytest.approx(wire + 124 * 10e-6 * 1.4, rel=1e-6)


def test_medium_all_reduce_tree_pays_nccls_correction():
    """2 MiB on 64 nodes: ring 2 S 63/64 / 10 GB/s = 0.413 ms + 1.24 ms x 1.4 = 2.149 ms; tree
    0.413 ms / (0.92 x 0.6) (treeCorrectionFactor Simple at log2(2 MiB / 64) = 15) + 0.14 ms =
    0.888 ms: the tree."""
    nbytes = 2.0 ** 21
    wire = 2 * nbytes * 63 / 64 / 10e9
    t = comm.all_reduce_time(_spread_group(), nbytes)[0]
    assert t == pytest.approx(wire / (0.92 * 0.6) + 140e-6, rel=1e-6)
    assert comm.tree_correction(2.0 ** 21) == pytest.approx(0.6)
    assert comm.tree_correction(2.0 ** 30) == 1.0


def test_inside_one_domain_the_ring_is_unchanged():
    gpu = flat_gpu(intra_gb=100)
    group = comm.Group(cluster(gpu, 8), np.array([8]), np.array([1]))
    assert comm.all_reduce_time(group, 2.0 ** 21)[0] == pytest.approx(
        2 * 2.0 ** 21 * 7 / 8 / 100e9, rel=1e-6)


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


def test_param_gather_after_the_step_is_exposed():
    """ZeRO-1 with 1.0 s of per-step traffic of which 0.4 s is the parameter all-gather, one
    micro-batch of forward 0.3 s and backward 0.5 s, dp_overlap 0.8. Megatron's
    overlap_param_gather: everything may hide behind backward + forward (0.8 s), at most 80% of
    it: max(0.2 x 1.0, 1.0 - 0.8) = 0.2. nanotron (the gather after the optimizer step): the
    0.6 s reduce-scatter hides behind the backward only, max(0.2 x 0.6, 0.6 - 0.5) = 0.12, and
    the 0.4 s gather is all exposed: 0.52. ZeRO 0 is the same either way."""
    args = (np.array([1.0]), np.array([0.0]), np.array([1.0]))
    kw = dict(forward_s=0.3, recompute_s=0.0, backward_s=0.5, dp_overlap=0.8, gather=0.4)
    hidden = comm.dp_exposed_time(*args, np.array([1]), **kw)
    after = comm.dp_exposed_time(*args, np.array([1]), **kw, param_overlap=False)
    assert float(hidden[0]) == pytest.approx(0.2)
    assert float(after[0]) == pytest.approx(0.52)
    z0 = dict(kw, gather=0.0)
    assert float(comm.dp_exposed_time(*args, np.array([0]), **z0, param_overlap=False)[0]) \
        == pytest.approx(float(comm.dp_exposed_time(*args, np.array([0]), **z0)[0])) \
        == pytest.approx(max(0.2 * 1.0, 1.0 - 0.5))


def test_dp_traffic_reports_the_parameter_gather():
    """The third value of dp_traffic_time is the ZeRO-1/2 all-gather of the 16-bit updated
    parameters, inside per-step: 2 bytes x params x (d-1)/d / busbw on a flat 100 GB/s node,
    d = 8, one bucket (params < 40M); 0 for ZeRO 0."""
    gpu = flat_gpu(intra_gb=100.0)
    group = comm.Group(cluster(gpu, 8), np.array([8.0, 8.0]), np.array([1.0, 1.0]))
    params = 10e6
    per_step, _, gather = comm.dp_traffic_time(group, params, np.array([0, 1]), 4.0, 1.0)
    assert gather[0] == 0.0
    assert gather[1] == pytest.approx(2 * params * 7 / 8 / 100e9, rel=1e-3)
    # ZeRO-1: reduce-scatter of 4-byte gradients + the gather
    assert per_step[1] == pytest.approx(4 * params * 7 / 8 / 100e9 + gather[1], rel=1e-3)


def test_gathers_run_at_the_gather_ratio_of_the_all_reduce_curve():
    """A flat 100 GB/s node whose all-gathers and reduce-scatters reach 0.75 of the all-reduce
    busbw (H100: 360 vs NVLS 480 GB/s, nccl-tests #326 / #212): an all-gather of 1 GB on 8
    ranks takes 1e9 x 7/8 / 75e9 s, the all-reduce keeps 2 x 1e9 x 7/8 / 100e9 s."""
    gpu = flat_gpu(intra_gb=100.0)
    gpu = gpu.model_copy(update={"intra_node": gpu.intra_node.model_copy(
        update={"gather_busbw_ratio": 0.75})})
    group = comm.Group(cluster(gpu, 8), np.array([8.0]), np.array([1.0]))
    assert float(comm.all_gather_time(group, 1e9)[0]) == pytest.approx(1e9 * 7 / 8 / 75e9)
    assert float(comm.reduce_scatter_time(group, 1e9)[0]) == pytest.approx(1e9 * 7 / 8 / 75e9)
    assert float(comm.all_reduce_time(group, 1e9)[0]) == pytest.approx(2 * 1e9 * 7 / 8 / 100e9)
