"""Megatron-LM pipeline splits, both ways: the arguments an export writes for a split, and the
split read from --pipeline-model-parallel-layout, the account-for flags and the first/last-stage
flags (Megatron's rules: transformer_block.py get_num_layers_to_build and
pipeline_parallel_layer_layout.py @ d98e8a64ddf3)."""

from __future__ import annotations

import pytest

from planner.errors import SpecError
from planner.launchers.common import Imported
from planner.launchers.megatron import (
    layout_string,
    parse_args_text,
    read_args,
    read_layout_string,
    split_args,
)


def read(text: str) -> Imported:
    return read_args(parse_args_text(text), Imported("megatron", "x.sh"))


def test_layout_strings_expand_as_megatron_expands_them():
    # NVIDIA's DeepSeek-V3 layout (Megatron-LM examples, MoE README): embedding + 1 layer,
    # 30 chunks of 2, then MTP and the loss: 32 chunks, 61 decoder layers
    chunks = read_layout_string("Et|(tt|)*30mL")
    assert len(chunks) == 32
    assert [c[1] for c in chunks] == [1] + [2] * 30 + [0]
    assert chunks[0] == (1, 1, 0) and chunks[-1] == (0, 0, 1)
    assert [c[1] for c in read_layout_string("Et*3|(tt|)*29,m|L")] == [3] + [2] * 29 + [0, 0]
    with pytest.raises(SpecError, match="characters"):
        read_layout_string("Ex|tL")


def test_layout_string_written_reads_back_to_its_chunks():
    for counts in ([7] + [8] * 14 + [7], [18, 22, 21, 19], [0] + [1] * 126 + [0], [1, 2, 2, 1, 1]):
        text = layout_string(counts)
        assert [c[1] for c in read_layout_string(text)] == counts
    assert layout_string([7, 8, 8, 7]) == "Et*7|(t*8|)*2t*7L"


def test_split_args_pick_megatrons_own_rule():
    # 126 layers on 16 x 8 chunks: (126 + 2) / 128 = 1 a chunk, the first and last one fewer
    assert split_args(126, 16, 8, [0] + [1] * 126 + [0]) == [
        ("--num-virtual-stages-per-pipeline-rank", 8),
        ("--account-for-embedding-in-pipeline-split", True),
        ("--account-for-loss-in-pipeline-split", True)]
    # 7, 8 x 14, 7 is (126 + 2) / 16 = 8 with the end stages one fewer
    assert split_args(126, 16, 1, [7] + [8] * 14 + [7])[-1] == (
        "--account-for-loss-in-pipeline-split", True)
    assert split_args(80, 4, 1, [20] * 4) == []
    assert split_args(80, 4, 1, [19, 21, 21, 19]) == [
        ("--decoder-first-pipeline-num-layers", 19), ("--decoder-last-pipeline-num-layers", 19)]
    assert split_args(80, 4, 1, [18, 22, 21, 19]) == [
        ("--pipeline-model-parallel-layout", "Et*18|t*22|t*21|t*19L")]


ARGS = ("--num-layers {L} --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
        "--max-position-embeddings 4096 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size {pp} ")


def test_account_for_flags_read_as_the_even_rule():
    got = read(ARGS.format(L=126, pp=16) + "--num-virtual-stages-per-pipeline-rank 8 "
               "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")
    assert got.pins["vpp"] == 8 and got.stage_layers == ()


