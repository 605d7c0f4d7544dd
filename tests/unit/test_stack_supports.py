"""What a stack's software can run (StackPreset.supports): nanotron has ZeRO-1 and no ZeRO-2/3
(its optimizer: nanotron helpers.py init_optimizer_and_grad_accumulator builds
ZeroDistributedOptimizer, optimizer-state sharding only), so its search leaves zero 2 and 3
out, a pin keeps its value, and estimate says so."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from planner.cli import app
from planner.layout import Layout
from planner.registry import load_model, parse_cluster
from planner.search import enumerate_layouts, search
from planner.specs import JobSpec
from planner.stacks import resolve_stack

MODEL, CLUSTER = load_model("llama3-8b"), parse_cluster("16xL40S")
BASE = JobSpec(seq_len=4096, global_batch=64)


def test_nanotron_supports_zero_0_and_1_only():
    nanotron, megatron = resolve_stack("nanotron"), resolve_stack("megatron-core")
    assert nanotron.supports == {"zero": [0, 1]} and megatron.supports == {}
    assert nanotron.job(BASE).layout_support == (("zero", (0, 1)),)
    assert megatron.job(BASE).layout_support == ()
    hash(nanotron.job(BASE))  # a JobSpec stays hashable (calibrate groups runs by it): no raise
    assert nanotron.unsupported(Layout(dp=16, zero=1)) == []
    assert "nanotron runs zero 0, 1 only, not zero=2" in nanotron.unsupported(
        Layout(dp=16, zero=2))[0]


def test_search_leaves_out_what_the_software_lacks():
    free = enumerate_layouts(MODEL, CLUSTER, resolve_stack("megatron-core").job(BASE))
    nano = enumerate_layouts(MODEL, CLUSTER, resolve_stack("nanotron").job(BASE))
    assert set(np.unique(free["zero"])) == {0, 1, 2, 3}
    assert set(np.unique(nano["zero"])) == {0, 1}
    # exactly the zero-0/1 rows of the same space (the recipe changes costs, not the structures)
    keep = np.isin(free["zero"], [0, 1])
    assert len(nano["zero"]) == int(keep.sum())
    for k in ("tp", "pp", "dp", "mbs", "recompute"):
        assert np.array_equal(np.asarray(nano[k]), np.asarray(free[k])[keep])
    plans = search(MODEL, CLUSTER, resolve_stack("nanotron").job(BASE), {}, top_k=5).plans()
    assert all(p.layout.zero in (0, 1) for p in plans)
    # a pin is the user's word: kept (and warned about by the CLI)
    pinned = enumerate_layouts(MODEL, CLUSTER, resolve_stack("nanotron").job(BASE), {"zero": 3})
    assert set(np.unique(pinned["zero"])) >= {3}


def test_estimate_warns_about_an_unsupported_knob():
    runner = CliRunner()
    args = ["estimate", "--model", "llama3-8b", "--cluster", "16xL40S", "--stack", "nanotron",
            "--tp", "1", "--pp", "1", "--global-batch", "64", "--seq-len", "4096", "--json"]
    bad = runner.invoke(app, [*args, "--zero", "3"])
    assert bad.exit_code == 0, bad.output
    assert "nanotron runs zero 0, 1 only, not zero=3" in bad.stderr
    good = runner.invoke(app, [*args, "--zero", "1"])
    assert good.exit_code == 0 and "runs zero" not in good.stderr


def test_the_exhaustive_oracle_leaves_out_what_the_software_cannot_run():
    """The oracle expands the space by the same rule as the CP-SAT search (it kept ZeRO 2 and 3
    for nanotron, so the two disagreed): the same rows, no zero above 1, the same ranking."""
    from planner.search.exhaustive import exhaustive_ranking, exhaustive_space

    job = resolve_stack("nanotron").job(BASE)
    result = search(MODEL, CLUSTER, job, {}, 10, even_stages=True)  # the oracle's even split
    oracle = exhaustive_space(MODEL, CLUSTER, job, {})
    assert len(oracle) == len(result.space) and int(oracle.knobs["zero"].max()) == 1
    ranked, _ = exhaustive_ranking(oracle, {}, 10)
    assert [oracle.layout(i) for i in ranked] == [result.space.layout(i) for i in result.indices]
