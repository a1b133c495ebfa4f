"""Version keys: a rule that differs between versions is applied per the recipe's versions.

Rules carry the range of the target stack they hold for (catalogue ``versions:``; engine
``Rule.applies``); the lock file records the target versions; and where Megatron-Core's own check
depends on a version, the real TransformerConfig flips at the same version as mocompile when
Megatron-Core is made to see that version (``megatron.core.utils._te_version`` /
``_torch_version``, the globals its ``is_te_min_version`` / ``is_torch_min_version`` read).
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
from mocompile.pipeline import analyse
from mocompile.rules.engine import VERSION_KEYS, rules
from mocompile.versions import in_range

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
RULE_BASE = ROOT / "tests" / "fixtures" / "rule_base.yaml"


def _plan(sets: dict) -> tuple[dict, set[str]]:
    from test_parity_transformer_config import _overrides

    result = analyse(str(RULE_BASE), _overrides(sets))
    return result.plan.values(), {d.rule for d in result.diagnostics if d.severity == "error"}


# (rule, the intent around it, the versions key, versions on each side of the flip)
FLIPS = [
    ("DW003", {"moe.overlap": True, "moe.delay_wgrad": True, "parallelism.ep": 2,
               "cuda_graphs.impl": "transformer_engine", "cuda_graphs.modules": ["moe_router", "moe_preprocess"]},
     "versions.transformer_engine", ["2.8.0", "2.9.0", "2.9.1"], ["2.10.0", "2.11.0", "2.12.0"]),
    ("RC008", {"moe.overlap": False, "training.precision": "fp8-cs", "recompute.granularity": "selective",
               "recompute.modules": ["layernorm"]},
     "versions.transformer_engine", ["2.4.0", "2.5.0"], ["2.6.0", "2.12.0"]),
    ("OVL004", {"moe.overlap": True, "parallelism.ep": 2},
     "versions.torch", ["2.4.1", "2.5.1"], ["2.6.0", "2.11.0"]),
]


@pytest.mark.parametrize("rule_id,base,key,below,above", FLIPS, ids=[f[0] for f in FLIPS])
def test_mocompile_and_megatron_core_flip_at_the_same_version(mcore, rule_id, base, key, below, above):
    from test_parity_transformer_config import build_real, upstream_rules

    for version in below + above:
        cfg, errors = _plan({**base, key: version})
        exc, _ = build_real(mcore, cfg)  # Megatron-Core sees the plan's TE / torch version
        if version in below:
            assert rule_id in errors, f"{rule_id} should hold for {key}={version}"
            assert exc is not None and rule_id in upstream_rules(exc), \
                f"Megatron-Core should reject at {key}={version}: {exc}"
        else:
            assert rule_id not in errors, f"{rule_id} should not hold for {key}={version}"
            assert exc is None, f"Megatron-Core should accept at {key}={version}: {exc}"


def test_dw003_flip_with_the_te_version_patched_directly(mcore):
    """The issue's example, spelled out: patch megatron.core.utils._te_version, build the config."""
    from packaging.version import Version
    from test_parity_transformer_config import tc_kwargs

    cfg, _ = _plan(FLIPS[0][1])
    kwargs = tc_kwargs(cfg, mcore.torch)
    saved = mcore.utils._te_version
    try:
        mcore.utils._te_version = Version("2.9.1")
        with pytest.raises(AssertionError, match="TE version >= 2.10.0 is required for delay_wgrad_compute"):
            mcore.TransformerConfig(**kwargs)
        mcore.utils._te_version = Version("2.10.0")
        mcore.TransformerConfig(**kwargs)
    finally:
        mcore.utils._te_version = saved


def test_versioned_rules_hold_only_inside_their_range():
    versioned = [r for r in rules() if r.versions]
    assert {"DW005", "RC008", "PREC004", "OVL004"} <= {r.id for r in versioned}
    for rule in versioned:
        for key, spec in rule.versions:
            assert key in VERSION_KEYS, (rule.id, key)
            assert not rule.applies({VERSION_KEYS[key]: None}) or not spec  # no target: never applies
            # A version just inside and one far outside the range.
            pinned = re.findall(r"==\s*(\S+)", spec)  # a rule keyed to one release ("==0.19.2")
            inside = next(v for v in (*pinned, "0.0.1", "1.0.0", "2.5.0", "2.9.0", "2.11.0", "99.0.0")
                          if in_range(v, spec))
            outside = next(v for v in ("99.0.0", "0.0.1") if not in_range(v, spec))
            assert rule.applies({VERSION_KEYS[key]: inside}), (rule.id, inside)
            assert not rule.applies({VERSION_KEYS[key]: outside}), (rule.id, outside)


@pytest.mark.parametrize("lock_path", sorted((ROOT / "generated").glob("*/mocompile.lock.json")),
                         ids=lambda p: p.parent.name)
def test_lock_records_the_target_versions(lock_path):
    lock = json.loads(lock_path.read_text(encoding="utf-8"))
    versions = lock["versions"]
    assert set(versions) == set(VERSION_KEYS)
    settings = {k: v["value"] for k, v in lock["settings"].items()}
    for key, field in VERSION_KEYS.items():
        assert settings[field] == versions[key], (key, settings[field], versions[key])
    # The stack these tests prove against is the one the recipes target.
    assert versions["megatron_core"] == metadata.version("megatron-core").split("+")[0]
    assert versions["megatron_bridge"] == metadata.version("megatron-bridge").split("+")[0]


def test_dw003_holds_without_te_like_megatron_core(mcore):
    """No TE in the target: Megatron-Core reads TE 0.0.0 and raises DW003's check; so does mocompile
    (DW003 counts a missing TE as older than 2.10, so it carries no ``versions:`` range)."""
    from test_parity_transformer_config import build_real, mocompile_errors, upstream_rules

    cfg, _ = _plan(FLIPS[0][1])
    cfg = {**cfg, "te_version": None, "transformer_impl": "local"}
    assert "DW003" in mocompile_errors(cfg)
    exc, _ = build_real(mcore, cfg)
    assert exc is not None and "DW003" in upstream_rules(exc), exc


def test_installed_torch_cannot_flip_ovl004_without_the_patch(mcore):
    """OVL004 reads the torch version: the installed torch (>= 2.6) never trips it by itself,
    which is why the flip above sets Megatron-Core's ``_torch_version`` to the target's."""
    from packaging.version import Version

    assert Version(mcore.torch.__version__.split("+")[0]) >= Version("2.6.0")
