"""MOE003 against the real Megatron-Core 0.19.2: the layer spec it builds from moe_layer_freq.

mocompile emits ``moe_layer_freq = [0] * first_k_dense + [1] * (num_layers - first_k_dense)`` for a model
with leading dense layers (emit/python_recipe.py). Megatron-Core's GPT block spec asserts that list's
length equals num_layers when the model is built (models/gpt/gpt_layer_specs.py), after the config passed:
so a first_k_dense beyond num_layers fails at model build on the GPUs unless MOE003 stops it here."""

from __future__ import annotations

import warnings

import pytest
from mocompile.rules.checks import CHECKS

pytestmark = pytest.mark.stack


def _spec(mcore, num_layers: int, first_k_dense: int):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs

    freq = [0] * first_k_dense + [1] * (num_layers - first_k_dense)  # what mocompile emits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = mcore.TransformerConfig(num_layers=num_layers, hidden_size=64, num_attention_heads=4, num_moe_experts=4,
                                      moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=freq,
                                      use_cpu_initialization=True)
        return get_gpt_decoder_layer_specs(cfg, use_transformer_engine=False)


@pytest.mark.parametrize("first_k_dense,builds", [(7, True), (8, True), (9, False)])
def test_megatron_core_builds_the_layer_spec_only_for_a_dense_prefix_within_the_model(mcore, first_k_dense, builds):
    if builds:
        spec = _spec(mcore, 8, first_k_dense)
        assert len(spec) == 8  # one spec per layer, the first first_k_dense of them dense
    else:
        with pytest.raises(AssertionError, match="Invalid length of moe_layer_pattern"):
            _spec(mcore, 8, first_k_dense)


@pytest.mark.parametrize("first_k_dense,fires", [(7, False), (8, True), (9, True)])
def test_moe003_refuses_what_fails_at_build_and_a_model_without_moe_layers(first_k_dense, fires):
    """At 9 Megatron-Core fails at model build (above); at 8 it builds an all-dense model, which is no
    MoE model to plan EP for, so MOE003 refuses it too; 7 leaves one MoE layer."""
    assert CHECKS["MOE003"]({"first_k_dense": first_k_dense, "num_layers": 8}) is fires
