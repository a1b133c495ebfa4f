"""Every plan the planner chooses on its own passes the real Megatron-Core TransformerConfig.

Hypothesis draws intents with everything `auto` (models, GPUs, node counts, goals, precisions, stacks);
the plan must break no rule of the catalogue (MEM001 aside, when nothing fits on that many GPUs) and the
real (MLA)TransformerConfig built from it must not raise.
"""

from __future__ import annotations

import os

import pytest
from conftest import FIXTURES
from mocompile.pipeline import analyse
from test_parity_transformer_config import _overrides, build_real

hypothesis = pytest.importorskip("hypothesis",
                                 reason="hypothesis comes with tests/stack/requirements.txt (tests/run installs it)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("MOCOMPILE_PLANNER_EXAMPLES", "60"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["tiny-moe", "qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b", "deepseek-v3",
                              "moonlight-16b-a3b", "glm-4.5-air", "qwen3-235b-a22b"]),
       gpu=st.sampled_from(["a100", "h100", "h200", "b200", "gb200"]),
       nodes=st.sampled_from([1, 2, 4, 16, 64]),
       goal=st.sampled_from(["throughput", "fit", "bring-up"]),
       te=st.sampled_from(["none", "2.12.0"]),
       precision=st.sampled_from(["bf16", "fp8-cs"]),
       mbs=st.sampled_from([1, 2]))
def test_auto_plans_pass_the_real_transformer_config(mcore, model, gpu, nodes, goal, te, precision, mbs):
    if precision == "fp8-cs" and (gpu == "a100" or te == "none"):
        precision = "bf16"  # FP8 needs TE and Hopper+ (PREC001/PREC002 reject such pins; not the planner's doing)
    r = analyse(str(FIXTURES / "rule_base.yaml"), _overrides({
        "model.base": model, "hardware.gpu": gpu, "hardware.nodes": nodes,
        "hardware.gpus_per_node": 4 if gpu == "gb200" else 8, "goal": goal, "versions.transformer_engine": te,
        "training.micro_batch_size": mbs, "training.global_batch_size": 2048, "training.precision": precision}))
    errors = sorted({d.rule for d in r.diagnostics if d.severity == "error"})
    if errors == ["MEM001"]:
        return  # nothing fits on this many GPUs: the plan is refused, not emitted
    assert not errors, errors
    exc, _ = build_real(mcore, r.plan.values())
    assert exc is None, f"{type(exc).__name__}: {exc}"
