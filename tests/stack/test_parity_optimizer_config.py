"""Adam's memory levers against the real Megatron-Core 0.19.2 ``OptimizerConfig`` (on CPU).

Each case compiles an intent with mocompile, builds the real ``OptimizerConfig`` from the fields the
generated ``train.py`` passes (``emit/python_recipe.optimizer_levers`` plus the template's fixed ones) and
compares: mocompile refuses exactly where Megatron-Core raises. This environment has no Transformer Engine,
which is what OPT005 is about: Megatron-Core's post-init imports TE's FusedAdam for the precision-aware
optimizer and raises without it.
"""

from __future__ import annotations

import os
import sys

import pytest
from conftest import ROOT
from mocompile.emit.python_recipe import optimizer_levers
from mocompile.pipeline import analyse

pytestmark = pytest.mark.stack

RECIPE = str(ROOT / "recipes" / "tiny-moe-h100x2.yaml")


def _config(sets: list[str]):
    """mocompile's verdict (the error rule IDs) and the real OptimizerConfig's (the exception, or None)."""
    import torch
    from megatron.core.optimizer import OptimizerConfig

    res = analyse(RECIPE, sets)
    ids = sorted({d.rule for d in res.errors})
    plan = res.plan
    fields = {"optimizer": "dist_muon" if plan["optimizer"] == "muon" else "adam", "lr": 1e-4, "bf16": True,
              "use_distributed_optimizer": plan["optimizer"] != "muon"}
    for lever in optimizer_levers(plan):
        fields[lever["field"]] = getattr(torch, lever["dtype"]) if "dtype" in lever else lever["value"]
    if plan["optimizer"] == "muon" and plan["optimizer_state"] != "fp32":
        # what the recipe asks for (train.py never emits it for Muon, which is why OPT004 refuses it)
        fields["use_precision_aware_optimizer"] = True
    try:
        OptimizerConfig(**fields)
        return ids, None
    except (AssertionError, RuntimeError, ValueError) as exc:
        return ids, f"{type(exc).__name__}: {exc}"


def test_fp32_state_and_offload_are_accepted_by_both():
    for sets in ([], ["training.optimizer_state=fp32", "training.optimizer_offload=0.5"]):
        ids, raised = _config(sets)
        assert raised is None and not [i for i in ids if i.startswith("OPT")]


def test_opt004_precision_aware_state_with_muon_is_refused_by_both():
    ids, raised = _config(["training.optimizer=muon", "training.optimizer_state=bf16-moments"])
    assert "OPT004" in ids
    assert raised is not None and "only supported with adam" in raised


def test_opt005_precision_aware_state_without_te_is_refused_by_both():
    # the catalogue example: no Transformer Engine in the target, none in this environment either
    ids, raised = _config(["training.optimizer_state=fp32-remainders", "versions.transformer_engine=none"])
    assert "OPT005" in ids
    assert raised is not None and "requires FusedAdam from TransformerEngine" in raised


def test_opt006_is_mocompiles_own_megatron_accepts_the_combination_silently():
    """Megatron-Core returns from its post-init before the precision-aware checks when offloading, and the
    offloading optimizer is built without the dtypes: nothing raises, the state stays fp32. OPT006 says so."""
    ids, raised = _config(["training.optimizer_state=bf16-moments", "training.optimizer_offload=0.5"])
    assert "OPT006" in ids
    assert raised is None



def test_turning_fp8_param_gather_off_turns_fp8_params_off_in_bridges_preset():
    """What train.py's `cfg.mixed_precision.fp8_param_gather = False` does to Bridge's real preset with optimizer
    offload: MixedPrecisionConfig keeps fp8_param in step (training/mixed_precision.py __setattr__), so the weights
    stay bf16. Bridge's module imports Transformer Engine: a child process with the TE import shim."""
    import subprocess

    shim = ROOT / "tests" / "stack" / "te_shim"
    code = ("from megatron.bridge.training.mixed_precision import get_mixed_precision_config\n"
            "cfg = get_mixed_precision_config('bf16_with_fp8_current_scaling_mixed')\n"
            "before = (cfg.fp8_param_gather, cfg.fp8_recipe)\n"
            "cfg.fp8_param_gather = False\n"
            "print(before, cfg.fp8_param, cfg.fp8_param_gather)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(shim)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "(True, 'tensorwise') False False"
