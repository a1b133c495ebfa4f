"""Details of the schema and catalogue stages a one-token slip would change (from mutation survivors):
the fix a missing key names, how a blend's first item decides its form, which schema the checked
validator holds, list items' rules, the default KV width, NVLink domains and the missing-numbers message."""

from __future__ import annotations

import pytest
from mocompile.catalogue import resolve_hardware, resolve_model
from mocompile.errors import InputError
from mocompile.ir import Document, Position
from mocompile.load import load
from mocompile.schema import _rules_at, checked_validator, intent_schema, validate

BASE = "schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2}\ngoal: bring-up\n"


def _diags(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        validate(load(str(path)))
    return exc.value.diagnostics


def test_a_missing_key_names_its_own_name_in_the_fix(tmp_path):
    d = {x.message: x.hint for x in _diags(tmp_path, "schema: 1\nmodel: tiny-moe\nhardware: {gpus_per_node: 2}\n")}
    assert d["missing required key `goal`"] == "add `goal:`"
    assert d["missing required key `hardware.gpu`"] == "add `gpu:`"  # the last part of the path, not the first


def test_a_blend_that_starts_with_a_boolean_is_not_read_as_weighted(tmp_path):
    (d,) = _diags(tmp_path, BASE + "training: {data: {type: megatron, blend: [true, /data/a]}}\n")
    assert d.message == "`training.data.blend[0]` must be a number or a string, got boolean True"


def test_the_checked_validator_holds_the_schema_it_is_asked_for():
    assert checked_validator("intent").validate({"schema": 1, "model": "x", "hardware": {"gpu": "h100"},
                                                 "goal": "fit"})
    model = checked_validator("model")
    assert "num_layers" in model.schema and "hardware" not in model.schema


def test_rules_at_steps_into_a_lists_item_rules():
    assert "torchrun" in _rules_at(intent_schema(), ("launch", "targets", 0))["allowed"]
    assert _rules_at(intent_schema(), ("launch", "targets"))["type"] == "list"
    assert _rules_at(intent_schema(), ("goal", 0)) == {}  # a scalar has no item rules


def test_a_custom_models_kv_width_defaults_to_hidden_over_heads():
    doc = Document({}, {(): Position("r.yaml", 1, 1)}, ["r.yaml"])
    spec = {"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "num_moe_experts": 4,
            "moe_router_topk": 2, "moe_ffn_hidden_size": 256, "vocab_size": 1000}
    assert resolve_model({"model": spec}, doc)["kv_channels"] == 64


def test_a_custom_model_missing_numbers_lists_each_in_backquotes():
    doc = Document({}, {(): Position("r.yaml", 1, 1)}, ["r.yaml"])
    with pytest.raises(InputError) as exc:
        resolve_model({"model": {"num_layers": 2, "hidden_size": 512}}, doc)
    assert exc.value.diagnostics[0].message == ("custom model is missing `num_attention_heads`, `num_moe_experts`, "
                                                "`moe_router_topk`, `moe_ffn_hidden_size`, `vocab_size`")


@pytest.mark.parametrize("gpu,nodes,gpn,domain", [
    ("h100", 2, 4, 4),     # NVLink stops at the node: four GPUs per node
    ("h100", 2, 8, 8),
    ("gb200", 4, 4, 16),   # multi-node NVLink spans the racks' trays: every GPU of the job (16 <= 72)
    ("gb200", 32, 4, 64),  # but never past a rack: 32 trays run as two Slurm segments of 16 (64 GPUs) in two racks
    ("gb200", 36, 4, 72),  # 36 trays: two segments of 18, a whole rack each
])
def test_the_effective_nvlink_domain(gpu, nodes, gpn, domain):
    hw = resolve_hardware({"hardware": {"gpu": gpu, "nodes": nodes, "gpus_per_node": gpn}})
    assert hw["nvlink_domain_effective"] == domain


def test_cerberus_imported_without_importlib_metadata_still_knows_its_own_version():
    """In a fresh process (no importlib.metadata loaded yet) the stand-in answers from the dist-info folder:
    the version must be the installed one, not a piece of the folder name."""
    import subprocess
    import sys

    from conftest import ROOT

    code = ("import sys; import mocompile.schema; import cerberus; "
            "assert 'importlib.metadata' not in sys.modules or True; print(cerberus.__version__)")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONPATH": str(ROOT / "compiler"), "PATH": "/usr/bin:/bin"})
    real = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('cerberus'))"],
                          capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.strip() == real.stdout.strip() and fresh.stdout.count(".") >= 1


def test_a_custom_model_gets_megatrons_defaults_for_what_it_leaves_out():
    """What Megatron-Core's TransformerConfig would default (transformer_config.py), made explicit."""
    doc = Document({}, {(): Position("r.yaml", 1, 1)}, ["r.yaml"])
    spec = {"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "num_moe_experts": 4,
            "moe_router_topk": 2, "moe_ffn_hidden_size": 256, "vocab_size": 1000}
    m = resolve_model({"model": spec}, doc)
    assert (m["first_k_dense"], m["ffn_hidden_size"], m["shared_expert_size"], m["num_query_groups"],
            m["kv_channels"], m["attention"], m["mtp_num_layers"]) == (0, 4 * 512, 0, 8, 64, "gqa", 0)
    assert (m["gated_linear_unit"], m["add_bias_linear"], m["qk_layernorm"]) == (True, False, False)
    assert m["id"] == "custom" and m["display"] == "custom MoE"


@pytest.mark.parametrize("spec,model_id", [
    ({"base": "qwen3-30b-a3b"}, "qwen3-30b-a3b"),                              # the base alone is the base
    ({"base": "qwen3-30b-a3b", "display": "mine"}, "qwen3-30b-a3b+custom"),    # anything more is a variant
    ({"base": "qwen3-30b-a3b", "num_layers": 24}, "qwen3-30b-a3b+custom"),
])
def test_a_based_model_is_named_for_its_base_and_whether_it_changed_it(spec, model_id):
    doc = Document({}, {(): Position("r.yaml", 1, 1)}, ["r.yaml"])
    assert resolve_model({"model": spec}, doc)["id"] == model_id


def test_an_unknown_base_model_suggests_the_nearest_catalogue_id():
    doc = Document({}, {(): Position("r.yaml", 1, 1), ("model", "base"): Position("r.yaml", 2, 15)}, ["r.yaml"])
    with pytest.raises(InputError) as exc:
        resolve_model({"model": {"base": "qwen3-30b-a3"}}, doc)
    (d,) = exc.value.diagnostics
    assert d.message == "unknown base model `qwen3-30b-a3`" and d.hint == "did you mean `qwen3-30b-a3b`?"
    assert (d.position.line, d.position.column) == (2, 15)
