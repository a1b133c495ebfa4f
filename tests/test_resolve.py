"""Resolution policies: what the resolver decides for each goal, and why."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import FIXTURES, ROOT, overrides
from mocompile.pipeline import analyse

RECIPES = ROOT / "recipes"


def plan_of(path, **sets):
    r = analyse(str(path), overrides(sets))
    assert not r.errors, [(d.rule, d.message) for d in r.errors]
    return r.plan


def test_bring_up_uses_alltoall_without_overlap():
    p = plan_of(RECIPES / "gpt-oss-20b-h100x8-bringup.yaml")
    assert p["moe_token_dispatcher_type"] == "alltoall"
    assert p["overlap_moe_expert_parallel_comm"] is False
    assert p["cuda_graph_impl"] == "none"
    assert p.settings["moe_token_dispatcher_type"].source == "goal"


def test_throughput_on_hopper_picks_deepep_and_overlap_for_large_ep():
    p = plan_of(RECIPES / "qwen3-30b-a3b-h100x16-hybridep.yaml", **{"moe.dispatcher": "auto", "moe.overlap": "auto"})
    assert (p["moe_token_dispatcher_type"], p["moe_flex_dispatcher_backend"]) == ("flex", "deepep")
    assert p["overlap_moe_expert_parallel_comm"] is True
    assert p["moe_shared_expert_overlap"] is False


def test_throughput_on_nvl72_picks_hybridep_with_domain_env():
    p = plan_of(RECIPES / "qwen3-235b-a22b-gb200.yaml")
    assert p["moe_flex_dispatcher_backend"] == "hybridep"
    assert "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN" in p.env
    assert p.env["CUDA_DEVICE_MAX_CONNECTIONS"].value == "32"


def test_deepep_is_never_chosen_on_gb200():
    p = plan_of(RECIPES / "qwen3-235b-a22b-gb200.yaml")
    assert p["moe_flex_dispatcher_backend"] != "deepep"


def test_small_intranode_ep_keeps_overlap_off_with_measured_reason():
    p = plan_of(RECIPES / "tiny-moe-h100x2.yaml")
    assert p["expert_model_parallel_size"] == 2
    assert p["overlap_moe_expert_parallel_comm"] is False
    assert "measured" in p.settings["overlap_moe_expert_parallel_comm"].reason


def test_overlap_with_pp_gets_vpp_and_p2p_overlap():
    p = plan_of(RECIPES / "qwen3-235b-a22b-h100-alltoall.yaml")
    assert p["virtual_pipeline_model_parallel_size"] == 4
    assert p["overlap_p2p_comm"] is True and p["batch_p2p_comm"] is False


def test_uneven_deepseek_gets_an_explicit_layout():
    p = plan_of(RECIPES / "deepseek-v3-h100-deepep.yaml")
    assert p["pipeline_model_parallel_layout"] == "Et|(tt|)*30mL"
    assert p["moe_shared_expert_overlap"] is False  # provider default is True; off under overlap


def test_fit_picks_the_lightest_recompute_that_fits_and_shows_the_estimate():
    p = plan_of(RECIPES / "qwen3-30b-a3b-h100x8-fit.yaml")
    assert p["overlap_moe_expert_parallel_comm"] is False
    assert p.memory["estimate_gib"] <= 80
    reason = p.settings["recompute_granularity"].reason
    assert "estimate" in reason
    heavier = plan_of(RECIPES / "qwen3-30b-a3b-h100x8-fit.yaml", **{"training.micro_batch_size": 8})
    order = [None, "selective", "full"]
    assert order.index(heavier["recompute_granularity"]) >= order.index(p["recompute_granularity"])


def test_derived_settings_follow_final_values():
    p = plan_of(FIXTURES / "rule_base.yaml", **{"moe.overlap": True, "parallelism.ep": 2,
                                                 "moe.shared_expert_overlap": "auto"})
    assert p["moe_shared_expert_overlap"] is False
    assert p.env["CUDA_DEVICE_MAX_CONNECTIONS"].value == "32"


def test_user_pin_wins_over_goal():
    p = plan_of(RECIPES / "gpt-oss-20b-h100x8-bringup.yaml", **{"moe.dispatcher": "deepep"})
    assert p["moe_flex_dispatcher_backend"] == "deepep"
    assert p.settings["moe_token_dispatcher_type"].source == "user"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(["tiny-moe", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3", "moonlight-16b-a3b",
                              "glm-4.5-air", "kimi-k2", "qwen3-235b-a22b"]),
       gpu=st.sampled_from(["a100", "h100", "h200", "b200", "gb200"]),
       nodes=st.sampled_from([1, 2, 4, 8, 16, 64]),
       goal=st.sampled_from(["throughput", "fit", "bring-up"]),
       te=st.sampled_from(["none", "2.12.0"]),
       mbs=st.sampled_from([1, 2]))
def test_resolver_never_emits_a_plan_that_breaks_a_rule(model, gpu, nodes, goal, te, mbs):
    """With nothing pinned, every plan must pass the whole catalogue."""
    r = analyse(str(FIXTURES / "rule_base.yaml"), overrides({
        "model.base": model, "hardware.gpu": gpu, "hardware.nodes": nodes, "hardware.gpus_per_node": 4 if gpu == "gb200" else 8,
        "goal": goal, "versions.transformer_engine": te, "training.micro_batch_size": mbs,
        "training.global_batch_size": 1024}))
    errors = [(d.rule, d.message) for d in r.diagnostics if d.severity == "error"]
    assert not errors


def test_shared_expert_overlap_follows_the_final_dispatcher_and_overlap():
    """DeepSeek-V3's provider defaults shared-expert overlap on; Bridge's flex helper turns it off,
    so the plan must say off with deepep (else check_plan would stop the job), and on with alltoall."""
    base = {"model.base": "deepseek-v3", "hardware.nodes": 8, "hardware.gpus_per_node": 8, "goal": "bring-up",
            "training.global_batch_size": 512}
    flex = plan_of(FIXTURES / "rule_base.yaml", **base, **{"moe.dispatcher": "deepep"})
    assert flex["moe_shared_expert_overlap"] is False and "flex" in flex.settings["moe_shared_expert_overlap"].reason
    a2a = plan_of(FIXTURES / "rule_base.yaml", **base)
    assert a2a["moe_token_dispatcher_type"] == "alltoall" and a2a["moe_shared_expert_overlap"] is True
