"""A catalogue model at another size is the same architecture, in the plan and in train.py.

`model: {base: deepseek-v3, num_layers: 24}` used to become a custom model built by Bridge's generic
GPTModelProvider: standard attention where DeepSeek-V3 has MLA, an aux-loss router where it has sigmoid
scores with expert bias and 8 router groups, no attention sinks for GPT-OSS. The plan was costed for MLA;
train.py trained something else. Now:

- a base whose architecture the generic provider cannot build (MLA, hybrid attention, sinks/windows),
  changed only in its numbers (catalogue.RESIZABLE), keeps Bridge's recipe; train.py sets the numbers on
  its provider (the stack test builds them with the real Bridge: tests/stack/test_generated_recipes.py);
- a base the generic provider can build (Qwen3-MoE) stays a custom model: nothing to fetch from the hub;
- anything else that asks the generic provider for what it lacks is refused (MDL001), as is an expert
  count that group-limited routing cannot split (MDL002).
"""

from __future__ import annotations

import pytest
from conftest import run_cli
from mocompile.catalogue import resolve_model
from mocompile.emit.python_recipe import _resized
from mocompile.errors import InputError
from mocompile.ir import Document, Position
from mocompile.pipeline import compile_recipe


def _doc() -> Document:
    return Document({}, {(): Position("r.yaml", 1, 1), ("model",): Position("r.yaml", 2, 1),
                         ("model", "num_moe_experts"): Position("r.yaml", 2, 40),
                         ("model", "attention"): Position("r.yaml", 2, 30)}, ["r.yaml"])


def _model(spec: dict) -> dict:
    return resolve_model({"model": spec}, _doc())


def _refusal(spec: dict):
    with pytest.raises(InputError) as exc:
        _model(spec)
    (d,) = exc.value.diagnostics
    return d


@pytest.mark.parametrize("base", ["deepseek-v3", "kimi-k2", "moonlight-16b-a3b", "gpt-oss-120b", "qwen3-next-80b-a3b"])
def test_a_family_the_generic_provider_cannot_build_keeps_its_recipe_when_only_numbers_change(base):
    m = _model({"base": base, "num_layers": 8})
    assert m["bridge"]["recipe"], "Bridge's recipe for the base builds the provider"
    assert m["resized"] == {"from": base, "fields": {"num_layers": 8}} and m["num_layers"] == 8
    assert m["hf_id"], "the recipe reads the base's HF config"
    assert m["display"].endswith("resized (num_layers 8)")


def test_a_family_the_generic_provider_builds_stays_a_custom_model_with_nothing_to_fetch():
    m = _model({"base": "qwen3-30b-a3b", "num_layers": 12})
    assert m["bridge"]["recipe"] is None and m["hf_id"] is None and "resized" not in m


def test_restating_the_base_numbers_changes_nothing():
    m = _model({"base": "deepseek-v3", "num_layers": 61, "display": "mine"})
    assert "resized" not in m and m["bridge"]["recipe"] == "deepseek_v3_pretrain_config"


def test_changing_an_architecture_flag_of_an_mla_model_is_refused_not_built_as_standard_attention():
    d = _refusal({"base": "deepseek-v3", "add_bias_linear": True, "num_layers": 8})
    assert d.rule == "MDL001" and "attention `mla`" in d.message
    assert "(changing `add_bias_linear` leaves deepseek-v3's recipe)" in d.message
    d = _refusal({"base": "gpt-oss-120b", "add_bias_linear": False})
    assert d.rule == "MDL001" and "`softmax_sinks`" in d.message and "`sliding_window`" in d.message
    assert "change only the numbers Bridge's gpt-oss-120b recipe takes" in d.hint


def test_asking_for_standard_attention_and_router_is_a_custom_model_the_generic_provider_builds():
    m = _model({"base": "deepseek-v3", "attention": "gqa", "moe_router_score_function": "softmax"})  # deliberate
    assert m["bridge"]["recipe"] is None and m["attention"] == "gqa"


def test_standard_attention_alone_keeps_a_router_the_generic_provider_lacks():
    """DeepSeek-V3's sigmoid router with expert bias: the generic provider builds an aux-loss softmax router."""
    d = _refusal({"base": "deepseek-v3", "attention": "gqa"})
    assert d.rule == "MDL001" and "`sigmoid` router (with expert bias)" in d.message
    assert "moe_router_score_function: softmax" in d.hint


def test_a_resized_glm_keeps_bridges_glm_recipe():
    """GLM-4.5's only difference from the generic provider the catalogue names is its router; resized, it is
    built by GLM45Bridge (QKV bias and partial RoPE come along: tests/stack checks them)."""
    m = _model({"base": "glm-4.5-air", "num_layers": 24})
    assert m["bridge"]["recipe"] == "glm45_air_106b_pretrain_config" and m["resized"]["from"] == "glm-4.5-air"


