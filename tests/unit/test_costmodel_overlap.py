"""Communication overlap recipes: TP collectives behind their GEMMs (JobSpec.tp_comm_overlap,
Megatron-Core tp_comm_overlap) and pipeline sends behind the next chunk under interleaving
(JobSpec.p2p_overlap, Megatron-Core overlap_p2p_comm). Hand computations on flat profiles."""

from __future__ import annotations

import pytest
from costmodel_fixtures import cluster, flat_gpu, job, llama_like

from planner.costmodel import estimate
from planner.layout import Layout

# llama_like (Llama 2 70B shape) per layer: QKV 8192 x (8192 + 2 x 8 x 128) + out 8192^2 +
# SwiGLU 3 x 8192 x 28672 weights
LAYER_WEIGHTS = 8192 * (8192 + 2 * 8 * 128) + 8192 * 8192 + 3 * 8192 * 28672
L, H, S, T = 80, 8192, 4096, 8


def _tp_one(busbw: float) -> float:
    """One all-gather + one reduce-scatter of the b s h activation (2 bytes) over t ranks:
    S (t - 1) / t bytes each at the flat busbw, latency negligible."""
    return 2 * (S * H * 2) * (T - 1) / T / busbw


def _estimate(gpu, **job_fields):
    model = llama_like()
    lo = Layout(tp=T, pp=1, dp=1, mbs=1, zero=0, recompute="none", sp=True)
    return estimate(model, cluster(gpu, T), job(model, global_batch=1, **job_fields), lo)


def test_tp_overlap_leaves_one_chunk_when_gemms_are_longer():
    """Flat GPU, 100 GB/s NVLink: the forward GEMMs of a layer (2 x 4096 x 855.6M / 8 FLOP at
    50 TFLOP/s = 17.5 ms) dwarf its TP traffic (a few ms), so only the pipeline fill of each
    collective, 1/t of it, stays exposed. Forward: 2 AG/RS pairs; backward: 2 pairs + the 2
    SP all-gathers redone before the weight gradients. Embedding and head: one pair each,
    never overlapped."""
    gpu = flat_gpu(intra_gb=100.0)
    pair = _tp_one(100e9)
    ag = pair / 2
    plain = _estimate(gpu)
    overlapped = _estimate(gpu, tp_comm_overlap=True)
    assert plain.time_tp_comm_s == pytest.approx(L * (4 * pair + 2 * ag) + 2 * pair, rel=1e-6)
    expected = L * (2 * pair / T + (2 * pair + 2 * ag) / T) + 2 * pair
    assert overlapped.time_tp_comm_s == pytest.approx(expected, rel=1e-6)
    assert overlapped.time_compute_s == pytest.approx(plain.time_compute_s)


def test_tp_overlap_hides_at_most_the_gemm_time():
    """A slow fabric (0.1 GB/s): the TP traffic dwarfs the GEMMs, so overlap hides exactly the
    GEMM time: the forward GEMMs once and the backward GEMMs (2x) once per layer."""
    gpu = flat_gpu(intra_gb=0.1)
    gemm_fwd = 2 * S * LAYER_WEIGHTS / T / (100e12 * 0.5)
    plain = _estimate(gpu)
    overlapped = _estimate(gpu, tp_comm_overlap=True)
    hidden = plain.time_tp_comm_s - overlapped.time_tp_comm_s
    assert hidden == pytest.approx(L * 3 * gemm_fwd, rel=1e-6)


def test_tp_overlap_needs_sequence_parallelism():
    """Transformer Engine's userbuffers overlap works on the SP all-gather / reduce-scatter;
    without SP the all-reduces stay exposed."""
    model = llama_like()
    gpu = flat_gpu()
    lo = Layout(tp=T, pp=1, dp=1, mbs=1, zero=0, recompute="none", sp=False)
    cl = cluster(gpu, T)
    plain = estimate(model, cl, job(model, global_batch=1), lo)
    on = estimate(model, cl, job(model, global_batch=1, tp_comm_overlap=True), lo)
    assert on.time_tp_comm_s == pytest.approx(plain.time_tp_comm_s)


@pytest.mark.parametrize("vpp", [1, 2])
def test_p2p_overlap_only_under_interleaving(vpp):
    """pp = 4 stages on four 8-GPU nodes (dp = 8 inside each), 8 micro-batches: every send
    crosses a 10 GB/s NIC. Blocking sends: 2 per micro-batch chunk and per fill/drain hop,
    2 (m vpp + pp - 1); with overlap_p2p_comm under interleaving only the 2 (pp - 1) fill/drain
    hops remain (a chunk's compute, tens of ms, is longer than one send, ~7 ms)."""
    model = llama_like()
    gpu = flat_gpu(inter_gb=10.0)
    m, pp, dp = 8, 4, 8
    lo = Layout(tp=1, pp=pp, dp=dp, vpp=vpp, mbs=1, zero=1, recompute="full", sp=False)
    cl = cluster(gpu, pp * dp)
    blocking = estimate(model, cl, job(model, global_batch=m * dp, p2p_overlap=False), lo)
    overlap = estimate(model, cl, job(model, global_batch=m * dp), lo)
    send = S * H * 2 / 10e9  # one micro-batch's activation over one NIC
    assert blocking.time_pp_comm_s == pytest.approx(2 * (m * vpp + pp - 1) * send, rel=1e-6)
    expected = 2 * (pp - 1) * send if vpp > 1 else 2 * (m * vpp + pp - 1) * send
    assert overlap.time_pp_comm_s == pytest.approx(expected, rel=1e-6)
