"""Hybrid attention (Qwen3-Next: Gated DeltaNet + gated full attention) in the memory estimate, counted from the
shapes of MCore 0.19.2's modules and checked against the rank probe of benchmarks/results/rankprobe-2026-11-27/call-h
(128-GPU plan, rank 0: TP1 PP1 EP128, Megatron counted 3,021,401,344 parameters)."""

from __future__ import annotations

import pytest
from mocompile import memory
from mocompile.catalogue import _defaults, models


def _next(**over):
    return _defaults(dict(models()["qwen3-next-80b-a3b"], id="qwen3-next-80b-a3b", **over))


def test_a_gdn_layer_and_a_gated_attention_layer_have_the_weights_of_their_mcore_shapes():
    """GDN (h 2048, 16 key / 32 value heads of 128, conv 4): in_proj 2048 x (2048 q + 2048 k + 4096 v + 4096 z
    + 32 beta + 32 alpha), conv1d 8192 x 4, dt_bias + A_log 2 x 32, out_norm 128, out_proj 4096 x 2048.
    Gated attention (16 q heads / 2 groups of 256): linear_qkv 2048 x (4096 q + 4096 gate + 2 x 512),
    linear_proj 4096 x 2048. Norm weights are not counted, as for every model."""
    m = _next()
    assert memory._gdn_params(m) == 2048 * 12352 + 8192 * 4 + 64 + 128 + 4096 * 2048 == 33_718_464
    assert memory._full_attention_params(m) == 2048 * 9216 + 4096 * 2048 == 27_262_976
    assert memory.full_attention_layers(m) == 12               # layers 4, 8, ..., 48
    assert memory._attention_params(m) == (12 * 27_262_976 + 36 * 33_718_464) / 48
    # a model without the hybrid keys is all full attention, ungated: unchanged
    assert memory.full_attention_layers(models()["qwen3-30b-a3b"]) == 48


def test_gdn_activations_follow_the_gdn_head_dims():
    """What the GDN layer keeps grows with its value heads (in_proj output, q/k repeated to the value heads,
    the WY matrix A, the gated output norm) and key dim; the full-attention layers do not see the change."""
    base = memory._gdn_act_bytes(_next(), ())
    assert base == 103_232
    wider_v = memory._gdn_act_bytes(_next(linear_num_value_heads=64), ())
    assert wider_v > base
    # 32 more value heads of 128, term by term: in_proj (v, z, beta, alpha), q and k repeated, v, g, beta, A,
    # the gate inputs, the output norm (o, normed o, z, product) and its rstd
    dv, hv = 128, 32
    assert wider_v - base == 2 * (2 * hv * dv + 2 * hv) + 2 * 2 * hv * 128 + 2 * hv * dv + 4 * hv + 2 * hv \
        + 2 * hv * memory.GDN_CHUNK + 2 * 4 * hv + 4 * 2 * hv * dv + 4 * hv
    assert memory._gdn_act_bytes(_next(linear_key_head_dim=256), ()) > base
    # per layer average: 36 GDN layers and 12 gated-attention layers
    m = _next()
    per = memory._act_bytes_per_token(m, True, (), False)
    assert memory._act_bytes_per_token(_next(linear_num_value_heads=64), True, (), False) - per \
        == pytest.approx((wider_v - base) * 36 / 48)
    # layernorm recompute drops the fused input norm's tensors, core_attn recompute does not reach a GDN layer
    assert memory._gdn_act_bytes(m, ("layernorm",)) == base - 4 * 2048
    assert memory._gdn_act_bytes(m, ("core_attn",)) == base


def test_the_output_gate_adds_its_slice_and_the_gated_product():
    m = _next()
    ungated = _next(attention_output_gate=False)
    q = 16 * 256
    d = memory._act_bytes_per_token(m, True, (), False) - memory._act_bytes_per_token(ungated, True, (), False)
    assert d == pytest.approx(4 * q * 12 / 48)
    assert memory._full_attention_params(m) - memory._full_attention_params(ungated) == 2048 * q