def test_a_mapping_without_base_cannot_ask_for_mla():
    d = _refusal({"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "num_moe_experts": 8,
                  "moe_router_topk": 2, "moe_ffn_hidden_size": 512, "vocab_size": 1000, "attention": "mla"})
    assert d.rule == "MDL001" and "attention `mla`" in d.message
    assert (d.position.line, d.position.column) == (2, 30)  # at the key that asked for it
    assert "start from a catalogue model" in d.hint


@pytest.mark.parametrize("experts,ok", [(120, True), (124, False), (127, False), (128, True), (8, True)])
def test_deepseek_v3s_router_groups_must_divide_the_experts(experts, ok):
    """Megatron-Core's TransformerConfig: num_moe_experts % moe_router_num_groups == 0 (8 groups)."""
    spec = {"base": "deepseek-v3", "num_moe_experts": experts}
    if ok:
        assert _model(spec)["num_moe_experts"] == experts
    else:
        d = _refusal(spec)
        assert d.rule == "MDL002" and f"{experts} experts do not divide into deepseek-v3's 8 router groups" in d.message
        assert (d.position.line, d.position.column) == (2, 40)


@pytest.mark.parametrize("topk,ok", [(3, False), (4, True), (2, False), (8, True)])
def test_deepseek_v3s_top_k_must_reach_the_groups_each_token_keeps(topk, ok):
    """Megatron-Core's group_limited_topk scores a group by its top topk // group_topk experts: 0 below 4 (DeepSeek-V3
    keeps 4 of 8 groups), where every token keeps the same 4 groups (the real function shows it on CPU:
    tests/stack/test_group_routing.py). 4 is the boundary: one expert per kept group scores it."""
    spec = {"base": "deepseek-v3", "moe_router_topk": topk}
    if ok:
        assert _model(spec)["moe_router_topk"] == topk
        return
    with pytest.raises(InputError) as exc:
        resolve_model({"model": spec}, Document({}, {("model", "moe_router_topk"): Position("r.yaml", 3, 20)},
                                                ["r.yaml"]))
    (d,) = exc.value.diagnostics
    assert d.rule == "MDL004" and f"top-{topk} routing under deepseek-v3's group-limited router" in d.message
    assert "the experts of the other 4 never get a token" in d.message and d.hint == "use moe_router_topk >= 4"
    assert (d.position.line, d.position.column) == (3, 20)


def test_router_group_errors_come_together_and_a_router_without_groups_has_none():
    with pytest.raises(InputError) as exc:
        _model({"base": "deepseek-v3", "num_moe_experts": 100, "moe_router_topk": 2})
    assert [d.rule for d in exc.value.diagnostics] == ["MDL002", "MDL004"]
    assert _model({"base": "kimi-k2", "moe_router_topk": 2})["moe_router_topk"] == 2  # one group: no limit


def test_mla_query_groups_follow_resized_heads():
    """Megatron-Core's MLASelfAttention gives num_query_groups to TE's DotProductAttention as GQA groups, which asserts
    heads % groups == 0 at model build: DeepSeek-V3 resized to 8 heads kept 128 groups and failed on a GPU."""
    m = _model({"base": "deepseek-v3", "num_attention_heads": 8})
    assert (m["num_attention_heads"], m["num_query_groups"]) == (8, 8)
    assert m["resized"]["fields"] == {"num_attention_heads": 8, "num_query_groups": 8}
    assert m["resized"]["derived"] == ["num_query_groups"]
    assert _model({"base": "kimi-k2", "num_attention_heads": 16, "num_query_groups": 16})["num_query_groups"] == 16
    assert _model({"base": "deepseek-v3", "num_layers": 8})["num_query_groups"] == 128  # heads unchanged: as is


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_mla_query_groups_other_than_the_heads_are_refused(groups):
    d = _refusal({"base": "moonlight-16b-a3b", "num_attention_heads": 8, "num_query_groups": groups})
    assert d.rule == "MDL003" and f"num_query_groups must equal num_attention_heads (8), not {groups}" in d.message


def test_a_gqa_family_keeps_its_own_groups_when_heads_change():
    m = _model({"base": "gpt-oss-120b", "num_attention_heads": 32})
    assert m["num_query_groups"] == 8 and m["resized"]["fields"] == {"num_attention_heads": 32}


def test_a_single_group_router_takes_any_expert_count():
    assert _model({"base": "kimi-k2", "num_moe_experts": 300})["num_moe_experts"] == 300


def test_the_provider_gets_each_number_under_its_own_field_name():
    class P:  # the part of Plan _resized reads
        model = _model({"base": "deepseek-v3", "num_layers": 10, "first_k_dense": 2, "kv_channels": 64,
                        "shared_expert_size": 0, "mtp_num_layers": 0, "num_moe_experts": 64})
    got = {a["field"]: a["value"] for a in _resized(P)}  # type: ignore[arg-type]
    assert got == {
        "num_layers": 10, "num_moe_experts": 64,
        "v_head_dim": 64,                                # MLA: kv_channels is the value head width
        "moe_shared_expert_intermediate_size": None,     # no shared expert: Bridge's None, not 0
        "mtp_num_layers": None,                          # no MTP: Bridge's providers say None
        "moe_layer_freq": [0, 0] + [1] * 8,              # one entry per layer, the dense prefix first
    }
    assert all("deepseek-v3 resized" in a["comment"] for a in _resized(P))  # type: ignore[arg-type]

    class Q:
        model = _model({"base": "deepseek-v3", "num_attention_heads": 8})
    comments = {a["field"]: a["comment"] for a in _resized(Q)}  # type: ignore[arg-type]
    assert comments["num_query_groups"] == "model: follows num_attention_heads: MLA has no key/value groups (MDL003)"
    assert "the intent's number" in comments["num_attention_heads"]


