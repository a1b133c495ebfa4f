"""Generated train.py = Bridge's recipe + exactly the plan: the two ConfigContainers, field by field.

For every committed recipe of a catalogue model (``generated/*`` whose ``train.py`` starts from a Bridge
recipe function), one child process behind the TE import shim and the offline HF configs
(``bridge_validate.py``, ``hf_configs.py``) builds Bridge's own recipe config and the generated
``build_config()``, flattens both (dataclass fields, three levels deep, each sub-config's class included)
and lists every field that differs. Each difference must be a field the lock's ``config_fields`` names
(``section.field`` or a whole ``section.*`` the plan replaces), and the setting it names must be in the
lock with a reason. The environment is compared key by key: Bridge's recipe variables stay unless the
plan's block (the lock's ``env``, each with its reason) sets the same key.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
GENERATED = sorted(p.parent.name for p in (ROOT / "generated").glob("*/train.py")
                   if re.search(r"^    cfg = \w+_pretrain_config\(\)", p.read_text(), re.M))

DRIVER = textwrap.dedent('''
    import dataclasses, json, os, sys
    from pathlib import Path
    root, hf_json, out, names = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    sys.path[:0] = [str(root / "tests" / "stack")]
    import bridge_validate as bv

    def flat(obj, prefix="", acc=None, depth=0):
        acc = {} if acc is None else acc
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and depth < 3:
            acc[prefix + "__class__"] = type(obj).__name__
            for f in dataclasses.fields(obj):
                try:
                    v = getattr(obj, f.name)
                except Exception as exc:
                    v = f"<unreadable: {type(exc).__name__}>"
                flat(v, f"{prefix}{f.name}.", acc, depth + 1)
        elif isinstance(obj, dict) and prefix == "env_vars.":
            for k, v in obj.items():
                acc[prefix + str(k)] = str(v)
        else:
            acc[prefix[:-1]] = repr(bv._jsonable(obj)) if not callable(obj) else getattr(obj, "__qualname__", repr(obj))
        return acc

    bv._ensure_te_shim()
    result = {}
    with bv.offline_hf_configs(json.loads(hf_json.read_text())):
        for n in names:
            lock = json.loads((root / "generated" / n / "mocompile.lock.json").read_text())
            saved = dict(os.environ)
            os.environ.update(WORLD_SIZE=str(lock["hardware"]["world_size"]), RANK="0", LOCAL_RANK="0")
            try:
                te = lock["versions"]["transformer_engine"] or "0.0.0"
                with bv.fake_gpu(lock["hardware"]["gpu"]), bv.te_version_override(te):
                    mod = bv._load_module(str(root / "generated" / n / "train.py"))
                    gen = mod.build_config()
                    fn = [v for k, v in vars(mod).items() if k.endswith("_pretrain_config") and callable(v)]
                    ref = fn[0]()
                a, b = flat(ref), flat(gen)
                keys = sorted(set(a) | set(b))
                result[n] = {"recipe": fn[0].__name__, "fields": len(keys),
                             "diff": {k: [a.get(k, "<absent>"), b.get(k, "<absent>")] for k in keys
                                      if a.get(k, "<absent>") != b.get(k, "<absent>")}}
            except Exception as exc:
                result[n] = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                os.environ.clear()
                os.environ.update(saved)
    out.write_text(json.dumps(result))
''')


def _lock(name: str) -> dict:
    return json.loads((ROOT / "generated" / name / "mocompile.lock.json").read_text())


@pytest.fixture(scope="session")
def diffs(tmp_path_factory, site_packages) -> dict:
    from bridge_validate import run_child

    # a resized catalogue model's recipe reads its base's HF config (train.py then sets the new numbers)
    models = sorted({(_lock(n)["model"].get("resized") or {}).get("from") or _lock(n)["model"]["id"] for n in GENERATED})
    return run_child(DRIVER, GENERATED, models, site_packages, tmp_path_factory.mktemp("configdiff"))


def test_every_committed_catalogue_recipe_is_compared():
    # the recipes built on Bridge's recipe functions (qwen3, deepseek-v3, gpt-oss families)
    assert len(GENERATED) >= 7, GENERATED


def _covered(path: str, fields: dict[str, str], diff: dict[str, list[str]]) -> str | None:
    """The lock setting that explains a differing config path, or None. A whole section (``section.*``)
    explains its fields only where the plan replaces it: the tokenizer, the precision config, Muon's optimizer,
    the profiler; the overlap config only where Bridge's recipe had none."""
    if path in fields:
        return fields[path]
    section = path.split(".")[0]
    if section == "comm_overlap" and (diff.get("comm_overlap") or ["?"])[0] != "None":
        return None
    return fields.get(f"{section}.*")


@pytest.mark.parametrize("name", GENERATED)
def test_the_generated_config_differs_from_bridges_recipe_only_where_the_plan_says_why(diffs, name):
    r = diffs[name]
    assert "error" not in r, r.get("error")
    lock = _lock(name)
    fields, settings, env = lock["config_fields"], lock["settings"], lock["env"]
    unexplained = {}
    for path, (bridge, ours) in r["diff"].items():
        if path.startswith("env_vars."):
            key = path.split(".", 1)[1]
            # a recipe variable may only change where the plan's environment block sets it, with its reason
            if key not in env or not env[key].get("reason") or ours == "<absent>":
                unexplained[path] = (bridge, ours)
            continue
        setting = _covered(path, fields, r["diff"])
        if setting == "model.resized" and lock["model"].get("resized"):
            continue  # a number of a resized catalogue model: the lock's model.resized names the base and the value
        if setting is None or setting not in settings or not settings[setting].get("reason"):
            unexplained[path] = (bridge, ours)
    assert not unexplained, f"{name} ({r['recipe']}): fields changed that no lock setting explains: {unexplained}"
    assert r["fields"] > 200  # the comparison saw the whole container, not an empty one


def test_the_recipes_optimizer_and_ddp_choices_survive(diffs):
    """What the old wholesale replacement dropped: the precision-aware optimizer of Qwen3-30B-A3B's recipe,
    DDP's average_in_collective, the recipe's environment variables and data-loader workers."""
    for name, r in diffs.items():
        changed = set(r["diff"])
        fsdp = _lock(name)["settings"]["use_megatron_fsdp"]["value"]  # FSDP sets the sharding, as Bridge's FSDP recipe
        for kept in ("ddp.average_in_collective", "dataset.num_workers",
                     "env_vars.TORCH_NCCL_AVOID_RECORD_STREAMS", "optimizer.adam_beta2", "optimizer.weight_decay"):
            assert kept not in changed, (name, kept, r["diff"].get(kept))
        assert ("ddp.data_parallel_sharding_strategy" in changed) is fsdp, name
        if name.startswith("qwen3-30b"):
            assert "optimizer.use_precision_aware_optimizer" not in changed
            assert _lock(name)["settings"]["optimizer_state"]["value"] == "fp32-remainders"
