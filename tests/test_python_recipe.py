"""The values train.py prints (compiler/mocompile/emit/python_recipe.py), each derived from its rule."""

from __future__ import annotations

import pytest
from mocompile.emit import python_recipe
from mocompile.pipeline import analyse

HEAD = "schema: 1\nhardware: {gpu: h100, gpus_per_node: 2}\ngoal: bring-up\n"


def _ctx(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + text)
    r = analyse(str(path))
    assert not r.errors, [d.message for d in r.errors]
    return python_recipe.context(r.plan, "recipes/r.yaml"), r.plan


@pytest.mark.parametrize("iters,warmup", [(5, 1), (100, 10), (4999, 499), (5000, 500), (100000, 500)])
def test_warmup_is_a_tenth_of_training_between_1_and_500_steps(tmp_path, iters, warmup):
    c, _ = _ctx(tmp_path, f"model: tiny-moe\ntraining: {{train_iters: {iters}}}\n")
    assert c["warmup"] == warmup


def test_a_custom_model_lists_its_dense_layers_first_in_moe_layer_freq(tmp_path):
    c, _ = _ctx(tmp_path, "model: {base: tiny-moe, num_layers: 8, first_k_dense: 2}\n")
    args = {a["field"]: a["value"] for a in c["custom_model"]}
    assert args["moe_layer_freq"] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert args["attention_dropout"] == 0.0 and args["hidden_dropout"] == 0.0  # pretraining: no dropout
    c, _ = _ctx(tmp_path, "model: {base: tiny-moe, num_layers: 8}\n")
    assert {a["field"]: a["value"] for a in c["custom_model"]}["moe_layer_freq"] == 1  # every layer MoE


def test_the_layer_spec_follows_transformer_engine(tmp_path):
    with_te, _ = _ctx(tmp_path, "model: {base: tiny-moe, num_layers: 8}\nversions: {transformer_engine: '2.12.0'}\n")
    without, _ = _ctx(tmp_path, "model: {base: tiny-moe, num_layers: 8}\nversions: {transformer_engine: none}\n")
    assert with_te["layer_spec"] == "default_layer_spec" and without["layer_spec"] == "local_layer_spec"
    local = {a["field"]: a["value"] for a in without["custom_model"]}
    assert local["transformer_impl"] == "local" and local["bias_activation_fusion"] is False
    assert "transformer_impl" not in {a["field"] for a in with_te["custom_model"]}


def test_only_a_flex_dispatcher_gets_a_flex_comment(tmp_path):
    flex, plan = _ctx(tmp_path, "model: tiny-moe\nmoe: {dispatcher: deepep}\n")
    assert plan["moe_token_dispatcher_type"] == "flex" and flex["flex_backend"] == "deepep"
    assert flex["flex_comment"].startswith("user: pinned in the recipe")
    plain, _ = _ctx(tmp_path, "model: tiny-moe\nmoe: {dispatcher: alltoall}\n")
    assert plain["flex_backend"] is None and plain["flex_comment"] == ""