def test_uneven_layouts_read_as_stage_layers_or_refused():
    got = read(ARGS.format(L=80, pp=4) + "--pipeline-model-parallel-layout 'Et*18|t*22|t*21|t*19L'")
    assert got.stage_layers == (18, 22, 21, 19) and got.pins["vpp"] == 1
    got = read(ARGS.format(L=80, pp=4) + "--decoder-first-pipeline-num-layers 17 "
               "--decoder-last-pipeline-num-layers 19")
    assert got.stage_layers == (17, 22, 22, 19)
    # DeepSeek-V3's layout on pp 16 is 2 chunks a rank with 1, 2 x 30, 0 layers (not the even
    # rule's 1, 2 x 29, 1, 1): read as layers per virtual stage, vpp = 32 chunks / pp 16
    got = read(ARGS.format(L=61, pp=16) + "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'")
    assert got.stage_layers == (1,) + (2,) * 30 + (0,) and got.pins["vpp"] == 2
    got = read(ARGS.format(L=61, pp=8) + "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'")
    assert got.stage_layers == (1,) + (2,) * 30 + (0,) and got.pins["vpp"] == 4
    assert not got.notes  # MTP with the loss: where the planner costs it
    got = read(ARGS.format(L=61, pp=16) + "--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'")
    assert got.stage_layers == (3,) + (2,) * 29 + (0, 0)
    assert any("virtual stage 30" in n for n in got.notes)  # MTP on rank 14: said
    # a pipeline rank with no layer, no embedding and no loss: refused, naming the split
    with pytest.raises(SpecError, match=r"1,0,59,1,0,0 \(pp 3 x vpp 2\)"):
        read(ARGS.format(L=61, pp=3) + "--pipeline-model-parallel-layout 'Et||t*59|t||L'")
    with pytest.raises(SpecError, match="not a multiple"):
        read(ARGS.format(L=61, pp=3) + "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'")
    with pytest.raises(SpecError, match="holds 61 decoder layers"):
        read(ARGS.format(L=60, pp=16) + "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'")


def test_sequence_parallel_at_tp1_is_switched_off_with_a_note():
    got = read(ARGS.format(L=32, pp=1).replace("parallel-size 2", "parallel-size 1")
               + "--sequence-parallel")
    assert got.pins["sp"] is False
    assert any("switches it off" in n for n in got.notes)


def _llama70b_uneven_script(tmp_path):
    """A Megatron-LM launch of a Llama-3-70B shape on 64 GPUs, pp 4 with NVIDIA's uneven layout
    string (18, 22, 21, 19 layers)."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py " + ARGS.format(
        L=80, pp=4).replace("--hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
                            "--max-position-embeddings 4096",
                            "--hidden-size 8192 --num-attention-heads 64 --seq-length 8192 "
                            "--max-position-embeddings 8192 --ffn-hidden-size 28672 "
                            "--group-query-attention --num-query-groups 8 --swiglu "
                            "--normalization RMSNorm --position-embedding-type rope "
                            "--untie-embeddings-and-output-weights --disable-bias-linear "
                            "--vocab-size 128256 --global-batch-size 256")
                        + "--pipeline-model-parallel-layout 'Et*18|t*22|t*21|t*19L'")
    return script


def test_estimate_config_costs_the_configs_own_split(tmp_path):
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    script = _llama70b_uneven_script(tmp_path)
    result = CliRunner().invoke(app, ["estimate", "--config", str(script), "--cluster", "H100",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stage_layers"] == [18, 22, 21, 19]


def test_solve_config_ranks_the_configs_own_split(tmp_path):
    """`solve --config` compares the config's layout with its own layers per stage (here NVIDIA's
    uneven layout on 4 stages): the config's step time is `estimate --config`'s, not the even
    rule's."""
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    script = _llama70b_uneven_script(tmp_path)
    runner = CliRunner()
    est = runner.invoke(app, ["estimate", "--config", str(script), "--cluster", "H100", "--json"])
    sol = runner.invoke(app, ["solve", "--config", str(script), "--cluster", "H100", "--top", "1",
                              "--json"])
    assert est.exit_code == 0 and sol.exit_code == 0, est.output + sol.output
    config = json.loads(sol.stdout)["config"]
    assert config["layout"]["stage_layers"] == [18, 22, 21, 19]
    assert config["step_time_s"] == json.loads(est.stdout)["step_time_s"]
