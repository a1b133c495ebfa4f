"""A vendored model config (``model_config:``) builds the same model as Bridge's recipe does from the hub, offline.

A recipe for Qwen3-30B-A3B names a ``config.json`` in the project; the compiler copies it into the generated
folder and ``train.py`` hands it to Bridge's recipe function. Here a child process behind the TE import shim
builds the generated ``build_config()`` with ``HF_HUB_OFFLINE=1`` and an EMPTY Hugging Face cache (HOME,
HF_HOME and HF_HUB_CACHE all point at empty folders), then puts the same file into that cache, where Bridge's
recipe reads it the usual way (``AutoBridge.from_hf_pretrained("Qwen/Qwen3-30B-A3B", revision=...)``), and
builds Bridge's own ``qwen3_30b_a3b_pretrain_config()``. Every model field must agree except the ones the plan
sets (the lock's ``config_fields``). The same run with the hook taken out of ``train.py`` must fail offline.

Test data only: the vendored ``config.json`` is built by ``tests/stack/hf_configs.py`` from mocompile's own
catalogue with transformers' config classes (the hub cannot be reached here); a user downloads the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "qwen3-30b-a3b-h100x16-hybridep.yaml"
HOOK = "    with vendored_hf_config():\n        cfg = qwen3_30b_a3b_pretrain_config()"

DRIVER = textwrap.dedent('''
    import dataclasses, json, os, sys
    from pathlib import Path
    root, gen, out, revision = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    sys.path[:0] = [str(root / "tests" / "stack")]
    import bridge_validate as bv

    def flat(model):
        acc = {"__class__": type(model).__name__}
        for f in dataclasses.fields(model):
            v = getattr(model, f.name, None)
            acc[f.name] = getattr(v, "__qualname__", repr(v)) if callable(v) else repr(bv._jsonable(v))
        return acc

    def files(path):
        return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file())

    bv._ensure_te_shim()
    lock = json.loads((gen / "mocompile.lock.json").read_text())
    os.environ.update(WORLD_SIZE=str(lock["hardware"]["world_size"]), RANK="0", LOCAL_RANK="0")
    cache = Path(os.environ["HF_HUB_CACHE"])
    result = {"cache_before": files(cache)}
    with bv.fake_gpu(lock["hardware"]["gpu"]), bv.te_version_override(lock["versions"]["transformer_engine"]):
        mod = bv._load_module(str(gen / "train.py"))
        try:
            result["generated"] = flat(mod.build_config().model)
        except BaseException as exc:  # the hook removed: Bridge's recipe goes to the (offline) hub and fails
            result["generated_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        result["cache_after"] = files(cache)
        # Bridge's recipe the usual way: the same config.json, from the HF cache at the revision it pins
        repo = cache / ("models--" + lock["model"]["hf_id"].replace("/", "--"))
        (repo / "snapshots" / revision).mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
        (repo / "snapshots" / revision / "config.json").write_bytes((gen / "hf_config" / "config.json").read_bytes())
        result["bridge"] = flat(mod.qwen3_30b_a3b_pretrain_config().model)
    out.write_text(json.dumps(result))
''')


def _compile(tmp: Path) -> Path:
    """Compile the committed Qwen3-30B-A3B recipe, plus `model_config`, in a throw-away project."""
    import hf_configs

    (tmp / "pyproject.toml").write_text("")
    (tmp / "hf" / "qwen3-30b-a3b").mkdir(parents=True)
    (tmp / "hf" / "qwen3-30b-a3b" / "config.json").write_text(
        json.dumps(hf_configs.hf_config("qwen3-30b-a3b"), indent=2), encoding="utf-8")
    (tmp / RECIPE.name).write_text(RECIPE.read_text(encoding="utf-8").replace(
        "model: qwen3-30b-a3b\n", "model: qwen3-30b-a3b\nmodel_config: hf/qwen3-30b-a3b\n"), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "compiler"))
    proc = subprocess.run([sys.executable, "-m", "mocompile", "compile", RECIPE.name], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "generated" / "qwen3-30b-a3b-h100x16-hybridep"


def _build(gen: Path, tmp: Path, site_packages: Path) -> dict:
    import hf_configs

    revision = hf_configs.pinned_revisions(site_packages)["Qwen/Qwen3-30B-A3B"]
    home = tmp / "home"
    (home / "hf" / "hub").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HOME=str(home), HF_HOME=str(home / "hf"), HF_HUB_CACHE=str(home / "hf" / "hub"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    script, out = tmp / "driver.py", tmp / "result.json"
    script.write_text(DRIVER, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(ROOT), str(gen), str(out), revision],
                          capture_output=True, text=True, timeout=900, env=env)
    assert out.exists(), proc.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("vendored"))


@pytest.fixture(scope="module")
def built(compiled, tmp_path_factory, site_packages) -> dict:
    return _build(compiled, tmp_path_factory.mktemp("offline"), site_packages)


def test_the_generated_recipe_builds_offline_from_an_empty_cache(built):
    assert built["cache_before"] == []
    assert "generated_error" not in built, built.get("generated_error")
    assert built["cache_after"] == []  # nothing fetched or cached: the model config came from the recipe folder


def test_the_vendored_config_builds_the_model_bridges_recipe_builds(built, compiled):
    planned = {k.split(".", 1)[1] for k in json.loads((compiled / "mocompile.lock.json").read_text())["config_fields"]
               if k.startswith("model.")}
    gen, ref = built["generated"], built["bridge"]
    assert len(gen) > 100  # the whole provider, not an empty one
    differ = {k: (ref.get(k), gen.get(k)) for k in set(gen) | set(ref) if gen.get(k) != ref.get(k)}
    assert not {k: v for k, v in differ.items() if k not in planned}, differ
    for field, value in (("num_layers", 48), ("hidden_size", 2048), ("num_moe_experts", 128), ("moe_router_topk", 8),
                         ("moe_ffn_hidden_size", 768), ("vocab_size", 151936), ("kv_channels", 128)):
        assert gen[field] == ref[field] == repr(value), field
    # checkpoints name the hub model and its pinned revision, as Bridge's recipe records them
    assert gen["hf_model_id"] == ref["hf_model_id"] == repr("Qwen/Qwen3-30B-A3B")
    assert gen["hf_model_revision"] == ref["hf_model_revision"] != "None"


def test_without_the_hook_the_same_build_fails_offline(compiled, tmp_path_factory, site_packages):
    text = (compiled / "train.py").read_text(encoding="utf-8")
    assert HOOK in text
    # the recipe function called bare, as a train.py without model_config does
    (compiled / "train_nohook.py").write_text(text.replace(HOOK, "    cfg = qwen3_30b_a3b_pretrain_config()")
                                              .replace('    cfg.model.hf_model_id = HF_CONFIG["model_id"]\n', ""))
    gen = tmp_path_factory.mktemp("nohook") / "gen"
    gen.mkdir()
    for name in ("mocompile.lock.json",):
        (gen / name).write_bytes((compiled / name).read_bytes())
    (gen / "train.py").write_bytes((compiled / "train_nohook.py").read_bytes())
    (gen / "hf_config").mkdir()
    (gen / "hf_config" / "config.json").write_bytes((compiled / "hf_config" / "config.json").read_bytes())
    r = _build(gen, gen.parent, site_packages)
    assert "generated" not in r
    assert "Qwen/Qwen3-30B-A3B" in r["generated_error"], r["generated_error"]
