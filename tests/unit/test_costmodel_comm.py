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
    """64 ranks, two per node (stride 4) on 32 nodes, intra and network hops 10 us: a
    reduce-scatter's ring takes 63 steps, 31 across the network; the 2-node reference curve
    holds 1 network step and the 8-GPU intra curve 7 NVLink steps, so (32 - 7 + 31 - 1) x 10 us
    = 0.55 ms beyond the curve (NCCL tuning.cc: (nsteps - nInterSteps) intraLat + nInterSteps
    interLat). Two members per node: no PAT (NCCL runs it with one GPU per node only)."""
    gpu = flat_gpu(intra_gb=100, inter_gb=10)
    gpu = gpu.model_copy(update={
        "intra_node": gpu.intra_node.model_copy(update={"latency_us": 10.0}),
        "inter_node": gpu.inter_node.model_copy(update={"latency_us": 10.0})})
    group = comm.Group(cluster(gpu, 256), np.array([64]), np.array([4]))
    assert group.per_domain[0] == 2 and group.domains[0] == 32
    t = comm.reduce_scatter_time(group, 1.0)[0]
    assert t == pytest.approx((32 - 7 + 31 - 1) * 10e-6, rel=1e-3)


def test_one_rank_per_node_gathers_take_pat_when_small():
    """64 ranks, one per node, 10 us network hop: the ring pays (63 - 1) x 10 us = 620 us
    beyond the 2-node curve; NCCL's PAT pays log2(64/2) x 10/3.5 + (64 - 2) x 2.8 us =
    187.9 us (tuning.cc: log2(nNodes) interLat / 3.5 + nRanks x 2.8, beyond the 2-rank
    reference) at 0.75 of the busbw. 1 B takes PAT; 1 GB at 10 GB/s the ring (wire 98.4 ms
    against 131.25 ms at 0.75)."""
    group = _spread_group()
    pat = (5 * 10 / 3.5 + 62 * 2.8) * 1e-6
    assert comm.all_gather_time(group, 1.0)[0] == pytest.approx(pat + 63 / 64 / 10e9 / 0.75,
                                                               rel=1e-6)
    wire = 1e9 * 63 / 64 / 10e9
    assert comm.reduce_scatter_time(group, 1e9)[0] == pytest.approx(wire + 62 * 10e-6, rel=1e-6)


def test_ring_all_gather_over_whole_nodes_by_hand():
    """128 ranks on 16 full 8-GPU nodes, flat curves (NVLink 100 GB/s, NIC 10 GB/s), 3.4 us
    NVLink and 14 us network hops (NCCL hwLat Ring/Simple): busbw = min(100, 8 NICs x 10) =
    80 GB/s (hierarchical, the 8 GPUs of a node share its 8 NICs); 127 ring steps of which 15
    cross the network. Beyond the curves' references (7 NVLink steps, 1 network step):
    time = S (n-1)/n / busbw + (112 - 7) x 3.4 us + (15 - 1) x 14 us."""
    gpu = flat_gpu(intra_gb=100, inter_gb=10)
    gpu = gpu.model_copy(update={
        "intra_node": gpu.intra_node.model_copy(update={"latency_us": 3.4}),
        "inter_node": gpu.inter_node.model_copy(update={"latency_us": 14.0})})
    group = comm.Group(cluster(gpu, 128), np.array([128]), np.array([1]))
    s = 6.4e9
    expect = s * 127 / 128 / 80e9 + (105 * 3.4 + 14 * 14.0) * 1e-6
    assert comm.all_gather_time(group, s)[0] == pytest.approx(expect, rel=1e-6)
    # the all-reduce: twice the volume and the steps, the network part x1.4 (NCCL's plateau)
    ar = 2 * s * 127 / 128 / 80e9 + 2 * (105 * 3.4 + 14 * 14.0) * 1e-6 * 1.4
    assert comm.all_reduce_time(group, s)[0] == pytest.approx(ar, rel=1e-6)


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


def test_zero3_floor_by_hand():
    """4 units of 10 ms gather each, 2 micro-batches, forward 20 ms (5 ms a unit), backward
    40 ms (10 ms a unit), no recompute. Per micro-batch: the first gather (10 ms) and the last
    reduce-scatter (10 ms) wait in full; each of the 3 later units waits 10 - 5 ms in forward and
    2 x 10 - 10 ms in backward (its prefetched gather and the previous unit's reduce-scatter
    share the network): 20 + 3 x (5 + 10) = 65 ms, x 2 micro-batches = 130 ms."""
    floor = comm.zero3_exposed_floor(np.array([0.010]), np.array([4.0]), np.array([2]),
                                     0.020, 0.0, 0.040)
    assert float(floor[0]) == pytest.approx(0.130)
    # compute long enough to hide every later unit: only the first gather and last RS remain
    long = comm.zero3_exposed_floor(np.array([0.010]), np.array([4.0]), np.array([2]),
                                    1.0, 0.5, 2.0)
    assert float(long[0]) == pytest.approx(2 * 0.020)
    # full recompute re-runs the forward inside backward: it widens the backward window
    rc = comm.zero3_exposed_floor(np.array([0.010]), np.array([4.0]), np.array([1]),
                                  0.020, 0.040, 0.040)
    assert float(rc[0]) == pytest.approx(0.020 + 3 * (0.005 + 0.0))


