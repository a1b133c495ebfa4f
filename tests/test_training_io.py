"""Issue 9 keys (training.data, training.eval, tokenizer, checkpoint, logging): bad input exits 2
at the key's position, each rule on both sides of its boundary, what train.py / preflight.sh /
slurm.sbatch get, and that YAML values reach Python and shell only escaped. No torch here: the
real-stack side is tests/stack/test_data_pipeline.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, RULE_BASE, overrides, run_cli
from mocompile.errors import InputError
from mocompile.pipeline import analyse
from mocompile.rules.checks import CHECKS, split_share

BASE = RULE_BASE.read_text()
REAL = "training: {seq_length: 2048, global_batch_size: 16, micro_batch_size: 1, train_iters: 10, " \
       "data: {type: megatron, blend: [/d/text_document]}}\ntokenizer: {path: /tok}\n"


def _recipe(tmp_path, extra: str, base: str = BASE) -> str:
    """The rule base with ``training:`` replaced by REAL-style text when ``extra`` brings its own."""
    text = base if "training:" not in extra else "\n".join(
        line for line in base.splitlines() if not line.startswith("training:")) + "\n"
    path = tmp_path / "r.yaml"
    path.write_text(text + extra)
    return str(path)


def _rules(sets: dict) -> list[str]:
    return [d.rule for d in analyse(str(RULE_BASE), overrides(sets)).diagnostics]


# ------------------------------------------------------------------ bad input: exit 2, positioned
BAD = [
    # (recipe text after the base, message fragment, where it must point: the first occurrence of this text)
    ("training: {train_iters: 10, data: mocky}\n", "`training.data` has an invalid value 'mocky'", "mocky"),
    ("training: {train_iters: 10, data: {type: webdataset, blend: [/d/x]}}\n",
     "`training.data.type` has unknown value 'webdataset'", "webdataset"),
    ("training: {train_iters: 10, data: {type: megatron}}\n", "missing required key `training.data.blend`", "data:"),
    ("training: {train_iters: 10, data: {type: megatron, blend: []}}\n", "needs at least 1 item(s), got 0", "[]"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [0.5, /d/a, /d/b]}}\n",
     "`training.data.blend[2]` must be a weight (a number), got '/d/b'", "/d/b"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [0.5, /d/a, 0.7]}}\n",
     "needs weight/prefix pairs (even length); got 3 items", "0.7"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [0, /d/a]}}\n",
     "`training.data.blend[0]`: weight must be > 0, got 0", "0, /d/a"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [1e-9, /d/a, /d/b]}}\n",
     "needs weight/prefix pairs (even length); got 3 items", "/d/b"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [/d/a, 2]}}\n",
     "`training.data.blend[1]` must be a dataset prefix (a path), got the number 2", "2]"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [/d/a.idx]}}\n",
     "`training.data.blend[0]` names a file ('/d/a.idx'); Megatron wants the prefix", "/d/a.idx"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [/d/a], split: '98,1,1,0'}}\n",
     "`training.data.split` has an invalid value '98,1,1,0'", "'98"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [/d/a], split: '0,0,0'}}\n",
     "`training.data.split` '0,0,0' gives every split weight 0", "'0,0,0'"),
    ("training: {train_iters: 10, data: {type: megatron, blend: [/d/a], cache: \"a\\nb\"}}\n",
     "`training.data.cache` has an invalid value 'a\\nb'", '"a'),
    ("training: {train_iters: 10, eval: {interval: 0}}\n", "`training.eval.interval` must be >= 1, got 0", "0}"),
    ("training: {train_iters: 10, eval: {iters: 0}}\n", "`training.eval.iters` must be >= 1, got 0", "0}"),
    ("tokenizer: {type: sentencepiece, path: /tok}\n", "`tokenizer.type` has unknown value 'sentencepiece'",
     "sentencepiece"),
    ("tokenizer: {vocab_size: 100}\n", "missing required key `tokenizer.path`", "tokenizer:"),
    ("tokenizer: {path: /tok, vocab_size: 0}\n", "`tokenizer.vocab_size` must be >= 1, got 0", "0}"),
    ("checkpoint: {save: 5}\n", "`checkpoint.save` must be a string, got integer 5", "5}"),
    ("checkpoint: {save: /c, interval: 0}\n", "`checkpoint.interval` must be >= 1, got 0", "0}"),
    ("checkpoint: {save: /c, format: zarr}\n", "`checkpoint.format` has unknown value 'zarr'", "zarr"),
    ("checkpoint: {save: /c, async: yes please}\n", "`checkpoint.async` must be true or false", "yes"),
    ("checkpoint: {save: /c, bogus: 1}\n", "unknown key `checkpoint.bogus`", "bogus"),
    ("logging: {interval: 0}\n", "`logging.interval` must be >= 1, got 0", "0}"),
    ("logging: {wandb: {name: run1}}\n", "missing required key `logging.wandb.project`", "wandb:"),
    ("logging: {tensorboard: \"tb\\u0001\"}\n", "`logging.tensorboard` has an invalid value", '"tb'),
    ("profile: {start: 4}\n", "missing required key `profile.end`", "profile:"),
    ("profile: {start: -1, end: 2}\n", "`profile.start` must be >= 0, got -1", "-1"),
    ("profile: {start: 1, end: 2, ranks: []}\n", "needs at least 1 item(s), got 0", "[]"),
    ("profile: {start: 1, end: 2, ranks: [-1]}\n", "`profile.ranks[0]` must be >= 0, got -1", "-1"),
    ("profile: {start: 1, end: 2, tool: nsys}\n", "unknown key `profile.tool`", "tool"),
]


@pytest.mark.parametrize("text,fragment,marker", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_input_exits_2_at_the_position(tmp_path, text, fragment, marker):
    path = _recipe(tmp_path, text)
    lines = open(path).read().splitlines()
    line = len(lines)  # every case is one line, the last
    column = lines[-1].index(marker) + 1
    with pytest.raises(InputError) as err:
        analyse(path)
    found = [d for d in err.value.diagnostics if fragment in d.message]
    assert found, [d.message for d in err.value.diagnostics]
    assert (found[0].position.line, found[0].position.column) == (line, column)
    proc = run_cli("lint", path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout
    assert f"r.yaml:{line}:{column}: error [SCHEMA]" in proc.stdout + proc.stderr


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -1.0, 0])
def test_blend_weights_must_be_finite_and_positive(weight):
    """Loading already refuses .nan/.inf (LIM rules); the blend check does not rely on it."""
    from mocompile.schema import _blend_problems
    assert [i for i, _, _ in _blend_problems([weight, "/d/a"])] == [0]
    assert _blend_problems([1e-9, "/d/a"]) == []


def test_every_blend_problem_is_reported_at_once(tmp_path):
    text = "training: {train_iters: 10, data: {type: megatron, blend: [0.5, /d/a.bin, x, 7]}}\n"
    path = _recipe(tmp_path, text)
    with pytest.raises(InputError) as err:
        analyse(path)
    assert [d.position.column for d in err.value.diagnostics] == [text.index(m) + 1 for m in ("/d/a.bin", "x,", "7]")]


# ------------------------------------------------------------------ rules on both sides of each clause
REAL_DATA = {"training.data": {"type": "megatron", "blend": ["/d/text_document"]}, "tokenizer": {"path": "/tok"}}


@pytest.mark.parametrize("rule,fails,passes", [
    # TOK001: tokenizer vocabulary vs the model's 32000 (tiny-moe).
    ("TOK001", {"tokenizer": {"path": "/t", "vocab_size": 32001}}, {"tokenizer": {"path": "/t", "vocab_size": 32000}}),
    ("TOK001", {"tokenizer": {"path": "/t", "vocab_size": 32001}}, {"tokenizer": {"path": "/t"}}),
    # TOK002: a real corpus needs a tokenizer; mock data does not.
    ("TOK002", {"training.data": REAL_DATA["training.data"]}, REAL_DATA),
    ("TOK002", {"training.data": REAL_DATA["training.data"]}, {"training.data": "mock"}),
    # DATA001: validation share 0 with evaluation on; a tiny share, or no evaluation, passes.
    ("DATA001", {**REAL_DATA, "training.data.split": "100,0,0", "training.eval.interval": 1},
     {**REAL_DATA, "training.data.split": "100,0.001,0", "training.eval.interval": 1}),
    ("DATA001", {**REAL_DATA, "training.data.split": "100,0,0", "training.eval.interval": 1},
     {**REAL_DATA, "training.data.split": "100,0,0"}),
    ("DATA001", {**REAL_DATA, "training.data.split": "'100'", "training.eval.interval": 1},
     {**REAL_DATA, "training.data.split": "100,1", "training.eval.interval": 1}),
    # CKPT001: load without save (warning); with save it is quiet.
    ("CKPT001", {"checkpoint": {"load": "/c"}}, {"checkpoint": {"load": "/c", "save": "/c"}}),
    ("CKPT001", {"checkpoint": {"load": "/c"}}, {"checkpoint": {"save": "/c"}}),
    # CKPT002 / CKPT003: async needs torch_dist and a save directory.
    ("CKPT002", {"checkpoint": {"save": "/c", "async": True, "format": "fsdp_dtensor"}},
     {"checkpoint": {"save": "/c", "async": True}}),
    ("CKPT002", {"checkpoint": {"save": "/c", "async": True, "format": "torch"}},
     {"checkpoint": {"save": "/c", "async": False, "format": "torch"}}),
    ("CKPT003", {"checkpoint": {"load": "/c", "async": True}}, {"checkpoint": {"load": "/c", "save": "/c", "async": True}}),
    # CKPT004: interval vs train_iters (10 in the rule base): 10 passes, 11 fails; no save, no finding.
    ("CKPT004", {"checkpoint": {"save": "/c", "interval": 11}}, {"checkpoint": {"save": "/c", "interval": 10}}),
    ("CKPT004", {"checkpoint": {"save": "/c", "interval": 11}}, {"checkpoint": {"load": "/c", "interval": 11}}),
    # CKPT005 / CKPT006: formats Bridge cannot use here, only when checkpoints are used at all.
    ("CKPT005", {"checkpoint": {"load": "/c", "save": "/c", "format": "fsdp_dtensor"}},
     {"checkpoint": {"format": "fsdp_dtensor"}}),
    ("CKPT006", {"checkpoint": {"pretrained": "/p", "format": "torch"}}, {"checkpoint": {"format": "torch"}}),
    ("CKPT006", {"checkpoint": {"save": "/c", "format": "torch_dcp"}}, {"checkpoint": {"save": "/c", "format": "torch_dist"}}),
    # LOG001: 10 iterations, interval 10 logs once, 11 never.
    ("LOG001", {"logging": {"interval": 11}}, {"logging": {"interval": 10}}),
    # PROF001-004 on the rule base (10 iterations, 2 GPUs): end - start >= 1, end <= 10, ranks 0..1, a trace folder.
    ("PROF001", {"profile": {"start": 4, "end": 4}}, {"profile": {"start": 4, "end": 5}}),
    ("PROF002", {"profile": {"start": 4, "end": 11}}, {"profile": {"start": 4, "end": 10}}),
    ("PROF003", {"profile": {"start": 4, "end": 6, "ranks": [0, 2]}}, {"profile": {"start": 4, "end": 6, "ranks": [0, 1]}}),
    ("PROF004", {"profile": {"start": 4, "end": 6}}, {"profile": {"start": 4, "end": 6}, "logging": {"tensorboard": "/tb"}}),
])
def test_rule_boundaries(rule, fails, passes):
    assert rule in _rules(fails)
    assert rule not in _rules(passes)


def test_rule_points_at_the_pinned_key(tmp_path):
    path = _recipe(tmp_path, "checkpoint:\n  save: /c\n  interval: 11\n")
    d = next(d for d in analyse(path).diagnostics if d.rule == "CKPT004")
    assert (d.position.line, d.position.column) == (12, 13) and d.severity == "warning"


def test_checks_read_missing_settings_as_not_configured():
    """The resolver tries candidates before these settings exist: the predicates must not raise."""
    cfg = analyse(str(RULE_BASE)).plan.values()
    for key in ("data_type", "split", "eval_interval", "tokenizer_type", "tokenizer_vocab_size", "save", "load",
                "save_interval", "ckpt_format", "async_save", "pretrained_checkpoint", "log_interval",
                "use_pytorch_profiler", "profile_step_start", "profile_step_end", "profile_ranks"):
        cfg.pop(key)
    for rule in ("TOK001", "TOK002", "DATA001", "CKPT001", "CKPT002", "CKPT003", "CKPT004", "CKPT005", "CKPT006",
                 "LOG001", "PROF001", "PROF002", "PROF003", "PROF004"):
        assert CHECKS[rule](cfg) is False, rule


@pytest.mark.parametrize("split,valid", [("969,30,1", 0.03), ("98,2,0", 0.02), ("1", 0.0), ("1,1", 0.5), ("", None)])
def test_split_share_reads_splits_as_megatron_core_does(split, valid):
    got = split_share(split, 1)
    assert got == valid if valid is None else abs(got - valid) < 1e-12


# ------------------------------------------------------------------ what the plan and explain say
def test_defaults_are_decisions_with_reasons():
    plan = analyse(str(RULE_BASE), overrides({**REAL_DATA, "checkpoint": {"save": "/c"}})).plan
    assert plan["split"] == "969,30,1" and plan.settings["split"].source == "default"
    assert plan["blend"] == [["/d/text_document"], None] and plan.settings["blend"].source == "user"
    assert plan["save_interval"] == 10 and "1000" in plan.settings["save_interval"].reason  # min(train_iters, 1000)
    assert plan["exit_signal_handler"] is True and plan["eval_iters"] == 0 and plan["load"] is None
    mock = analyse(str(RULE_BASE)).plan
    assert (mock["data_type"], mock["tokenizer_type"], mock["save"], mock["save_interval"]) == (
        "mock", "NullTokenizer", None, None)


def test_weighted_blend_splits_into_prefixes_and_weights():
    plan = analyse(str(RULE_BASE), overrides({**REAL_DATA, "training.data.blend": [0.7, "/w/t", 0.3, "/c/t"]})).plan
    assert plan["blend"] == [["/w/t", "/c/t"], [0.7, 0.3]]


def test_explain_prints_the_new_settings(tmp_path):
    path = _recipe(tmp_path, "checkpoint: {save: /ckpt, load: /ckpt}\n")
    proc = run_cli("explain", path)
    assert proc.returncode in (0, 1), proc.stderr
    for needle in ("save", "/ckpt", "save_interval", "tokenizer_type", "NullTokenizer", "exit_signal_handler"):
        assert needle in proc.stdout, needle


# ------------------------------------------------------------------ emission and escaping
NASTY = "/data/it's \"quoted\" $(touch pwned) `x` \\back; rm -rf ~"


def _compiled(tmp_path, extra: str) -> dict[str, str]:
    path = _recipe(tmp_path, extra)
    out = tmp_path / "out"
    proc = run_cli("compile", path, "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = out / "rule-base"
    return {f.name: f.read_text() for f in folder.iterdir()}


def _literal(tree: ast.Module, call: str, keyword: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == call:
            for kw in node.keywords:
                if kw.arg == keyword:
                    return ast.literal_eval(kw.value)
    raise AssertionError(f"{call}({keyword}=...) not in train.py")


def test_train_py_uses_bridge_configs_and_escapes_every_value(tmp_path):
    q = json.dumps(NASTY)
    files = _compiled(tmp_path, (
        f"training: {{train_iters: 10, global_batch_size: 16, data: {{type: megatron, blend: [0.5, {q}, 0.5, /b/t], "
        f"split: '90,10,0', cache: {q}}}, eval: {{interval: 5, iters: 3}}}}\n"
        f"tokenizer: {{path: {q}}}\ncheckpoint: {{save: {q}, load: {q}, interval: 5, async: true, pretrained: {q}}}\n"
        f"logging: {{interval: 2, tensorboard: {q}, wandb: {{project: {q}, entity: team}}}}\n"))
    tree = ast.parse(files["train.py"])
    assert _literal(tree, "GPTDatasetConfig", "blend") == ([NASTY, "/b/t"], [0.5, 0.5])
    assert _literal(tree, "GPTDatasetConfig", "split") == "90,10,0"
    assert _literal(tree, "GPTDatasetConfig", "path_to_cache") == NASTY
    assert _literal(tree, "TokenizerConfig", "tokenizer_type") == "HuggingFaceTokenizer"
    assert _literal(tree, "TokenizerConfig", "tokenizer_model") == NASTY
    for kw, want in (("save", NASTY), ("load", NASTY), ("save_interval", 5), ("ckpt_format", "torch_dist"),
                     ("async_save", True), ("pretrained_checkpoint", NASTY)):
        assert _literal(tree, "CheckpointConfig", kw) == want, kw
    for kw, want in (("log_interval", 2), ("tensorboard_dir", NASTY), ("wandb_project", NASTY),
                     ("wandb_exp_name", "rule-base"), ("wandb_entity", "team")):
        assert _literal(tree, "LoggerConfig", kw) == want, kw
    assert (_literal(tree, "ValidationConfig", "eval_interval"), _literal(tree, "ValidationConfig", "eval_iters")) == (5, 3)
    assert _literal(tree, "TrainingConfig", "exit_signal_handler") is True
    assert "MockGPTDatasetConfig" not in files["train.py"] and "NullTokenizer" not in files["train.py"]
    # Shell: the sbatch only echoes the paths, quoted; bash -n passes and running the echo prints them verbatim.
    sbatch = files["slurm.sbatch"]
    assert "#SBATCH --requeue" in sbatch and "#SBATCH --open-mode=append" in sbatch
    echo = [line for line in sbatch.splitlines() if line.startswith('echo "mocompile: checkpoint.save')][0]
    proc = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, cwd=tmp_path)
    assert proc.stdout == f"mocompile: checkpoint.save: {NASTY}\n" and not (tmp_path / "pwned").exists()
    # Preflight: values are Python literals inside a quoted heredoc.
    pre = files["preflight.sh"]
    assert f"WRITABLE = {[(NASTY, 'checkpoint.save'), (NASTY, 'training.data.cache'), (NASTY, 'logging.tensorboard')]!r}" in pre
    assert subprocess.run(["bash", "-n"], input=pre, text=True).returncode == 0


def test_mock_recipes_keep_their_train_py_lines(tmp_path):
    files = _compiled(tmp_path, "")
    text = files["train.py"]
    assert "dataset = MockGPTDatasetConfig(" in text and 'split="99990,8,2"' in text
    assert 'TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=32000)' in text
    assert "checkpoint = CheckpointConfig(save=None, load=None)" in text and "logger = LoggerConfig(log_interval=1)" in text
    assert "ValidationConfig(eval_iters=0, eval_interval=None)  # mock data: no evaluation" in text
    assert "    GPTDatasetConfig,\n" not in text and "exit_signal_handler" not in text
    assert "RUN006" not in files["preflight.sh"] and "--requeue" not in files["slurm.sbatch"]


# ------------------------------------------------------------------ preflight, without the real stack
def _preflight(files: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    script = tmp_path / "preflight.sh"
    script.write_text(files["preflight.sh"])
    env = dict(os.environ, PYTHON=sys.executable, CUDA_DEVICE_MAX_CONNECTIONS="8")
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)


def test_preflight_names_missing_dataset_files_unwritable_dirs_and_the_resume_point(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"")
    (data / "a.idx").write_bytes(b"")
    (data / "b.bin").write_bytes(b"")  # b.idx missing
    blocker = tmp_path / "file"
    blocker.write_text("a regular file, not a directory")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest_checkpointed_iteration.txt").write_text("500\n")
    files = _compiled(tmp_path, (
        f"training: {{train_iters: 10, data: {{type: megatron, blend: [{data / 'a'}, {data / 'b'}]}}}}\n"
        f"tokenizer: {{path: /tok}}\n"
        f"checkpoint: {{save: {blocker / 'ckpt'}, load: {ckpt}, pretrained: {tmp_path / 'nothing'}}}\n"))
    proc = _preflight(files, tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    assert f"RUN006 dataset file {str(data / 'b') + '.idx'!r} is missing or unreadable" in err
    assert str(data / "a") + ".bin" not in err and str(data / "b") + ".bin" not in err
    assert f"RUN008 checkpoint.save directory {str(blocker / 'ckpt')!r} is not writable" in err
    assert f"RUN009 pretrained checkpoint {str(tmp_path / 'nothing')!r} does not exist" in err
    assert f"RUN009 resume from iteration 500 in {str(ckpt)!r}" in proc.stdout
    assert "RUN007" in err  # /tok is not a tokenizer (or transformers is absent here): either way a finding


def test_preflight_says_when_there_is_no_resume_point(tmp_path):
    files = _compiled(tmp_path, f"checkpoint: {{save: {tmp_path / 'c'}, load: {tmp_path / 'c'}}}\n")
    proc = _preflight(files, tmp_path)
    assert f"RUN009 no checkpoint in {str(tmp_path / 'c')!r}: training starts at iteration 0" in proc.stdout
    assert "RUN008" not in proc.stderr and (tmp_path / "c").is_dir()  # created, probed, probe removed
    assert list((tmp_path / "c").iterdir()) == []


def test_recipe_for_real_tokens_compiles_clean():
    result = analyse(str(ROOT / "recipes" / "tiny-moe-real-data.yaml"))
    assert [d.rule for d in result.diagnostics] == []
    assert result.plan["data_type"] == "megatron" and result.plan["save"] and result.plan["load"] is None  # CKPT007


@pytest.mark.parametrize("te,fires", [("none", True), ("2.12.0", False)])
def test_resume_without_transformer_engine_is_refused(te, fires):
    """Seen on 2xH100: megatron-core 0.19.2 cannot load the distributed optimizer's state without TE."""
    sets = {"versions.transformer_engine": te, "checkpoint": {"save": "/c", "load": "/c"}, "moe.grouped_gemm": False}
    assert ("CKPT007" in _rules(sets)) is fires
    assert "CKPT007" not in _rules({**sets, "checkpoint": {"save": "/c"}})  # saving alone is fine
    assert "CKPT007" not in _rules({**sets, "versions.megatron_core": "0.20.0"})  # only the version it was seen on


def test_profile_emits_bridge_profiling_config(tmp_path):
    """profile: becomes Bridge's ProfilingConfig (PyTorch profiler) with the user's steps and ranks."""
    files = _compiled(tmp_path, "profile: {start: 6, end: 9, ranks: [1], shapes: true}\nlogging: {tensorboard: /tb}\n")
    tree = ast.parse(files["train.py"])
    for kw, want in (("use_pytorch_profiler", True), ("profile_step_start", 6), ("profile_step_end", 9),
                     ("profile_ranks", [1]), ("pytorch_profiler_collect_shapes", True)):
        assert _literal(tree, "ProfilingConfig", kw) == want, kw
    assert "cfg.profiling = ProfilingConfig(" in files["train.py"]
    (tmp_path / "plain").mkdir()
    plain = _compiled(tmp_path / "plain", "")["train.py"]
    assert "ProfilingConfig" not in plain  # no profile: Bridge's default (no profiler) stays untouched
