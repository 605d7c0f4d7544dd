"""Rank order and node spans, checked against a brute-force construction of the groups."""

import pytest

from planner.layout import Layout, group_span_nodes, rank_coords


def _groups(layout: Layout, axis: str) -> list[list[int]]:
    """Brute force: ranks that agree on every coordinate but `axis`."""
    by_key: dict[tuple, list[int]] = {}
    for r in range(layout.num_gpus):
        c = rank_coords(r, layout)
        key = tuple(v for k, v in sorted(c.items()) if k != axis)
        by_key.setdefault(key, []).append(r)
    return list(by_key.values())


def test_str_reads_like_the_style_guide():
    assert (
        str(Layout(tp=8, pp=4, dp=4, mbs=1, zero=1, recompute="selective"))
        == "tp8-pp4-dp4-mbs1-z1-sel"
    )
    assert (
        str(Layout(tp=2, pp=2, dp=2, cp=2, vpp=3, mbs=2, sp=True))
        == "tp2-pp2-dp2-cp2-vpp3-mbs2-z0-none-sp"
    )


def test_rank_order_tp_innermost_pp_outermost():
    lay = Layout(tp=2, cp=2, dp=3, pp=2)
    # rank = tp + 2*(cp + 2*(dp + 3*pp)):
    # rank 1 is tp 1, rank 2 is cp 1, rank 4 is dp 1, rank 12 is pp 1
    assert rank_coords(1, lay) == {"tp": 1, "cp": 0, "dp": 0, "pp": 0}
    assert rank_coords(2, lay) == {"tp": 0, "cp": 1, "dp": 0, "pp": 0}
    assert rank_coords(4, lay) == {"tp": 0, "cp": 0, "dp": 1, "pp": 0}
    assert rank_coords(12, lay) == {"tp": 0, "cp": 0, "dp": 0, "pp": 1}
    coords = {tuple(rank_coords(r, lay).values()) for r in range(lay.num_gpus)}
    assert len(coords) == lay.num_gpus  # a bijection


@pytest.mark.parametrize(
    "tp,cp,dp,pp,per_node",
    [
        (8, 1, 4, 4, 8),
        (4, 1, 8, 2, 8),
        (2, 2, 4, 2, 8),
        (1, 1, 16, 1, 8),
        (8, 2, 2, 2, 4),
        (2, 1, 2, 2, 72),
    ],
)
def test_group_span_nodes_matches_brute_force(tp, cp, dp, pp, per_node):
    lay = Layout(tp=tp, cp=cp, dp=dp, pp=pp)
    for axis in ("tp", "cp", "dp", "pp"):
        worst = max(len({r // per_node for r in g}) for g in _groups(lay, axis))
        assert group_span_nodes(lay, axis, per_node) == worst, axis


def test_grad_accum():
    assert Layout(dp=8, mbs=2).grad_accum(512) == 32
