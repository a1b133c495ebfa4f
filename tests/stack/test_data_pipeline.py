"""Real tokens on CPU: the generated recipe's data, tokenizer and checkpoint settings, taken by
the real Megatron-Bridge 0.6.2 / Megatron-Core 0.19.2 (issue 9).

A BPE tokenizer is trained with ``tokenizers`` on this project's own text and a Megatron indexed
dataset is written with Megatron-Core's ``IndexedDatasetBuilder`` (``tiny_corpus.py``). The
recipe ``recipes/tiny-moe-real-data.yaml`` is compiled with its paths pointed there; then, in a
child process (the TE import shim, a faked H100, as ``bridge_validate.py`` does):
``build_config()`` -> Bridge's ``runtime_config_update`` -> Bridge's ``build_tokenizer`` ->
Bridge's own dataset provider builds the train and validation ``GPTDataset``s. The generated
``preflight.sh`` is run for real against the same files, and against broken copies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.stack

STACK = Path(__file__).resolve().parent
ROOT = STACK.parent.parent
RECIPE = ROOT / "recipes" / "tiny-moe-real-data.yaml"

DRIVER = textwrap.dedent('''
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from bridge_validate import _ensure_te_shim, _load_module, fake_gpu
    _ensure_te_shim()
    os.environ.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    out = {}
    with fake_gpu("h100"):
        from megatron.bridge.training.config import runtime_config_update
        from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
        from megatron.bridge.training.setup import _validate_and_set_vocab_size
        from megatron.bridge.data.loaders import get_train_valid_test_num_samples
        from megatron.bridge.data.utils import get_dataset_provider
        cfg = _load_module(sys.argv[2]).build_config()
        runtime_config_update(cfg)  # Bridge's checks, GPTDatasetConfig.finalize() included
        tokenizer = build_tokenizer(cfg.tokenizer)
        vocab, pad = _validate_and_set_vocab_size(cfg.model.vocab_size, tokenizer.vocab_size, False)
        cfg.dataset.tokenizer = tokenizer  # what Bridge's setup() does next
        samples = get_train_valid_test_num_samples(cfg)
        train, valid, test = get_dataset_provider(cfg.dataset)(samples, cfg.dataset)
        first = train[0]
        out = {
            "dataset_config": type(cfg.dataset).__name__, "blend": cfg.dataset.blend,
            "split_matrix": cfg.dataset.split_matrix, "tokenizer_vocab": tokenizer.vocab_size,
            "eod": tokenizer.eod, "model_vocab": vocab, "samples": list(samples),
            "train_type": type(train).__name__, "train_len": len(train),
            "valid_len": None if valid is None else len(valid), "test": test is None,
            "tokens": first["tokens"].tolist(), "labels": first["labels"].tolist(),
            # EOD shows wherever a sample spans a document boundary; one sample may fall inside a long
            # paragraph of the corpus (the project's own docs), so look at the first 16
            "eod_samples": sum(tokenizer.eod in train[i]["tokens"].tolist() for i in range(16)),
            "text": tokenizer.detokenize(first["tokens"].tolist()),
            "save": cfg.checkpoint.save, "load": cfg.checkpoint.load, "save_interval": cfg.checkpoint.save_interval,
            "ckpt_format": cfg.checkpoint.ckpt_format, "tensorboard_dir": cfg.logger.tensorboard_dir,
            "eval_interval": cfg.validation.eval_interval, "eval_iters": cfg.validation.eval_iters,
            "exit_signal_handler": cfg.train.exit_signal_handler,
        }
    with open(sys.argv[3], "w") as fh:
        json.dump(out, fh)
''')


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Tokenizer + .bin/.idx built from real text with the real libraries (~10 s)."""
    import tiny_corpus

    out = tmp_path_factory.mktemp("corpus")
    return tiny_corpus.build(out)


