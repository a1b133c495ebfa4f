"""Fine-grained activation offload (recompute.offload_modules): what it moves off the GPU, what it costs per step,
where the memory ladder climbs it, and what train.py sets. Rules AOF001-AOF005 have their boundary cases in
tests/test_rule_boundaries.py; AOF001/AOF002 are compared with the real TransformerConfig in tests/stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from mocompile import memory, steptime
from mocompile.steptime import Candidate
from test_steptime import TOY, hw

H, Q, KVD, F = TOY["hidden_size"], TOY["num_attention_heads"] * TOY["kv_channels"], \
    TOY["num_query_groups"] * TOY["kv_channels"], TOY["moe_ffn_hidden_size"]


@pytest.mark.parametrize("offload,recompute,per_token", [
    (("core_attn", "attn_proj"), (), 2 * (Q + 2 * KVD) + 2 * Q),     # Q, K, V and the attention output, bf16
    (("core_attn", "attn_proj"), ("core_attn",), 2 * Q),              # recompute already drops Q, K, V
    (("attn_norm", "mlp_norm"), (), 4 * H),
    (("qkv_linear",), ("layernorm",), 0.0),                           # a recomputed norm keeps no output to move
    (("expert_fc1",), (), 2 * 2 * H),                                 # top-2 routed copies of the token (balanced)
    (("moe_act",), ("moe",), 0.0),                                    # `moe` replays the whole MoE layer
    ((), (), 0.0),
])
def test_offload_moves_the_inputs_each_module_keeps_for_backward(offload, recompute, per_token):
    """Bytes per token and layer (TOY: every layer MoE, top-2, force-balanced routing)."""
    assert memory.offloaded_bytes_per_token(TOY, True, offload, recompute) == per_token


def test_the_estimate_drops_exactly_the_offloaded_bytes_from_the_activations():
    c = dict(world_size=8, seq_length=1024, micro_batch_size=1, global_batch_size=64, optimizer="adam",
             moe_router_force_load_balancing=True)
    off = memory.Estimator(TOY, c)
    on = memory.Estimator(TOY, dict(c, offload_modules=["core_attn", "attn_proj"]))
    assert off._bytes_per_token((), False) - on._bytes_per_token((), False) == 2 * (Q + 2 * KVD) + 2 * Q
    assert off._bytes_per_token((), True) == on._bytes_per_token((), True)  # full recompute: nothing left to move


def _step(offload: tuple[str, ...], link: float) -> steptime.StepEstimate:
    batch = steptime.Batch(4096, 1, 64, force_balance=True, offload_modules=offload)
    return steptime.StepModel(TOY, hw(host_link_gbps=link), batch, 8).estimate(
        Candidate(1, 1, 1, 8, 1, 1, "alltoall", False, False, (None,) * 4, "none"))


def test_offload_traffic_is_free_under_compute_and_exposed_beyond_it():
    """Each micro-batch copies the offloaded bytes out and back over the host link; what its compute covers is
    free (a fast link), what it does not is exposed and named (a slow link); without offload there is no term."""
    none, fast, slow = _step((), 64.0), _step(("core_attn", "attn_proj"), 1e6), _step(("core_attn", "attn_proj"), 0.001)
    assert none.terms["act_offload"] == 0.0 and fast.terms["act_offload"] == 0.0
    assert fast.step_s == none.step_s
    # the GPU's micro-batch grows by it (the host's launch time runs beside the GPU's, so the step grows by at most it)
    assert slow.terms["act_offload"] > 0.0
    assert none.step_s < slow.step_s <= none.step_s + slow.terms["act_offload"] + 1e-9


def _explain(tmp_path: Path, text: str) -> dict:
    (tmp_path / "pyproject.toml").write_text("")
    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nname: r\n" + text)
    res = run_cli("explain", str(path), "--format", "json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


LONG = ("model: moonlight-16b-a3b\nhardware: {gpu: h100, nodes: 1}\ngoal: fit\n"
        "training: {seq_length: 10240, micro_batch_size: 1, global_batch_size: 64}\n"
        "parallelism: {tp: 1, pp: 1, ep: 8, cp: 1}\nrecompute: {granularity: none}\n")


def test_the_ladder_offloads_activations_before_the_optimizer(tmp_path):
    """Moonlight at 10k tokens with recompute pinned off does not fit 8 H100s (79.5 GiB); the ladder tries the
    attention inputs (75.5 GiB), then the expert MLP's too (59.3 GiB, fits) before any optimizer offload, sets
    NVTE_CPU_OFFLOAD_V1 as Bridge requires with TE >= 2.10, and names the exposed host-link time."""
    out = _explain(tmp_path, LONG)
    s = out["settings"]
    assert s["offload_modules"]["value"] == ["core_attn", "attn_proj", "expert_fc1", "moe_act"]
    assert s["fine_grained_activation_offloading"]["value"] is True
    assert s["optimizer_offload_fraction"]["value"] == 0.0
    assert "host-link traffic exposed" in s["offload_modules"]["reason"]
    reason = s["optimizer_state"]["reason"]
    assert reason.index("activation offload core_attn,attn_proj:") < reason.index("expert_fc1,moe_act:")
    assert "offload 0.25" not in reason  # it stopped at the first rung that fits
    assert out["env"]["NVTE_CPU_OFFLOAD_V1"]["value"] == "1"


def test_pinned_offload_reaches_train_py_and_without_te_is_refused(tmp_path):
    text = LONG.replace("seq_length: 10240", "seq_length: 8192").replace(
        "recompute: {granularity: none}", "recompute: {granularity: none, offload_modules: [attn_proj, core_attn]}")
    (tmp_path / "pyproject.toml").write_text("")
    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nname: r\n" + text)
    res = run_cli("compile", str(path), "-o", str(tmp_path / "gen"))
    assert res.returncode == 0, res.stdout + res.stderr
    train = (tmp_path / "gen" / "r" / "train.py").read_text()
    assert "model.fine_grained_activation_offloading = True" in train
    assert "model.offload_modules = ['core_attn', 'attn_proj']" in train  # Megatron-Core's order
    assert "'NVTE_CPU_OFFLOAD_V1': '1'" in train
    res = run_cli("lint", str(path), "--set", "versions.transformer_engine=none")
    assert res.returncode == 1 and "[AOF003]" in res.stdout


def test_mem001s_lever_count_names_activation_offload_when_that_is_the_rung_it_counted():
    """With the optimizer state, its offload and FSDP pinned, the only open rungs are activation offload: the
    count MEM001 quotes is for them, and the note says so (it named the pinned optimizer state)."""
    import sys

    from conftest import ROOT
    from mocompile.resolve import derived
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from anchor_intents import context_for

    ctx = context_for("schema: 1\nname: r\n" + LONG.replace(
        "global_batch_size: 64}", "global_batch_size: 64, optimizer_state: bf16-moments, optimizer_offload: 0}")
        .replace("cp: 1}", "cp: 1, fsdp: false}"))
    n, how = derived._lightest_lever_count(ctx, None)  # no plain count: no ratio
    assert n >= 8 and how == "recompute.offload_modules: [core_attn, attn_proj, expert_fc1, moe_act] (activation offload)"