def test_zero3_floor_binds_only_above_the_overlap_share():
    """ZeRO-3, 1.0 s of per-micro-batch traffic, one micro-batch, dp_overlap 0.8, a long
    window: exposed = max(0.2 x 1.0, floor). A floor of 0.05 s leaves 0.2; one of 0.5 s gives
    0.5; no floor is ever above the traffic itself (capped at 1.0)."""
    args = (np.array([0.0]), np.array([1.0]), np.array([1]), np.array([3]))
    kw = dict(forward_s=10.0, recompute_s=0.0, backward_s=20.0, dp_overlap=0.8)
    assert float(comm.dp_exposed_time(*args, **kw, floor=0.05)[0]) == pytest.approx(0.2)
    assert float(comm.dp_exposed_time(*args, **kw, floor=0.5)[0]) == pytest.approx(0.5)
    assert float(comm.dp_exposed_time(*args, **kw, floor=5.0)[0]) == pytest.approx(1.0)


def test_zero3_traffic_is_three_unit_collectives_per_micro_batch():
    """dp_traffic_time's ZeRO-3 per-micro-batch traffic is 3 x units x one unit's gather
    (zero3_unit_time): 8 layers of 10M 16-bit params (20 MB units) on a flat 100 GB/s node of 8,
    each gather 20e6 x 7/8 / 100e9 s."""
    gpu = flat_gpu(intra_gb=100.0)
    group = comm.Group(cluster(gpu, 8), np.array([8.0]), np.array([1.0]))
    t_unit, units = comm.zero3_unit_time(group, 80e6, 20e6)
    assert float(np.ravel(units)[0]) == 8.0
    assert float(t_unit[0]) == pytest.approx(20e6 * 7 / 8 / 100e9, rel=1e-6)
    _, per_mb, _ = comm.dp_traffic_time(group, 80e6, np.array([3]), 2.0, 20e6)
    assert float(per_mb[0]) == pytest.approx(3 * 8 * 20e6 * 7 / 8 / 100e9, rel=1e-6)


def test_ring_slowdown_per_domain_by_hand():
    """A fabric whose rings lose bandwidth with the nodes they span (LinkProfile
    ring_slowdown_per_domain x = 0.05): 256 ranks on 32 full nodes, flat curves (NVLink 100, NIC
    10 GB/s, negligible hops): an all-gather of 1 GB runs at min(100, 8 x 10) / (1 + 0.05 x 30)
    = 32 GB/s, i.e. 1e9 x 255/256 / 32e9 s; a ring all-reduce is slowed alike, but NCCL's tree
    is not, so the all-reduce takes the tree at 0.92 x 80 GB/s (correction 1 at 1 GB)."""
    gpu = flat_gpu(intra_gb=100, inter_gb=10)
    gpu = gpu.model_copy(update={"inter_node": gpu.inter_node.model_copy(
        update={"ring_slowdown_per_domain": 0.05})})
    group = comm.Group(cluster(gpu, 256), np.array([256]), np.array([1]))
    assert group.ring_slowdown[0] == pytest.approx(2.5)
    assert comm.all_gather_time(group, 1e9)[0] == pytest.approx(1e9 * 255 / 256 / 32e9,
                                                               rel=1e-3)
    tree = 2 * 1e9 * 255 / 256 / (0.92 * 80e9)
    assert comm.all_reduce_time(group, 1e9)[0] == pytest.approx(tree, rel=1e-2)
    # inside one node nothing changes
    inside = comm.Group(cluster(gpu, 256), np.array([8]), np.array([1]))
    assert comm.all_gather_time(inside, 1e9)[0] == pytest.approx(1e9 * 7 / 8 / 100e9, rel=1e-6)


def test_dp_bucket_mb_sets_the_gradient_calls():
    """torch DDP buckets of 25 MiB of 16-bit gradients (nanotron's ddp_bucket_cap_mb): 100M
    parameters reduce in ceil(100e6 / 13,107,200) = 8 calls of 13,107,200 fp32 elements
    (52.4 MB) instead of Megatron's 3 calls of 40M elements. On a flat 100 GB/s node of 8 with
    negligible latency each call is 2 x 4 B x elements x 7/8 / 100 GB/s (every call is charged a
    full bucket: 8 x 13,107,200 against 3 x 40M elements)."""
    gpu = flat_gpu(intra_gb=100.0)
    group = comm.Group(cluster(gpu, 8), np.array([8.0]), np.array([1.0]))
    per_step, _, _ = comm.dp_traffic_time(group, 100e6, np.array([0]), 4.0, 1.0, bucket_mb=25)
    assert float(per_step[0]) == pytest.approx(2 * 4 * 8 * 13_107_200 * 7 / 8 / 100e9,
                                               rel=1e-6)
    megatron, _, _ = comm.dp_traffic_time(group, 100e6, np.array([0]), 4.0, 1.0)
    assert float(megatron[0]) == pytest.approx(2 * 4 * 3 * 40e6 * 7 / 8 / 100e9, rel=1e-6)


