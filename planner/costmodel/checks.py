"""Structural checks of a layout against a model, cluster and job: readable reasons, empty when
the layout can run (memory is not checked here: a layout that does not fit is still estimated)."""

from __future__ import annotations

from planner.layout import Layout
from planner.specs import ClusterSpec, JobSpec, ModelSpec


def layout_violations(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout
) -> list[str]:
    """Every structural problem of `layout`, one readable line each."""
    out: list[str] = []
    lo = layout
    for name in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs"):
        if getattr(lo, name) < 1:
            out.append(f"{name}={getattr(lo, name)} must be at least 1")
    if out:
        return out
    if lo.zero not in (0, 1, 2, 3):
        out.append(f"zero={lo.zero} must be 0, 1, 2 or 3")
    if lo.recompute not in ("none", "selective", "full"):
        out.append(f"recompute='{lo.recompute}' must be none, selective or full")
    n = cluster.num_gpus
    if lo.num_gpus != n:
        out.append(
            f"tp*pp*dp*cp = {lo.tp}*{lo.pp}*{lo.dp}*{lo.cp} = {lo.num_gpus}, "
            f"but the cluster has {n} GPUs"
        )
    if lo.tp > cluster.domain_gpus:
        out.append(f"tp={lo.tp} exceeds the {cluster.domain_gpus} GPUs of one NVLink domain")
    a, kv = model.num_attention_heads, model.kv_heads
    if a % lo.tp:
        out.append(f"tp={lo.tp} does not divide the {a} attention heads")
    elif kv % lo.tp and lo.tp % kv:
        out.append(f"tp={lo.tp} neither divides nor is a multiple of the {kv} key/value heads")
    L = model.num_hidden_layers
    if lo.pp > L:
        out.append(f"pp={lo.pp} exceeds the {L} layers")
    if lo.vpp > 1:
        if lo.pp == 1:
            out.append(f"vpp={lo.vpp} needs pp > 1 (interleaving splits pipeline stages)")
        elif lo.pp * lo.vpp > L + 2:
            out.append(
                f"pp*vpp = {lo.pp * lo.vpp} model chunks exceed the {L} layers + 2 "
                "(embedding and loss may each take a chunk's slot)"
            )
    per_step = lo.mbs * lo.dp
    if job.global_batch % per_step:
        out.append(
            f"global batch {job.global_batch} is not divisible by mbs*dp = "
            f"{lo.mbs}*{lo.dp} = {per_step}"
        )
    if job.seq_len % lo.cp:
        out.append(f"cp={lo.cp} does not divide the sequence length {job.seq_len}")
    elif lo.cp > 1 and (job.seq_len // lo.cp) % 2:
        out.append(
            f"cp={lo.cp} needs an even chunk per rank (s/cp = {job.seq_len // lo.cp}; "
            "causal load balancing splits it in two)"
        )
    if lo.ep > 1:
        if not model.is_moe:
            out.append(f"ep={lo.ep} needs a mixture-of-experts model ({model.name} is dense)")
        else:
            if model.num_experts % lo.ep:
                out.append(f"ep={lo.ep} does not divide the {model.num_experts} experts")
            if (lo.dp * lo.cp) % lo.ep:
                out.append(f"ep={lo.ep} does not divide dp*cp = {lo.dp * lo.cp}")
    if lo.sp and lo.tp == 1:
        out.append("sequence parallelism (sp) needs tp > 1")
    return out
