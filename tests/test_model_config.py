"""`model_config:` vendors a catalogue model's Hugging Face config.json: its architecture travels with the recipe.

The file is untrusted input read like a cluster profile (inside the project, size-limited, JSON errors
positioned, exit 2 without a traceback) and must describe the catalogue model the plan is for (HFC001 the
model type, HFC002 a number, HFC003 a model it cannot apply to). The compiler copies it byte for byte into
generated/<name>/hf_config/, the lock holds its sha256 (`check` catches a hand edit), train.py points
Bridge's recipe at it, and preflight RUN014 says what still needs the hub.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from mocompile.errors import InputError
from mocompile.pipeline import analyse, compile_recipe

# The fields of Qwen/Qwen3-30B-A3B's config.json that mocompile reads (the published values), plus a few others.
QWEN = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
        "mlp_only_layers": [], "decoder_sparse_step": 1, "vocab_size": 151936, "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16"}
RECIPE = ("schema: 1\nname: q\nmodel: qwen3-30b-a3b\nmodel_config: {path}\nhardware: {{gpu: h100, nodes: 2}}\n"
          "goal: throughput\nparallelism: {{tp: 1, pp: 1, ep: 16, etp: 1, cp: 1}}\n")


def _project(tmp_path: Path, config: dict | str | None = None, path: str = "hf/qwen3", recipe: str = RECIPE) -> Path:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "hf" / "qwen3").mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(QWEN if config is None else config, indent=2) + "\n"
    (tmp_path / "hf" / "qwen3" / "config.json").write_text(text)
    (tmp_path / "r.yaml").write_text(recipe.format(path=path))
    return tmp_path / "r.yaml"


def _error(path: Path):
    with pytest.raises(InputError) as exc:
        analyse(str(path))
    [d] = exc.value.diagnostics
    return d


# Emission: the copy, train.py's hook, the lock.

def test_the_config_is_copied_byte_for_byte_and_its_hash_locked(tmp_path):
    r = compile_recipe(str(_project(tmp_path)))
    assert not r.errors
    source = (tmp_path / "hf" / "qwen3" / "config.json").read_text()
    assert r.files["hf_config/config.json"] == source
    lock = json.loads(r.files["mocompile.lock.json"])
    mc = lock["model_config"]
    assert mc["sha256"] == hashlib.sha256(source.encode()).hexdigest() and mc["copy"] == "hf_config/config.json"
    assert mc["source"] == "hf/qwen3/config.json" and mc["matched"]["num_moe_experts"] == 128
    assert lock["requirements"]["hf_config"] is None  # nothing for the nodes' HF cache to hold


def test_train_py_hands_bridges_recipe_the_copy_for_exactly_that_model_id(tmp_path):
    r = compile_recipe(str(_project(tmp_path)))
    train = r.files["train.py"]
    sha = hashlib.sha256(r.files["hf_config/config.json"].encode()).hexdigest()
    assert f"HF_CONFIG = {{'model_id': 'Qwen/Qwen3-30B-A3B', 'file': 'hf_config/config.json', 'sha256': '{sha}'}}" \
        in train
    assert "    with vendored_hf_config():\n        cfg = qwen3_30b_a3b_pretrain_config()" in train
    assert 'if str(path_or_id) == HF_CONFIG["model_id"]:' in train  # only that id; every argument passed on
    assert 'cfg.model.hf_model_id = HF_CONFIG["model_id"]' in train


def test_without_model_config_train_py_is_unchanged():
    from conftest import ROOT

    r = compile_recipe(str(ROOT / "recipes" / "qwen3-30b-a3b-h100x16-hybridep.yaml"))
    assert "vendored_hf_config" not in r.files["train.py"] and "hf_config/config.json" not in r.files


def test_a_folder_or_the_file_itself_may_be_named(tmp_path):
    a = analyse(str(_project(tmp_path, path="hf/qwen3"))).plan
    b = analyse(str(_project(tmp_path, path="hf/qwen3/config.json"))).plan
    assert a.model["vendored_config"]["sha256"] == b.model["vendored_config"]["sha256"]


def test_the_alias_transformers_saves_is_read_too(tmp_path):
    cfg = {k: v for k, v in QWEN.items() if k != "num_experts"} | {"num_local_experts": 128}  # transformers 5
    assert not analyse(str(_project(tmp_path, cfg))).errors


# Untrusted input: each problem one message, exit 2.

def test_a_path_outside_the_project_is_refused(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text(json.dumps(QWEN))
    proj = tmp_path / "proj"
    proj.mkdir()
    d = _error(_project(proj, path="../outside"))
    assert d.rule == "INPUT" and "outside the project root" in d.message and d.position.line == 4


def test_a_missing_file_is_named(tmp_path):
    d = _error(_project(tmp_path, path="hf/nothing/config.json"))
    assert d.rule == "INPUT" and "missing file: hf/nothing/config.json" in d.message


def test_a_file_over_the_size_limit_is_refused(tmp_path):
    big = dict(QWEN, padding="x" * 300_000)
    assert _error(_project(tmp_path, big)).rule == "LIM001"


def test_malformed_json_is_positioned(tmp_path):
    d = _error(_project(tmp_path, '{\n  "model_type": "qwen3_moe",\n  "hidden_size": 2048,,\n}\n'))
    assert d.rule == "INPUT" and d.message.startswith("malformed JSON")
    # at the second comma
    assert d.position.file.endswith("hf/qwen3/config.json") and (d.position.line, d.position.column) == (3, 23)


@pytest.mark.parametrize("text", ["[1, 2]", '{"a": 1, "a": 2}'])
def test_json_that_is_not_one_object_with_unique_keys_is_refused(tmp_path, text):
    assert _error(_project(tmp_path, text)).rule == "INPUT"


def test_a_number_that_differs_names_the_field_and_both_values(tmp_path):
    d = _error(_project(tmp_path, dict(QWEN, moe_intermediate_size=1536)))
    assert d.rule == "HFC002"
    assert "`moe_intermediate_size` is 1536" in d.message and "moe_ffn_hidden_size 768" in d.message
    text = (tmp_path / "hf" / "qwen3" / "config.json").read_text()
    line = text.splitlines().index('  "moe_intermediate_size": 1536,') + 1
    assert d.position.file.endswith("config.json") and d.position.line == line  # the field's line in the file


def test_the_first_mismatch_is_reported(tmp_path):
    d = _error(_project(tmp_path, dict(QWEN, num_hidden_layers=94, hidden_size=4096)))
    assert "num_hidden_layers" in d.message and "94" in d.message and "48" in d.message


def test_a_missing_field_is_an_error_not_a_default(tmp_path):
    d = _error(_project(tmp_path, {k: v for k, v in QWEN.items() if k != "head_dim"}))
    assert d.rule == "HFC002" and "no `head_dim`" in d.message


def test_another_models_config_is_refused_by_model_type(tmp_path):
    d = _error(_project(tmp_path, dict(QWEN, model_type="deepseek_v3")))
    assert d.rule == "HFC001" and "`deepseek_v3`" in d.message and "`qwen3_moe`" in d.message


def test_the_architecture_bridge_dispatches_on_must_match(tmp_path):
    d = _error(_project(tmp_path, dict(QWEN, architectures=["Qwen3ForCausalLM"])))
    assert d.rule == "HFC001" and "Qwen3MoeForCausalLM" in d.message and "_validate_config" in d.message


def test_a_custom_model_has_no_hf_config_to_vendor(tmp_path):
    recipe = RECIPE.replace("model: qwen3-30b-a3b", "model: {{base: qwen3-30b-a3b, num_layers: 24}}")
    assert _error(_project(tmp_path, recipe=recipe)).rule == "HFC003"


def test_a_model_without_a_field_map_is_refused(tmp_path):
    recipe = RECIPE.replace("model: qwen3-30b-a3b", "model: kimi-k2").replace("nodes: 2", "nodes: 64")
    d = _error(_project(tmp_path, recipe=recipe))
    assert d.rule == "HFC003" and "no field map" in d.message


def test_the_cli_exits_2_with_the_rule_and_no_traceback(tmp_path):
    _project(tmp_path, dict(QWEN, vocab_size=152064))
    proc = run_cli("compile", "r.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "[HFC002]" in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr


# `check` and the writer: the copy is a generated file.

def test_check_fails_after_the_copy_is_edited_and_compile_will_not_overwrite_it(tmp_path):
    _project(tmp_path)
    assert run_cli("compile", "r.yaml", cwd=tmp_path).returncode == 0
    assert run_cli("check", "r.yaml", cwd=tmp_path).returncode == 0
    copy = tmp_path / "generated" / "q" / "hf_config" / "config.json"
    copy.write_text(copy.read_text().replace('"vocab_size": 151936', '"vocab_size": 151937'))
    proc = run_cli("check", "r.yaml", cwd=tmp_path)
    assert proc.returncode == 1 and "hf_config/config.json: edited" in proc.stdout
    proc = run_cli("compile", "r.yaml", cwd=tmp_path)
    assert proc.returncode == 1 and "EDITED" in proc.stdout + proc.stderr


def test_a_changed_source_file_makes_the_copy_stale_not_edited(tmp_path):
    _project(tmp_path)
    assert run_cli("compile", "r.yaml", cwd=tmp_path).returncode == 0
    _project(tmp_path, dict(QWEN, rope_theta=500000.0))  # a field mocompile does not plan with
    proc = run_cli("check", "r.yaml", cwd=tmp_path)
    assert proc.returncode == 1 and "hf_config/config.json: stale" in proc.stdout and "edited" not in proc.stdout
    assert run_cli("compile", "r.yaml", cwd=tmp_path).returncode == 0  # no --force needed
    assert run_cli("check", "r.yaml", cwd=tmp_path).returncode == 0


# Preflight RUN014.

def _preflight(tmp_path: Path, recipe: str = RECIPE) -> list[str]:
    _project(tmp_path, recipe=recipe)
    assert run_cli("compile", "r.yaml", cwd=tmp_path).returncode == 0
    proc = subprocess.run(["bash", str(tmp_path / "generated" / "q" / "preflight.sh")], capture_output=True,
                          text=True, timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                                                "HF_HUB_OFFLINE": "1",
                                                                "HF_HUB_CACHE": str(tmp_path / "empty")})
    return [ln for ln in (proc.stdout + proc.stderr).splitlines() if "RUN014" in ln]


def test_preflight_says_the_architecture_travels_and_nothing_else_needs_the_hub(tmp_path):
    lines = _preflight(tmp_path)
    assert lines[0].startswith("preflight: RUN014 the architecture of Qwen/Qwen3-30B-A3B travels with the recipe")
    assert "nothing else" in lines[1] and len(lines) == 2
    assert not any("not in the HF cache" in ln for ln in lines)  # offline with an empty cache: no failure


def test_preflight_fails_when_the_copy_is_not_the_locked_one(tmp_path):
    _preflight(tmp_path)
    copy = tmp_path / "generated" / "q" / "hf_config" / "config.json"
    copy.write_text(copy.read_text() + " ")
    proc = subprocess.run(["bash", str(tmp_path / "generated" / "q" / "preflight.sh")], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert proc.returncode != 0 and "RUN014" in proc.stderr and "is not the config of Qwen/Qwen3-30B-A3B" in proc.stderr


def test_preflight_still_reports_a_tokenizer_read_from_the_hub(tmp_path):
    recipe = RECIPE + "tokenizer: {{path: Qwen/Qwen3-30B-A3B}}\n"
    lines = _preflight(tmp_path, recipe)
    assert any("tokenizer.path 'Qwen/Qwen3-30B-A3B' still comes from the HF cache or the hub" in ln for ln in lines)