def _compile(tmp: Path, corpus: dict, **changes: str) -> Path:
    """Compile the real-data recipe with its paths moved under ``tmp``; returns the recipe dir."""
    sets = {"training.data.blend": json.dumps([corpus["prefix"]]), "tokenizer.path": corpus["tokenizer"],
            "checkpoint.save": str(tmp / "ckpt"), "training.data.cache": str(tmp / "cache"),
            "logging.tensorboard": str(tmp / "tb")}
    sets.update(changes)
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "compiler"))
    proc = subprocess.run([sys.executable, "-m", "mocompile", "compile", str(RECIPE), "-o", str(tmp / "gen"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "gen" / "tiny-moe-real-data"


def _preflight(recipe_dir: Path, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    # the launchers export the plan's environment block before preflight runs: do the same
    lock = json.loads((recipe_dir / "mocompile.lock.json").read_text(encoding="utf-8"))
    e.update({k: str(d["value"]) for k, d in lock["env"].items()})
    e.update(PYTHON=sys.executable, **env)
    return subprocess.run(["bash", str(recipe_dir / "preflight.sh")], env=e, capture_output=True, text=True,
                          timeout=300)


def test_bridge_builds_train_and_valid_datasets_from_the_generated_config(tmp_path, corpus):
    recipe_dir = _compile(tmp_path, corpus)
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(STACK), str(recipe_dir / "train.py"), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))})
    assert out.exists(), proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["dataset_config"] == "GPTDatasetConfig" and r["train_type"] == "GPTDataset"
    assert r["blend"] == [[corpus["prefix"]], None]
    assert r["split_matrix"][2] is None and r["test"]  # split "98,2,0": no test set
    # 40 iterations x 16 sequences; evaluation every 20 iterations x 2 batches x 16 (Bridge's own arithmetic).
    assert r["samples"][:2] == [40 * 16, (40 // 20 + 1) * 2 * 16]
    assert r["train_len"] >= r["samples"][0] and r["valid_len"] >= r["samples"][1]
    assert r["tokenizer_vocab"] == corpus["vocab"] == 2048 and r["model_vocab"] == 32000
    assert r["eod"] == corpus["eod"]
    toks = r["tokens"]
    assert len(toks) == 1024 and all(0 <= t < corpus["vocab"] for t in toks)
    assert toks[1:] == r["labels"][:-1]  # labels are the next tokens
    assert r["eod_samples"] >= 1  # documents are joined with EOD, as the builder wrote them
    # The sample decodes to the project's own text: a long run of it occurs in the source files.
    import tiny_corpus
    source = "\n\n".join(tiny_corpus.documents(tiny_corpus.default_sources()))
    longest = max(r["text"].split("<|endoftext|>"), key=len)
    assert len(longest) > 80 and longest[:80] in source
    assert (r["save"], r["load"], r["save_interval"], r["ckpt_format"]) == (str(tmp_path / "ckpt"), None, 20, "torch_dist")
    assert r["tensorboard_dir"] == str(tmp_path / "tb")
    assert (r["eval_interval"], r["eval_iters"], r["exit_signal_handler"]) == (20, 2, True)


def test_preflight_passes_and_says_there_is_no_resume_point(tmp_path, corpus):
    # Resuming needs Transformer Engine with megatron-core 0.19.2 (CKPT007): target TE, and let the
    # TE import shim stand in for it (preflight only checks that TE imports at the right version).
    recipe_dir = _compile(tmp_path, corpus, **{"checkpoint.load": str(tmp_path / "ckpt"),
                                               "versions.transformer_engine": "2.12.0",
                                               # this machine has no Apex either (RUN011 would say so)
                                               "versions.apex": "none",
                                               # this test is about data and resume: keep the planner off
                                               # flex dispatchers, whose package (RUN003) is not installed here
                                               "moe.dispatcher": "alltoall"})
    shim = dict(PYTHONPATH=str(STACK / "te_shim"))
    proc = _preflight(recipe_dir, **shim)
    assert proc.returncode == 0, proc.stderr
    assert "preflight: ok" in proc.stdout
    assert f"RUN009 no checkpoint in {str(tmp_path / 'ckpt')!r}: training starts at iteration 0" in proc.stdout
    assert "2048 tokens (model vocab 32000)" in proc.stdout
    # Resume point present: Bridge's tracker file says the iteration.
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("20\n")
    proc = _preflight(recipe_dir, **shim)
    assert proc.returncode == 0 and "RUN009 resume from iteration 20" in proc.stdout, proc.stdout + proc.stderr


def test_preflight_RUN006_names_a_missing_idx(tmp_path, corpus):
    copy = tmp_path / "data" / "text_document"
    copy.parent.mkdir()
    shutil.copy(corpus["prefix"] + ".bin", str(copy) + ".bin")  # the .idx is left behind
    proc = _preflight(_compile(tmp_path, corpus, **{"training.data.blend": json.dumps([str(copy)])}))
    assert proc.returncode == 1
    assert f"RUN006 dataset file {str(copy) + '.idx'!r} is missing" in proc.stderr
    assert f"{str(copy) + '.bin'!r}" not in proc.stderr  # the .bin is there: only the .idx is named


def test_preflight_RUN007_for_an_unreadable_tokenizer_and_a_too_large_vocabulary(tmp_path, corpus):
    broken = tmp_path / "tok"
    shutil.copytree(corpus["tokenizer"], broken)
    (broken / "tokenizer.json").write_text("{ not json")
    proc = _preflight(_compile(tmp_path, corpus, **{"tokenizer.path": str(broken)}))
    assert proc.returncode == 1 and f"RUN007 tokenizer {str(broken)!r} does not load offline" in proc.stderr
    # A hub id that is not in the local cache must not be fetched: offline means offline.
    proc = _preflight(_compile(tmp_path, corpus, **{"tokenizer.path": "mocompile-test/no-such-tokenizer"}),
                      HF_HOME=str(tmp_path / "hf"))
    assert proc.returncode == 1 and "RUN007 tokenizer 'mocompile-test/no-such-tokenizer' does not load" in proc.stderr
    # The model's vocabulary smaller than the tokenizer's: Bridge would stop after init.
    proc = _preflight(_compile(tmp_path, corpus, **{"model": "{base: tiny-moe, vocab_size: 2047}",
                                                    "tokenizer.vocab_size": "null"}))
    assert proc.returncode == 1 and "has 2048 tokens, the model's vocab_size is 2047" in proc.stderr


def _make_read_only(path: Path) -> bool:
    """chmod 555, plus the immutable flag when running as root (root ignores modes)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o555)
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], capture_output=True)
    try:
        (path / "probe").write_text("x")
    except OSError:
        return True
    (path / "probe").unlink()
    return False


def test_preflight_RUN008_for_a_read_only_save_directory(tmp_path, corpus):
    ro = tmp_path / "ro"
    if not _make_read_only(ro):
        pytest.skip("cannot make a read-only directory here (root without chattr)")
    try:
        proc = _preflight(_compile(tmp_path, corpus, **{"checkpoint.save": str(ro / "ckpt")}))
    finally:
        subprocess.run(["chattr", "-i", str(ro)], capture_output=True)
        ro.chmod(0o755)
    assert proc.returncode == 1
    assert f"RUN008 checkpoint.save directory {str(ro / 'ckpt')!r} is not writable" in proc.stderr


def test_CKPT007_matches_megatron_core_without_te_or_apex():
    """The resume failure seen on 2xH100, on the real megatron-core source: without Apex or TE,
    ``DistributedOptimizer.state_dict`` reads the Adam step from torch's Adam state, which is empty
    until the first step (loading a checkpoint calls it first), and asserts. After a step it goes
    past that point. mocompile flags the same stacks (no TE target) with CKPT007."""
    import warnings
    from types import SimpleNamespace

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.optimizer.distrib_optimizer as dopt
    from mocompile.rules.checks import CHECKS

    assert dopt.HAVE_APEX_OR_TE is False  # this venv has neither, like the GPU test hosts
    param = torch.nn.Parameter(torch.zeros(4))
    adam = torch.optim.Adam([param])
    with pytest.raises(AssertionError):
        dopt.DistributedOptimizer.state_dict(SimpleNamespace(optimizer=adam))  # what loading runs first
    param.grad = torch.ones(4)
    adam.step()
    with pytest.raises(AttributeError):  # past the assert: the stand-in lacks the rest of the optimizer
        dopt.DistributedOptimizer.state_dict(SimpleNamespace(optimizer=adam))
    assert CHECKS["CKPT007"]({"load": "/c", "te_version": None})
    assert not CHECKS["CKPT007"]({"load": "/c", "te_version": "2.12.0"})
