"""Collective and point-to-point times (alpha-beta, vectorized over layouts).

Convention (the one nccl-tests reports, docs/hardware.md 2.2): busbw is the per-GPU,
per-direction bus bandwidth, and for a collective on n ranks

    all-reduce of S bytes:           each rank moves 2 S (n-1)/n  -> t = 2 S (n-1)/n / busbw
    all-gather / reduce-scatter (S = the full buffer): S (n-1)/n  -> t = S (n-1)/n / busbw
    all-to-all (S = one rank's send buffer):           S (n-1)/n  -> t = S (n-1)/n / busbw

(ring algorithm volumes, Patarasuk & Yuan 2009; seed 000/001: 2 S (N-1)/N per GPU).
busbw(S) is read from the profile's measured curve at the message size. The curves are
end to end (nccl-tests timings, latency included) at a reference group: one full node for the
intra-node curve (gpus_per_node ranks), two nodes for the inter-node one. Larger groups add
NCCL's per-step ring latency (tuning.cc, docs/hardware.md 2.4) for the ring steps beyond the
reference: 2(n-1) steps for an all-reduce on n ranks, of which 2(k-1) cross the network on k
domains. base_latency_us is already inside the curves and is charged only to point-to-point
sends, which are alpha-beta: base + one hop latency + S / the curve's plateau (p2p copies reach
~90% of the link, docs/hardware.md 2.2, close to the all-reduce plateau).

Tiers. A group stays on the scale-up fabric when all its members sit in one NVLink domain
(cluster.domain_gpus; 8 on a DGX, 72 on NVL72) and uses the intra-node curve. Otherwise it is
network-bound. The profile's inter-node curve is the per-GPU NIC tier (busbw when every ring
step crosses a NIC, ~24 GB/s on HDR); a group with g members per domain runs hierarchically
(NCCL: reduce-scatter inside the domain, all-reduce across domains on g NICs in parallel, each
carrying S/g, all-gather inside), so its busbw is min(intra(S), g x nics_per_gpu x inter(S/g)).
For g = 8 on DGX A100 that is 8 x 24 = 192 GB/s, the measured multi-node busbw (nccl #1576).
Point-to-point across domains uses one NIC.
"""

from __future__ import annotations

import numpy as np

from planner.specs import ClusterSpec, LinkProfile

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
        self._ref_ranks = gpu.gpus_per_node  # the intra-node curve's reference ring
        self._intra_lat = gpu.intra_node.latency_us * US
        self._inter_lat = gpu.inter_node.latency_us * US
        self._latency_cache: dict[int, np.ndarray] = {}

    def latency(self, steps_per_rank: int):  # noqa: ANN201
        """Seconds of ring latency beyond what the reference curves already contain, for a
        collective with steps_per_rank x (n-1) ring steps (2 for all-reduce, 1 otherwise)."""
        cached = self._latency_cache.get(steps_per_rank)
        if cached is None:
            cached = self._latency_cache[steps_per_rank] = self._ring_latency(steps_per_rank)
        return cached

    def _ring_latency(self, steps_per_rank: int):  # noqa: ANN202
        inter = steps_per_rank * (self.domains - 1)
        intra = steps_per_rank * (self.size - 1) - inter
        extra_intra = np.maximum(intra - steps_per_rank * (self._ref_ranks - 1), 0.0)
        extra_inter = np.maximum(inter - steps_per_rank * 1, 0.0)  # reference: two domains
        return extra_intra * self._intra_lat + extra_inter * self._inter_lat

    def busbw(self, nbytes):  # noqa: ANN001, ANN201
        """Achieved busbw (bytes/s) of a collective of `nbytes` on this group."""
        gpu = self.cluster.gpu
        intra = gpu.intra_node.busbw_bytes_per_s(nbytes)
        if not self.crosses.any():
            return intra * np.ones_like(self.size)
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
    """Seconds for `calls` all-to-alls where each rank sends `nbytes` in all, 1/n to each peer.

    Inside one domain: S (n-1)/n over the intra-node busbw. Across domains nothing aggregates
    (unlike a reduction), so the S (n-g)/n bound for other domains leaves through the rank's own
    NICs while S (g-1)/n moves on NVLink at the same time: the slower of the two."""
    gpu = group.cluster.gpu
    n = np.maximum(group.size, 1.0)
    intra = gpu.intra_node.busbw_bytes_per_s(nbytes)
    local = nbytes * (group.per_domain - 1) / n / intra
    if group.crosses.any():
        nic = gpu.inter_node.busbw_bytes_per_s(nbytes) * gpu.nics_per_gpu
        remote = nbytes * (n - group.per_domain) / n / nic
        t = np.where(group.crosses, np.maximum(local, remote), local)
    else:
        t = local
    t = t + group.latency(1)
    return np.where(group.size > 1, t * calls, 0.0)


def plateau_bytes_per_s(link: LinkProfile) -> float:
    """The highest busbw of a link's curve (large messages), bytes/s."""
    return max(y for _, y in link.busbw_gb_per_s.points) * 1e9


def p2p_time(cluster: ClusterSpec, nbytes, crosses_nodes, calls=1):  # noqa: ANN001, ANN201
    """Seconds for `calls` point-to-point sends of `nbytes` (pipeline stage boundaries, CP ring),
    on the NVLink fabric or on one NIC."""
    gpu = cluster.gpu
    intra = plateau_bytes_per_s(gpu.intra_node)
    inter = plateau_bytes_per_s(gpu.inter_node) * gpu.nics_per_gpu
    bw = np.where(crosses_nodes, min(intra, inter), intra)
    lat = (
        np.where(
            crosses_nodes,
            gpu.inter_node.base_latency_us + gpu.inter_node.latency_us,
            gpu.intra_node.base_latency_us + gpu.intra_node.latency_us,
        )
        * US
    )
    return (nbytes / bw + lat) * calls
