"""Collective and point-to-point times (alpha-beta, vectorized over layouts).

Convention (the one nccl-tests reports, hardware-facts 2.2): busbw is the per-GPU,
per-direction bus bandwidth, and for a collective on n ranks

    all-reduce of S bytes:           each rank moves 2 S (n-1)/n  -> t = 2 S (n-1)/n / busbw
    all-gather / reduce-scatter (S = the full buffer): S (n-1)/n  -> t = S (n-1)/n / busbw
    all-to-all (S = one rank's send buffer):           S (n-1)/n  -> t = S (n-1)/n / busbw

(ring algorithm volumes, Patarasuk & Yuan 2009; seed 000/001: 2 S (N-1)/N per GPU).
busbw(S) is read from the profile's measured curve at the message size, so it already carries
the protocol and small-message efficiency; the latency term is NCCL's ring model
(tuning.cc, hardware-facts 2.4): base latency + per-step latency x ring steps, with the steps
that cross the network paying the inter-node latency (2(k-1) of the 2(n-1) all-reduce steps on
k nodes).

Tiers. A group stays on the scale-up fabric when all its members sit in one NVLink domain
(cluster.domain_gpus; 8 on a DGX, 72 on NVL72) and uses the intra-node curve. Otherwise it is
network-bound. The profile's inter-node curve is the per-GPU NIC tier (busbw when every ring
step crosses a NIC, ~24 GB/s on HDR); a group with g members per domain runs hierarchically
(NCCL: reduce-scatter inside the domain, all-reduce across domains on g NICs in parallel, each
carrying S/g, all-gather inside), so its busbw is min(intra(S), g x nics_per_gpu x inter(S/g)).
For g = 8 on DGX A100 that is 8 x 24 = 192 GB/s, the measured multi-node busbw (nccl #1576).
Point-to-point across domains uses one NIC: inter(S).
"""

from __future__ import annotations

import numpy as np

from planner.specs import ClusterSpec

US = 1e-6  # microseconds -> seconds


def members_per_domain(size, stride, domain: int):  # noqa: ANN001, ANN201 - numpy arrays
    """Members of one group inside one scale-up domain, for a group of `size` ranks spaced
    `stride` apart under the rank order of planner.layout (vectorized group_span_nodes)."""
    size = np.asarray(size)
    per = np.maximum(domain // np.maximum(stride, 1), 1)
    return np.minimum(per, size)


class Group:
    """Process groups along one axis, one per layout: `size` ranks spaced `stride` apart.
    Holds what every collective on it needs (members per domain, domains spanned, latencies)."""

    def __init__(self, cluster: ClusterSpec, size, stride) -> None:  # noqa: ANN001
        gpu = cluster.gpu
        self.cluster = cluster
        self.size = np.asarray(size, dtype=float)
        self.per_domain = members_per_domain(self.size, stride, cluster.domain_gpus).astype(float)
        self.domains = np.ceil(self.size / self.per_domain)
        self.crosses = self.domains > 1
        n = np.maximum(self.size, 1.0)
        self.frac = (n - 1) / n  # (n-1)/n of the ring volumes
        # NCCL ring latency per rank step: intra steps at the NVLink latency, steps that cross
        # domains at the network latency; base latency of the tier once per call
        base = np.where(
            self.crosses, gpu.inter_node.base_latency_us, gpu.intra_node.base_latency_us
        )
        self._base = base * US
        self._intra_lat = gpu.intra_node.latency_us * US
        self._inter_lat = gpu.inter_node.latency_us * US

    def latency(self, steps_per_rank: int):  # noqa: ANN201
        """Seconds of latency of one ring collective with steps_per_rank x (n-1) steps."""
        steps = steps_per_rank * (self.size - 1)
        inter = steps_per_rank * (self.domains - 1)
        return self._base + (steps - inter) * self._intra_lat + inter * self._inter_lat

    def busbw(self, nbytes):  # noqa: ANN001, ANN201
        """Achieved busbw (bytes/s) of a collective of `nbytes` on this group."""
        gpu = self.cluster.gpu
        intra = gpu.intra_node.busbw_bytes_per_s(nbytes)
        if not self.crosses.any():
            return intra
        nics = self.per_domain * gpu.nics_per_gpu
        inter = gpu.inter_node.busbw_bytes_per_s(np.asarray(nbytes) / self.per_domain) * nics
        return np.where(self.crosses, np.minimum(intra, inter), intra)


def all_reduce_time(group: Group, nbytes, calls=1):  # noqa: ANN001, ANN201
    """Seconds for `calls` all-reduces of `nbytes` each (0 on a group of one)."""
    t = 2.0 * nbytes * group.frac / group.busbw(nbytes) + group.latency(2)
    return np.where(group.size > 1, t * calls, 0.0)


def all_gather_time(group: Group, nbytes, calls=1):  # noqa: ANN001, ANN201
    """Seconds for `calls` all-gathers (or reduce-scatters) whose full buffer is `nbytes`."""
    t = nbytes * group.frac / group.busbw(nbytes) + group.latency(1)
    return np.where(group.size > 1, t * calls, 0.0)


reduce_scatter_time = all_gather_time  # same volume and steps per rank (ring)


def all_to_all_time(group: Group, nbytes, calls=1):  # noqa: ANN001, ANN201
    """Seconds for `calls` all-to-alls where each rank sends `nbytes` in all."""
    return all_gather_time(group, nbytes, calls)


def p2p_time(cluster: ClusterSpec, nbytes, crosses_nodes, calls=1):  # noqa: ANN001, ANN201
    """Seconds for `calls` point-to-point sends of `nbytes` (pipeline stage boundaries, CP ring),
    on the NVLink fabric or on one NIC."""
    gpu = cluster.gpu
    intra = gpu.intra_node.busbw_bytes_per_s(nbytes)
    inter = gpu.inter_node.busbw_bytes_per_s(nbytes)
    bw = np.where(crosses_nodes, np.minimum(intra, inter), intra)
    lat = (
        np.where(
            crosses_nodes,
            gpu.inter_node.base_latency_us + gpu.inter_node.latency_us,
            gpu.intra_node.base_latency_us + gpu.intra_node.latency_us,
        )
        * US
    )
    return (nbytes / bw + lat) * calls
