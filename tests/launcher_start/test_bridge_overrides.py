"""The Megatron-Bridge KEY=VALUE overrides of every export as Bridge applies them
(training/utils/omegaconf_utils.py parse_hydra_overrides @ 067f987df03b: Hydra's
OverridesParser, then ConfigLoaderImpl._apply_overrides_to_config onto the config in OmegaConf
struct mode, where a key the structure lacks is refused). The structure is the export's own YAML
(ConfigContainer's sections; TransformerConfig fields under model.transformer as
BridgeGPTModelConfig holds them); the placement itself is checked against Megatron-LM's
GPTModelConfig fields below."""

from __future__ import annotations

import shlex

import pytest
import yaml

from planner.launchers import export_plan
from planner.launchers.nemo import OUTER_MODEL_FIELDS
from tests.launcher_start.plans import PLANS, launch_plan
from tests.launcher_start.sources import installed


def key_values(text: str) -> list[str]:
    line = next(ln for ln in text.splitlines()
                if ln.startswith("#   ") and "model.transformer." in ln)
    return shlex.split(line[4:])  # as the shell hands them to train.sh


@pytest.mark.skipif(not installed("hydra"), reason="hydra-core is not installed")
@pytest.mark.parametrize("name", list(PLANS))
def test_key_value_overrides_parse_and_apply_in_struct_mode(name):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    text = export_plan("nemo", launch_plan(name)).text
    words = key_values(text)
    tree = yaml.safe_load(text)
    cfg = OmegaConf.create(tree)
    OmegaConf.set_struct(cfg, True)
    parsed = OverridesParser.create().parse_overrides(overrides=words)
    assert len(parsed) == len(words)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
    # every override lands on the value the YAML form states
    got = OmegaConf.to_container(cfg)
    got["comm_overlap"].pop("_target_", None)
    tree["comm_overlap"].pop("_target_", None)
    assert got == tree


def test_model_fields_sit_where_bridges_builder_backed_config_holds_them():
    tree = yaml.safe_load(export_plan("nemo", launch_plan("moe-deepseek-v3-pp32")).text)
    model = tree["model"]
    assert set(model) - {"transformer"} <= OUTER_MODEL_FIELDS
    assert "num_layers" in model["transformer"] and "seq_length" in model
    assert "tensor_model_parallel_size" in model["transformer"]
    # a list (moe_layer_freq) is one word without spaces
    words = key_values(export_plan("nemo", launch_plan("moe-deepseek-v3-pp32")).text)
    freq = next(w for w in words if w.startswith("model.transformer.moe_layer_freq="))
    assert " " not in freq and freq.endswith("1]")
    assert tree["comm_overlap"]["_target_"].endswith("CommOverlapConfig")


def test_split_fields_are_all_written():
    # 126 layers on 16 x 8 chunks: the account-for flags, and nothing of the recipe's own split
    model = yaml.safe_load(export_plan("nemo", launch_plan("uneven-405b-pp16-vpp8")).text)
    transformer = model["model"]["transformer"]
    assert transformer["account_for_embedding_in_pipeline_split"] is True
    assert transformer["account_for_loss_in_pipeline_split"] is True
    assert transformer["pipeline_model_parallel_layout"] is None
    assert transformer["num_layers_in_first_pipeline_stage"] is None
    other = yaml.safe_load(export_plan("nemo", launch_plan("uneven-llama3-70b-18-22-21-19")).text)
    transformer = other["model"]["transformer"]
    assert transformer["pipeline_model_parallel_layout"] == "Et*18|t*22|t*21|t*19L"
    assert transformer["account_for_embedding_in_pipeline_split"] is False