def test_cluster_nics_per_node_sets_the_hierarchical_nic_share():
    """DLPerf's V100 nodes have one 100 Gb/s EDR NIC per 8 GPUs (Oneflow-Inc/DLPerf
    Megatron-LM/README.md: one mlx5_0 in `nvidia-smi topo -m`, ibstat Rate 100), the V100
    profile's DGX-1 four. A TP 16 all-reduce over two such nodes, S = 128 MiB: each node's 8
    members share S/8 = 16 MiB over NICs read at the profile's 16 MiB point (11.8 GB/s), so
    busbw = 8 members x 1/8 NIC x 11.8 = 11.8 GB/s (DGX-1: 8 x 0.5 x 11.8 = 47.2)."""
    from planner.registry import load_gpu, parse_cluster

    gpu = load_gpu("V100-SXM2-16GB")
    one_nic = parse_cluster("16xV100-SXM2-16GB", profile=gpu).model_copy(
        update={"nics_per_node": 1.0})
    dgx1 = parse_cluster("16xV100-SXM2-16GB", profile=gpu)
    assert one_nic.nics_per_gpu == 1 / 8 and dgx1.nics_per_gpu == gpu.nics_per_gpu == 0.5
    s = 8 * 16777216
    for spec, busbw in ((one_nic, 11.8e9), (dgx1, 47.2e9)):
        group = comm.Group(spec, np.array([16]), np.array([1]))
        assert group.busbw(s)[0] == pytest.approx(busbw)
        # the ring wins (the tree runs at 0.92 x 0.9 of it at 128 MiB); its latency beyond the
        # curves: 2 x 15 steps, 2 of them on the network (the 2-node reference), 28 on NVLink,
        # 14 beyond the 8-GPU curve's 2 x 7, at 3.4 us, x 1.4 (NCCL's ring plateau factor)
        wire = 2 * s * 15 / 16 / busbw
        assert comm.all_reduce_time(group, s)[0] == pytest.approx(wire + 14 * 3.4e-6 * 1.4)


def test_nanotron_zero1_all_reduce_after_the_backward():
    """nanotron ZeRO-1 with fp32 accumulation (no DDP; one all-reduce of the whole fp32 buffer
    after the backward, then the parameter gather). Flat 100 GB/s node of 8, 10M parameters:
    the blocking all-reduce is 2 x 4 B x 10M x 7/8 / 100 GB/s = 0.7 ms, the gather 2 B x 10M x
    7/8 / 100 GB/s = 0.175 ms, and no reduce-scatter is charged; ZeRO 0 rows cost no blocking
    time. Exposed: both, in full, whatever the window (backward 1 s, dp_overlap 0.8)."""
    gpu = flat_gpu(intra_gb=100.0)
    group = comm.Group(cluster(gpu, 8), np.array([8.0, 8.0]), np.array([1.0, 1.0]))
    params, zero = 10e6, np.array([0, 1])
    blocking = comm.zero1_blocking_time(group, params, zero, 4.0)
    assert blocking[0] == 0.0
    assert blocking[1] == pytest.approx(2 * 4 * params * 7 / 8 / 100e9, rel=1e-3)
    per_step, _, gather = comm.dp_traffic_time(group, params, zero, 4.0, 1.0, 25,
                                               zero1_all_reduce=True)
    assert per_step[1] == pytest.approx(gather[1], rel=1e-12)  # no reduce-scatter left
    assert gather[1] == pytest.approx(2 * params * 7 / 8 / 100e9, rel=1e-3)
    total = per_step + blocking
    exposed = comm.dp_exposed_time(total, np.zeros(2), np.ones(2), zero, 0.3, 0.0, 1.0, 0.8,
                                   gather=gather, param_overlap=False, blocking=blocking)
    assert exposed[1] == pytest.approx(blocking[1] + gather[1], rel=1e-12)
    # ZeRO 0's bucketed all-reduce still hides behind the 1 s backward up to dp_overlap
    assert exposed[0] == pytest.approx(0.2 * per_step[0], rel=1e-12)
    # the same blocking time with the gather hidden behind the next forward stays exposed
    hidden = comm.dp_exposed_time(total, np.zeros(2), np.ones(2), zero, 0.3, 0.0, 1.0, 0.8,
                                  gather=gather, blocking=blocking)
    assert hidden[1] == pytest.approx(blocking[1] + 0.2 * gather[1], rel=1e-12)
