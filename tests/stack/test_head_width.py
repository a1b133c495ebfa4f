"""PAR015 against the real Megatron-Core 0.19.2: the head width it takes when none is given.

Megatron-Core's ``TransformerConfig`` fills ``kv_channels`` with ``hidden_size // num_attention_heads`` when it is
None and raises nothing when the division leaves a remainder, so a custom model with 1000 hidden and 16 heads trains
with 62-wide heads (992-wide attention) without a word. mocompile fills the same floor for a model that states no
``kv_channels`` (catalogue.py) and warns with PAR015 exactly where Megatron-Core floors."""

from __future__ import annotations

import warnings

import pytest
from mocompile.rules.checks import CHECKS

pytestmark = pytest.mark.stack


def _kv_channels(mcore, hidden: int, heads: int) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = mcore.TransformerConfig(num_layers=2, hidden_size=hidden, num_attention_heads=heads,
                                      use_cpu_initialization=True)
    return int(cfg.kv_channels)


@pytest.mark.parametrize("hidden,heads,floored", [(1000, 16, True), (1024, 16, False), (1001, 8, True),
                                                  (1001, 11, False)])
def test_megatron_core_floors_the_head_width_silently_and_par015_fires_exactly_there(mcore, hidden, heads, floored):
    kv = _kv_channels(mcore, hidden, heads)
    assert kv == hidden // heads  # Megatron-Core's default, remainder or not (no error, no warning)
    assert (kv * heads != hidden) is floored
    cfg = {"hidden_size": hidden, "num_attention_heads": heads, "kv_channels": kv, "multi_latent_attention": False}
    assert CHECKS["PAR015"](cfg) is floored