def test_train_py_runs_the_base_recipe_then_sets_the_numbers(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    r = tmp_path / "r.yaml"
    r.write_text("schema: 1\nmodel: {base: deepseek-v3, num_layers: 16}\nhardware: {gpu: h100, nodes: 16}\n"
                 "goal: throughput\ntraining: {global_batch_size: 1024}\n")
    out = compile_recipe(str(r))
    assert not out.errors
    train = out.files["train.py"]
    assert "cfg = deepseek_v3_pretrain_config()" in train and "GPTModelProvider(" not in train
    assert "    model.num_layers = 16  # model: deepseek-v3 resized" in train
    assert "'num_layers': 16" in train  # in PLANNED: check_plan stops a run whose provider lost it


def test_the_cli_refuses_an_unbuildable_custom_model_with_exit_2(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    r = tmp_path / "r.yaml"
    r.write_text("schema: 1\nmodel: {base: moonlight-16b-a3b, qk_layernorm: false}\nhardware: {gpu: h100, nodes: 1}\n"
                 "goal: throughput\n")
    proc = run_cli("compile", str(r), cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text
    assert "r.yaml:2:" in text and "[MDL001]" in text and "attention `mla`" in text
    assert not (tmp_path / "generated").exists()


def test_a_vendored_config_is_the_bases_and_is_checked_against_the_base(tmp_path):
    """The recipe reads the base's config.json, then train.py sets the resized numbers: the file must describe the
    base (HFC002 against the base's numbers, not the resized ones)."""
    import json

    from conftest import ROOT

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "hf").mkdir()
    config = json.loads((ROOT / "recipes" / "bench" / "hf" / "deepseek-v3" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    r = tmp_path / "r.yaml"
    r.write_text("schema: 1\nmodel: {base: deepseek-v3, num_layers: 8}\nmodel_config: hf\n"
                 "hardware: {gpu: h100, nodes: 8}\ngoal: throughput\n")
    out = compile_recipe(str(r))
    assert not out.errors, [(d.rule, d.message) for d in out.errors]
    lock = json.loads(out.files["mocompile.lock.json"])
    assert lock["model_config"]["matched"]["num_layers"] == 61 and lock["model"]["resized"]["fields"] == {"num_layers": 8}
    config["num_hidden_layers"] = 8  # a config of the resized numbers is not the base's: the recipe would build that
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError) as exc:
        compile_recipe(str(r))
    assert exc.value.diagnostics[0].rule == "HFC002"


def test_an_mla_familys_query_projection_width_is_a_number_it_takes(tmp_path):
    """`q_lora_rank` is one of the numbers an MLA family's Bridge provider takes (catalogue.RESIZABLE), and the
    schema now accepts it in a model mapping (it answered "unknown key `model.q_lora_rank`"). On a family without MLA
    it is an architecture the generic provider lacks (MDL001), and the hint no longer offers it as a number to change."""
    (tmp_path / "pyproject.toml").write_text("")
    ok = tmp_path / "mla.yaml"
    ok.write_text("schema: 1\nname: r\nmodel: {base: deepseek-v3, num_layers: 16, q_lora_rank: 1024}\n"
                  "hardware: {gpu: h100, nodes: 4}\ngoal: throughput\n")
    r = compile_recipe(str(ok), out_rel=str(tmp_path / "gen"))
    assert not r.errors, [(d.rule, d.message) for d in r.errors]
    assert r.plan.model["resized"]["fields"] == {"num_layers": 16, "q_lora_rank": 1024}
    train = next(v for k, v in r.files.items() if k.endswith("train.py"))
    assert "model.q_lora_rank = 1024" in train
    d = _refusal({"base": "qwen3-30b-a3b", "q_lora_rank": 512})
    assert d.rule == "MDL001" and "`q_lora_rank`" in d.message and "q_lora_rank" not in d.hint


def test_a_custom_model_built_from_a_base_does_not_carry_the_base_s_name_alone():
    """`model: {base: qwen3-30b-a3b, num_layers: 12}` is a 12-layer custom model (the generic provider builds it):
    its name says so and what changed, where the base's name alone claimed the 30B model; a display the user gives
    is kept."""
    assert _model({"base": "qwen3-30b-a3b", "num_layers": 12})["display"] == \
        "custom MoE from Qwen3-30B-A3B (num_layers 12)"
    assert _model({"base": "qwen3-30b-a3b", "num_layers": 12, "display": "q30-slice"})["display"] == "q30-slice"
