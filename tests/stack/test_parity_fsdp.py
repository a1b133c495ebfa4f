"""Megatron-FSDP against the real Megatron-Bridge 0.6.2 (on CPU, bridge_validate.py's faked GB300).

The FSDP recipe (recipes/deepseek-v3-gb300x64-fsdp.yaml, compiled with a checkpoint folder so the format
matters) goes through Bridge's runtime_config_update three times: as generated (accepted), with the user's
CUDA_DEVICE_MAX_CONNECTIONS=1 in the environment (FSD002: Bridge refuses), and with its checkpoint format
changed to torch_dist (FSD004: Bridge refuses). mocompile refuses exactly those two, before a GPU is touched.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import ROOT, run_cli
from mocompile.pipeline import analyse

pytestmark = pytest.mark.stack

RECIPE = ROOT / "recipes" / "deepseek-v3-gb300x64-fsdp.yaml"

DRIVER = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    root, hf_json, out, files = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    sys.path[:0] = [str(root / "tests" / "stack")]
    import bridge_validate as bv
    result = {}
    with bv.offline_hf_configs(json.loads(hf_json.read_text())):
        for f in files:
            path, conns = f.split("::")
            saved = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
            if conns:
                os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = conns   # the user's launch.env, set before the recipe's
            try:
                result[f] = bv.validate_recipe_file(path, "gb300", 64, te_version="2.12.0")
            finally:
                os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
                if saved is not None:
                    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = saved
    out.write_text(json.dumps(result, default=str))
''')


def _errors(*sets: str) -> set[str]:
    return {d.rule for d in analyse(str(RECIPE), list(sets)).errors}


def test_bridge_refuses_what_mocompile_refuses_for_megatron_fsdp(tmp_path, site_packages):
    from bridge_validate import run_child

    save = ["--set", f"checkpoint.save={tmp_path / 'ckpt'}"]
    res = run_cli("compile", str(RECIPE), "-o", str(tmp_path / "gen"), *save)
    assert res.returncode == 0, res.stdout + res.stderr
    good = tmp_path / "gen" / "deepseek-v3-gb300x64-fsdp" / "train.py"
    text = good.read_text()
    assert "cfg.checkpoint.ckpt_format = 'fsdp_dtensor'" in text
    torch_dist = tmp_path / "torch_dist_train.py"
    torch_dist.write_text(text.replace("cfg.checkpoint.ckpt_format = 'fsdp_dtensor'",
                                       "cfg.checkpoint.ckpt_format = 'torch_dist'"))
    cases = {"as generated": f"{good}::", "CUDA_DEVICE_MAX_CONNECTIONS=1": f"{good}::1",
             "torch_dist": f"{torch_dist}::"}
    (tmp_path / "child").mkdir()
    out = run_child(DRIVER, list(cases.values()), ["deepseek-v3"], site_packages, tmp_path / "child")
    r = {k: out[v] for k, v in cases.items()}
    assert r["as generated"]["ok"], r["as generated"]
    assert not r["CUDA_DEVICE_MAX_CONNECTIONS=1"]["ok"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in r["CUDA_DEVICE_MAX_CONNECTIONS=1"]["error"]
    assert not r["torch_dist"]["ok"] and "fsdp_dtensor" in r["torch_dist"]["error"]
    # mocompile: the same three verdicts, from the intent
    ckpt = f"checkpoint.save={tmp_path / 'ckpt'}"
    assert not {e for e in _errors(ckpt) if e.startswith("FSD")}
    assert "FSD002" in _errors(ckpt, "launch.env={CUDA_DEVICE_MAX_CONNECTIONS: '1'}", "parallelism.fsdp=true")
    assert "FSD004" in _errors(ckpt, "checkpoint.format=torch_dist", "parallelism.fsdp=true")
    # the generated recipe's plan, as the lock records it
    lock = json.loads((tmp_path / "gen" / "deepseek-v3-gb300x64-fsdp" / "mocompile.lock.json").read_text())
    assert lock["settings"]["use_megatron_fsdp"]["value"] is True
