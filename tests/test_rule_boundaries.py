"""Rule predicates on their boundaries: for every term of a rule, the value that just passes and
the one that just fails; where a rule reads several sizes, a sweep compared with the rule as
the upstream source states it; then the engine's choice of position and its message values,
and pipeline-layout validation clause by clause.

Cases start from ``BASE``, a legal 8-GPU configuration (every rule quiet), and change only the
fields the case names, so each one isolates a single term. These are the cases a planted bug
in ``rules/checks.py`` or ``layout.py`` must trip (docs/mutation.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

import pytest
from conftest import RULE_BASE
from mocompile.ir import Decision, Position
from mocompile.layout import derive, expand, layout_error
from mocompile.rules.checks import CHECKS, DEEPEP_GROUP_SIZES
from mocompile.rules.engine import broken_rules, by_id, check


def _plan():
    from mocompile.pipeline import analyse
    return analyse(str(RULE_BASE)).plan


LEGAL = dict(
    world_size=8, nodes=1, gpus_per_node=8, nvlink_domain=8, gpu_arch="hopper", gpu_memory_gib=80,
    gpu_flex_backends=["deepep", "hybridep"], tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
    virtual_pipeline_model_parallel_size=None, context_parallel_size=1, expert_model_parallel_size=2,
    expert_tensor_parallel_size=1, data_parallel_size=8, sequence_parallel=False, micro_batch_size=1,
    global_batch_size=16, seq_length=2048, num_layers=8, num_moe_experts=16, num_attention_heads=16,
    num_query_groups=4, first_k_dense=0, mtp_num_layers=None, add_bias_linear=False,
    pipeline_model_parallel_layout=None, overlap_p2p_comm=False, overlap_moe_expert_parallel_comm=False,
    delay_wgrad_compute=False, moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None,
    moe_flex_dispatcher_num_sms=None, hybridep_ranks_per_domain=None, fp8_dispatch=False,
    moe_shared_expert_intermediate_size=None, moe_shared_expert_overlap=False, moe_grouped_gemm=True,
    moe_expert_capacity_factor=None, moe_router_force_load_balancing=False, multi_latent_attention=False,
    recompute_granularity=None, recompute_method=None, recompute_modules=None, recompute_num_layers=None,
    cuda_graph_impl="none", cuda_graph_modules=None, bf16=True, fp16=False, fp8=None, fp4=None,
    te_version="2.12.0", torch_version="2.11.0", mcore_version="0.19.2", env={}, memory_estimate_gib=10.0,
    overlap_grad_reduce=True, train_iters=100,
)


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    cfg = _plan().values()
    cfg.update(LEGAL)
    assert [r.id for r in broken_rules(cfg)] == [], "BASE must be legal"
    return cfg


def broken(base: dict[str, Any], rule: str, **changes: Any) -> bool:
    """Does ``rule`` fire on BASE plus ``changes`` (through the catalogue: versions apply)?"""
    cfg = {**base, **changes}
    return rule in {r.id for r in broken_rules(cfg)}


FLEX_DEEPEP = dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep")
FLEX_HYBRIDEP = dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                     hybridep_ranks_per_domain=8)
OVERLAP = dict(overlap_moe_expert_parallel_comm=True)
# NCCL EP on a stack that has it (Transformer Engine 2.17; megatron-core 0.19.2 and Bridge 0.6.2 are the base's)
FLEX_NCCLEP = dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="ncclep", te_version="2.17.0",
                   gpu_flex_backends=["deepep", "hybridep", "ncclep"])

# (rule, fails, passes): two configurations one step apart on one term of the rule.
PROFILE = dict(use_pytorch_profiler=True, profile_step_start=2, profile_step_end=4, profile_ranks=[0],
               tensorboard_dir="/tb")
BOUNDARIES = [
    # PAR001 world % (TP*PP*CP): each factor on its own
    ("PAR001", dict(world_size=2, tensor_model_parallel_size=2, context_parallel_size=2),
     dict(world_size=4, tensor_model_parallel_size=2, context_parallel_size=2)),
    ("PAR001", dict(world_size=4, context_parallel_size=8), dict(world_size=8, context_parallel_size=8)),
    ("PAR001", dict(world_size=4, pipeline_model_parallel_size=8), dict(world_size=8, pipeline_model_parallel_size=8)),
    ("PAR001", dict(world_size=4, tensor_model_parallel_size=8), dict(world_size=8, tensor_model_parallel_size=8)),
    # PAR002 world % (ETP*EP*PP)
    ("PAR002", dict(expert_model_parallel_size=2, pipeline_model_parallel_size=8),
     dict(expert_model_parallel_size=2, pipeline_model_parallel_size=4)),
    ("PAR002", dict(expert_model_parallel_size=2, expert_tensor_parallel_size=8),
     dict(expert_model_parallel_size=2, expert_tensor_parallel_size=4)),
    ("PAR002", dict(expert_model_parallel_size=16), dict(expert_model_parallel_size=8)),
    ("PAR003", dict(num_moe_experts=6, expert_model_parallel_size=4), dict(num_moe_experts=8, expert_model_parallel_size=4)),
    ("PAR004", dict(num_attention_heads=12, tensor_model_parallel_size=8),
     dict(num_attention_heads=16, tensor_model_parallel_size=8)),
    # PAR005: groups % TP or TP % groups must be 0
    ("PAR005", dict(num_query_groups=6, tensor_model_parallel_size=4), dict(num_query_groups=8, tensor_model_parallel_size=4)),
    ("PAR005", dict(num_query_groups=3, tensor_model_parallel_size=2), dict(num_query_groups=2, tensor_model_parallel_size=4)),
    ("PAR006", dict(sequence_parallel=True, tensor_model_parallel_size=1),
     dict(sequence_parallel=True, tensor_model_parallel_size=2)),
    # PAR007 GBS % (MBS*DP): the micro batch and the DP term each
    ("PAR007", dict(global_batch_size=16, micro_batch_size=3), dict(global_batch_size=16, micro_batch_size=2)),
    ("PAR007", dict(global_batch_size=20, micro_batch_size=1, data_parallel_size=8),
     dict(global_batch_size=24, micro_batch_size=1, data_parallel_size=8)),
    ("PAR007", dict(global_batch_size=8, micro_batch_size=2, data_parallel_size=8),
     dict(global_batch_size=16, micro_batch_size=2, data_parallel_size=8)),
    ("PAR008", dict(context_parallel_size=2, seq_length=2050), dict(context_parallel_size=2, seq_length=2052)),
    ("PAR008", dict(context_parallel_size=4, seq_length=2052), dict(context_parallel_size=1, seq_length=2051)),
    # PAR009 EP>1 and TP>1 need sequence parallelism: each term
    ("PAR009", dict(expert_model_parallel_size=2, tensor_model_parallel_size=2),
     dict(expert_model_parallel_size=1, tensor_model_parallel_size=2)),
    ("PAR009", dict(expert_model_parallel_size=2, tensor_model_parallel_size=2),
     dict(expert_model_parallel_size=2, tensor_model_parallel_size=1)),
    ("PAR009", dict(expert_model_parallel_size=2, tensor_model_parallel_size=2),
     dict(expert_model_parallel_size=2, tensor_model_parallel_size=2, sequence_parallel=True)),
    ("PAR010", dict(add_bias_linear=True, expert_tensor_parallel_size=2),
     dict(add_bias_linear=True, expert_tensor_parallel_size=1)),
    ("PAR011", dict(num_moe_experts=8, expert_model_parallel_size=16, world_size=16),
     dict(num_moe_experts=16, expert_model_parallel_size=16, world_size=16)),
    # PAR012: each term alone: SP on the local spec fires; SP off, or the TE spec, is quiet
    ("PAR012", dict(sequence_parallel=True, tensor_model_parallel_size=2, transformer_impl="local"),
     dict(sequence_parallel=False, tensor_model_parallel_size=2, transformer_impl="local")),
    ("PAR012", dict(sequence_parallel=True, tensor_model_parallel_size=2, transformer_impl="local"),
     dict(sequence_parallel=True, tensor_model_parallel_size=2, transformer_impl="transformer_engine")),
    ("PP001", dict(virtual_pipeline_model_parallel_size=2), dict(virtual_pipeline_model_parallel_size=None)),
    ("PP002", dict(num_layers=9, pipeline_model_parallel_size=2), dict(num_layers=10, pipeline_model_parallel_size=2)),
    ("PP002", dict(num_layers=12, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=4,
                   overlap_p2p_comm=True),
     dict(num_layers=16, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=4, overlap_p2p_comm=True)),
    ("PP004", dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2),
     dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=True)),
    ("PP004", dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2),
     dict(pipeline_model_parallel_size=3, virtual_pipeline_model_parallel_size=2)),
    ("PP004", dict(pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=2),
     dict(pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=True)),
    # PP005 interleaving needs micro-batches >= PP: equal is legal
    ("PP005", dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=True,
                   data_parallel_size=4, global_batch_size=4),
     dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=True,
          data_parallel_size=4, global_batch_size=8)),
    ("PP005", dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, data_parallel_size=2,
                   global_batch_size=6),
     dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, data_parallel_size=2,
          global_batch_size=8)),
    ("PP006", dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=3, num_layers=11,
                   pipeline_model_parallel_layout="Et|t|t|t|t|t|t|t|t|t|t|L"),
     dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=3, num_layers=12,
          pipeline_model_parallel_layout="Et|t|t|t|t|t|t|t|t|t|t|tL")),
    ("OVL001", dict(**OVERLAP, expert_model_parallel_size=1), dict(**OVERLAP, expert_model_parallel_size=2)),
    ("OVL002", dict(**OVERLAP, moe_token_dispatcher_type="allgather"), dict(**OVERLAP, **FLEX_DEEPEP)),
    ("OVL003", dict(**OVERLAP, bf16=False), dict(**OVERLAP, bf16=False, fp16=True)),
    ("OVL004", dict(**OVERLAP, torch_version="2.5.1"), dict(**OVERLAP, torch_version="2.6.0")),
    ("OVL005", dict(**OVERLAP, pipeline_model_parallel_size=2),
     dict(**OVERLAP, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=True)),
    ("OVL006", dict(**OVERLAP, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
     dict(**OVERLAP, recompute_granularity="selective", recompute_modules=["core_attn"])),
    ("OVL009", dict(**OVERLAP, recompute_granularity="selective", recompute_modules=["moe"]),
     dict(**OVERLAP, recompute_granularity="selective", recompute_modules=["moe_act"])),
    ("OVL010", dict(**OVERLAP, moe_shared_expert_overlap=True), dict(**OVERLAP)),
    ("OVL011", dict(**OVERLAP, mtp_num_layers=2), dict(**OVERLAP, mtp_num_layers=1)),
    ("OVL012", dict(**OVERLAP, cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe"],
                    moe_expert_capacity_factor=1.0),
     dict(**OVERLAP, cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe_router", "moe_preprocess"])),
    ("OVL014", dict(**OVERLAP, global_batch_size=8), dict(**OVERLAP, global_batch_size=16)),
    ("OVL014", dict(**OVERLAP, global_batch_size=8),
     dict(**OVERLAP, global_batch_size=8, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
          overlap_p2p_comm=True)),
    ("DW001", dict(delay_wgrad_compute=True), dict(delay_wgrad_compute=True, **OVERLAP)),
    ("DW002", dict(delay_wgrad_compute=True, **OVERLAP, te_version=None), dict(delay_wgrad_compute=True, **OVERLAP)),
    ("DW003", dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.9.1", cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["moe_router", "moe_preprocess"], overlap_grad_reduce=False),
     dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.10.0", cuda_graph_impl="transformer_engine",
          cuda_graph_modules=["moe_router", "moe_preprocess"], overlap_grad_reduce=False)),
    ("DW004", dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.6.0"),
     dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.7.0")),
    ("DSP001", dict(**FLEX_DEEPEP, gpu_flex_backends=["hybridep"]), dict(**FLEX_DEEPEP, gpu_flex_backends=["deepep"])),
    # DSP003 DeepEP group sizes: 24 is in the list, 12 is not; a group of 1 is not DeepEP's business
    ("DSP003", dict(**FLEX_DEEPEP, expert_model_parallel_size=12, world_size=24, nvlink_domain=72),
     dict(**FLEX_DEEPEP, expert_model_parallel_size=24, world_size=24, nvlink_domain=72)),
    ("DSP003", dict(**FLEX_DEEPEP, expert_model_parallel_size=3, world_size=24, nvlink_domain=72),
     dict(**FLEX_DEEPEP, expert_model_parallel_size=2, world_size=24, nvlink_domain=72)),
    ("DSP004", dict(**FLEX_DEEPEP, expert_model_parallel_size=1), dict(**FLEX_DEEPEP, expert_model_parallel_size=2)),
    ("DSP004", dict(**FLEX_DEEPEP, expert_model_parallel_size=1), dict(expert_model_parallel_size=1)),
    # a backend left set under alltoall is not in use: DeepEP's group sizes do not apply
    ("DSP003", dict(**FLEX_DEEPEP, expert_model_parallel_size=12, world_size=24, nvlink_domain=72),
     dict(moe_flex_dispatcher_backend="deepep", expert_model_parallel_size=12, world_size=24, nvlink_domain=72)),
    ("DSP005", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=4), dict(**FLEX_HYBRIDEP, expert_model_parallel_size=8)),
    ("DSP006", dict(**FLEX_DEEPEP, expert_model_parallel_size=16, world_size=16),
     dict(**FLEX_DEEPEP, expert_model_parallel_size=8, world_size=16)),
    ("DSP006", dict(**FLEX_DEEPEP, expert_model_parallel_size=16, world_size=16),
     dict(**FLEX_DEEPEP, expert_model_parallel_size=4, world_size=16)),
    # DSP016 DeepEP past one node on Blackwell NVL8: a group of 16 over 8-GPU nodes warns, 8 (one node) does not;
    # the same group on Hopper does not (DSP006's general internode note covers it), nor HybridEP on Blackwell
    ("DSP016", dict(**FLEX_DEEPEP, expert_model_parallel_size=16, world_size=16, gpu_arch="blackwell"),
     dict(**FLEX_DEEPEP, expert_model_parallel_size=8, world_size=16, gpu_arch="blackwell")),
    ("DSP016", dict(**FLEX_DEEPEP, expert_model_parallel_size=16, world_size=16, gpu_arch="blackwell"),
     dict(**FLEX_DEEPEP, expert_model_parallel_size=16, world_size=16, gpu_arch="hopper")),
    ("DSP016", dict(**FLEX_DEEPEP, expert_model_parallel_size=16, world_size=16, gpu_arch="blackwell"),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=16, gpu_arch="blackwell")),
    # ETP counts in the group: EP 8 x ETP 2 spans two nodes
    ("DSP016", dict(**FLEX_DEEPEP, expert_model_parallel_size=8, expert_tensor_parallel_size=2, world_size=16,
                    gpu_arch="blackwell"),
     dict(**FLEX_DEEPEP, expert_model_parallel_size=8, world_size=16, gpu_arch="blackwell")),
    # DSP017 HybridEP past one NVLink domain needs DeepEP's multi-node build: a group of 16 over 8-GPU nodes warns,
    # 8 (one node) does not, nor 16 inside one NVL72 rack's segment, nor DeepEP (DSP006 covers it)
    ("DSP017", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=16),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=8, world_size=16)),
    ("DSP017", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=16),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=16, nvlink_domain=16)),
    ("DSP017", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=16),
     dict(**FLEX_DEEPEP, expert_model_parallel_size=16, world_size=16)),
    # DSP018 HybridEP groups that straddle NVLink domains: 16 in a 72-GPU segment (36 GB200 trays) fails, 8 and 24
    # (divisors of 72) pass, 16 in a 64-GPU segment (64 trays as 4 x 16) passes; 6 over 8-GPU nodes fails; a
    # group larger than the domain is DSP005's; alltoall has no per-domain setting
    ("DSP018", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=144, nvlink_domain=72),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=8, world_size=144, nvlink_domain=72)),
    ("DSP018", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=144, nvlink_domain=72),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=24, world_size=144, nvlink_domain=72)),
    ("DSP018", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=144, nvlink_domain=72),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=256, nvlink_domain=64)),
    ("DSP018", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=6, world_size=48),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=48)),
    ("DSP018", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=16, world_size=144, nvlink_domain=72),
     dict(moe_token_dispatcher_type="alltoall", expert_model_parallel_size=16, world_size=144, nvlink_domain=72)),
    # DSP019 an SM budget only a flex dispatcher reads: set with alltoall warns, with HybridEP or unset it does not
    ("DSP019", dict(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_num_sms=24),
     dict(**FLEX_HYBRIDEP, moe_flex_dispatcher_num_sms=24)),
    ("DSP019", dict(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_num_sms=24),
     dict(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_num_sms=None)),
    ("DSP007", dict(moe_shared_expert_overlap=True, moe_shared_expert_intermediate_size=512,
                    moe_token_dispatcher_type="allgather"),
     dict(moe_shared_expert_overlap=True, moe_shared_expert_intermediate_size=512)),
    # DSP008 SM count must be even: 26 is legal (not a multiple of 4), 25 is not
    ("DSP008", dict(**FLEX_DEEPEP, moe_flex_dispatcher_num_sms=25), dict(**FLEX_DEEPEP, moe_flex_dispatcher_num_sms=26)),
    ("DSP008", dict(**FLEX_DEEPEP, moe_flex_dispatcher_num_sms=25), dict(moe_flex_dispatcher_num_sms=25)),
    # DSP004 holds for NCCL EP too (token_dispatcher.py 'NCCL EP dispatcher requires TPxEP > 1'): ETP counts
    ("DSP004", dict(**FLEX_NCCLEP, expert_model_parallel_size=1), dict(**FLEX_NCCLEP, expert_model_parallel_size=2)),
    ("DSP004", dict(**FLEX_NCCLEP, expert_model_parallel_size=1),
     dict(**FLEX_NCCLEP, expert_model_parallel_size=1, expert_tensor_parallel_size=2)),
    # DSP010 Bridge's GPU check (major 9 or 10: the catalogue's legal list), only under the flex dispatcher
    ("DSP010", dict(**{**FLEX_NCCLEP, "gpu_flex_backends": ["deepep", "hybridep"]}), dict(**FLEX_NCCLEP)),
    ("DSP010", dict(**{**FLEX_NCCLEP, "gpu_flex_backends": ["deepep", "hybridep"]}),
     dict(moe_flex_dispatcher_backend="ncclep", gpu_flex_backends=["deepep", "hybridep"])),
    # DSP011 Transformer Engine with transformer_engine.pytorch.ep: 2.17.0 is the first; no TE at all fails
    ("DSP011", dict(**{**FLEX_NCCLEP, "te_version": "2.16.1"}), dict(**FLEX_NCCLEP)),
    ("DSP011", dict(**{**FLEX_NCCLEP, "te_version": "2.12.0"}), dict(**{**FLEX_NCCLEP, "te_version": "2.18.0"})),
    ("DSP011", dict(**{**FLEX_NCCLEP, "te_version": None}), dict(**FLEX_NCCLEP)),
    ("DSP011", dict(**{**FLEX_NCCLEP, "te_version": "2.12.0"}), dict(te_version="2.12.0")),
    # DSP012 megatron-core 0.19.0 first has the NCCL EP dispatcher; DSP013 Bridge 0.6.2 first accepts 'ncclep'
    ("DSP012", dict(**FLEX_NCCLEP, mcore_version="0.18.2"), dict(**FLEX_NCCLEP, mcore_version="0.19.0")),
    ("DSP012", dict(**FLEX_NCCLEP, mcore_version="0.18.2"), dict(mcore_version="0.18.2")),
    ("DSP013", dict(**FLEX_NCCLEP, bridge_version="0.6.1"), dict(**FLEX_NCCLEP, bridge_version="0.6.2")),
    ("DSP013", dict(**FLEX_NCCLEP, bridge_version="0.6.1"), dict(bridge_version="0.6.1")),
    # DSP014 needs all three: ncclep, EP overlap, expert_fc1 offloaded
    ("DSP014", dict(**FLEX_NCCLEP, **OVERLAP, offload_modules=["expert_fc1"]),
     dict(**FLEX_NCCLEP, **OVERLAP, offload_modules=["moe_act"])),
    ("DSP014", dict(**FLEX_NCCLEP, **OVERLAP, offload_modules=["expert_fc1"]),
     dict(**FLEX_NCCLEP, offload_modules=["expert_fc1"])),
    ("DSP014", dict(**FLEX_NCCLEP, **OVERLAP, offload_modules=["moe_act", "expert_fc1"]),
     dict(**FLEX_HYBRIDEP, **OVERLAP, expert_model_parallel_size=8, offload_modules=["moe_act", "expert_fc1"])),
    # DSP015 EP overlap with ncclep (no static shape): warned, on ncclep only
    ("DSP015", dict(**FLEX_NCCLEP, **OVERLAP), dict(**FLEX_NCCLEP)),
    ("DSP015", dict(**FLEX_NCCLEP, **OVERLAP), dict(**FLEX_DEEPEP, **OVERLAP)),
    ("DSP009", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=8, fp8_dispatch=True),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=8)),
    ("RC001", dict(recompute_granularity="selective", recompute_modules=["moe_act"], moe_grouped_gemm=False),
     dict(recompute_granularity="selective", recompute_modules=["moe_act"], moe_grouped_gemm=True)),
    ("RC002", dict(recompute_granularity="selective", recompute_modules=["mla_up_proj"]),
     dict(recompute_granularity="selective", recompute_modules=["mla_up_proj"], multi_latent_attention=True)),
    ("RC003", dict(recompute_granularity="full", recompute_method="uniform"),
     dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)),
    ("RC003", dict(recompute_granularity="full", recompute_num_layers=1),
     dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=1)),
    # RC004 selective recompute takes neither a method nor a layer count: each clause
    ("RC004", dict(recompute_granularity="selective", recompute_modules=["core_attn"], recompute_method="uniform"),
     dict(recompute_granularity="selective", recompute_modules=["core_attn"])),
    ("RC004", dict(recompute_granularity="selective", recompute_modules=["core_attn"], recompute_num_layers=1),
     dict(recompute_granularity="selective", recompute_modules=["core_attn"])),
    ("RC005", dict(recompute_granularity="selective", recompute_modules=["shared_experts"],
                   moe_shared_expert_overlap=True, moe_shared_expert_intermediate_size=512),
     dict(recompute_granularity="selective", recompute_modules=["shared_experts"],
          moe_shared_expert_intermediate_size=512)),
    ("RC006", dict(fp8="delayed", recompute_granularity="selective", recompute_modules=["layernorm"]),
     dict(fp8="tensorwise", recompute_granularity="selective", recompute_modules=["layernorm"])),
    ("RC007", dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=9),
     dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=8)),
    ("RC007", dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=0),
     dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)),
    ("RC008", dict(fp8="tensorwise", te_version="2.5.0", recompute_granularity="selective", recompute_modules=["moe_act"]),
     dict(fp8="tensorwise", te_version="2.6.0", recompute_granularity="selective", recompute_modules=["moe_act"])),
    ("RC008", dict(fp8="tensorwise", te_version="2.5.0", recompute_granularity="selective", recompute_modules=["moe_act"]),
     dict(fp8="tensorwise", te_version="2.5.0")),
    # RC009: layernorm in the selective list on the local spec; other modules, the TE spec, full recompute
    # or another Megatron-Core version (the rule is keyed to 0.19.2, where it was seen) are quiet
    ("RC009", dict(transformer_impl="local", recompute_granularity="selective", recompute_modules=["layernorm"]),
     dict(transformer_impl="local", recompute_granularity="selective", recompute_modules=["core_attn"])),
    ("RC009", dict(transformer_impl="local", recompute_granularity="selective", recompute_modules=["layernorm"]),
     dict(transformer_impl="transformer_engine", recompute_granularity="selective", recompute_modules=["layernorm"])),
    ("RC009", dict(transformer_impl="local", recompute_granularity="selective", recompute_modules=["layernorm"]),
     dict(transformer_impl="local", recompute_granularity="selective", recompute_modules=["layernorm"],
          mcore_version="0.20.0")),
    ("CG001", dict(cuda_graph_impl="local"), dict(cuda_graph_impl="none")),
    ("CG001", dict(cuda_graph_impl="local"), dict(cuda_graph_impl="full_iteration")),
    ("CG002", dict(cuda_graph_impl="full_iteration", cuda_graph_modules=["attn"]),
     dict(cuda_graph_impl="full_iteration", cuda_graph_modules=None)),
    ("CG002", dict(cuda_graph_impl="full_iteration", cuda_graph_modules=["attn"]),
     dict(cuda_graph_impl=None, cuda_graph_modules=["attn"])),
    ("CG003", dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe", "moe_router", "attn"],
                   moe_expert_capacity_factor=1.0),
     dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe", "attn"], moe_expert_capacity_factor=1.0)),
    ("CG003", dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe", "moe_router"],
                   moe_expert_capacity_factor=1.0),
     dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe"], moe_expert_capacity_factor=1.0)),
    ("CG004", dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe_preprocess"]),
     dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe_router", "moe_preprocess"])),
    ("CG005", dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["mlp"]),
     dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["mlp"], first_k_dense=1)),
    ("CG006", dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe"]),
     dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe"], moe_expert_capacity_factor=1.0)),
    ("CG007", dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
                   cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"]),
     dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
          cuda_graph_impl="full_iteration")),
    ("CG008", dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe_router"],
                   recompute_granularity="selective", recompute_modules=["moe"]),
     dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe_router"],
          recompute_granularity="selective", recompute_modules=["moe_act"])),
    ("CG009", dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"], te_version=None),
     dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"])),
    # PREC001 FP8 and FP4 each need Transformer Engine
    ("PREC001", dict(fp4="nvfp4", te_version=None, gpu_arch="blackwell"),
     dict(fp4="nvfp4", te_version="2.12.0", gpu_arch="blackwell")),
    ("PREC001", dict(fp8="tensorwise", te_version=None), dict(fp8="tensorwise")),
    # PREC002 MXFP8 and FP4 need Blackwell: not Ampere, not Hopper
    ("PREC002", dict(fp4="nvfp4", gpu_arch="ampere"), dict(fp4="nvfp4", gpu_arch="blackwell")),
    ("PREC002", dict(fp4="nvfp4", gpu_arch="hopper"), dict(fp4="nvfp4", gpu_arch="blackwell")),
    ("PREC002", dict(fp8="mxfp8", gpu_arch="hopper"), dict(fp8="tensorwise", gpu_arch="hopper")),
    ("PREC003", dict(fp8="tensorwise", gpu_arch="ampere"), dict(fp8="tensorwise", gpu_arch="hopper")),
    ("PREC004", dict(fp4="nvfp4", gpu_arch="blackwell", te_version="2.6.0"),
     dict(fp4="nvfp4", gpu_arch="blackwell", te_version="2.7.0")),
    ("MOE001", dict(moe_grouped_gemm=True, te_version=None), dict(moe_grouped_gemm=False, te_version=None)),
    ("MOE002", dict(moe_router_force_load_balancing=True), dict(moe_router_force_load_balancing=False)),
    ("ENV001", dict(**OVERLAP, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
     dict(**OVERLAP, env={"CUDA_DEVICE_MAX_CONNECTIONS": "32"})),
    # MEM001: above what a plan may fill: the planner's headroom (92 % of 80 GiB = 73.6), also before the final
    # pass sets the limit; a shipped recipe run as shipped: 80 GiB plus the estimate's measured error (85.92)
    ("MEM001", dict(memory_estimate_gib=73.61, memory_limit_gib=73.6), dict(memory_estimate_gib=73.6, memory_limit_gib=73.6)),
    ("MEM001", dict(memory_estimate_gib=73.61, memory_limit_gib=None), dict(memory_estimate_gib=73.6, memory_limit_gib=None)),
    ("MEM001", dict(shipped_recipe="r_config", memory_estimate_gib=85.93, memory_limit_gib=85.92),
     dict(shipped_recipe="r_config", memory_estimate_gib=85.92, memory_limit_gib=85.92)),
    # MEM003: above the host memory a node may pin (75 % of a DGX's 2048 GiB = 1536); no catalogue figure: no limit
    ("MEM003", dict(memory_host_node_gib=1536.1, host_memory_limit_gib=1536.0),
     dict(memory_host_node_gib=1536.0, host_memory_limit_gib=1536.0)),
    ("MEM003", dict(memory_host_node_gib=1536.1, host_memory_limit_gib=1536.0),
     dict(memory_host_node_gib=1536.1, host_memory_limit_gib=None)),
    # MEM002: a shipped recipe run as shipped, over the GPU's 80 GiB and at most its limit; not any other plan
    ("MEM002", dict(shipped_recipe="r_config", memory_estimate_gib=80.01, memory_limit_gib=85.92),
     dict(shipped_recipe="r_config", memory_estimate_gib=80.0, memory_limit_gib=85.92)),
    ("MEM002", dict(shipped_recipe="r_config", memory_estimate_gib=85.92, memory_limit_gib=85.92),
     dict(shipped_recipe="r_config", memory_estimate_gib=85.93, memory_limit_gib=85.92)),
    ("MEM002", dict(shipped_recipe="r_config", memory_estimate_gib=80.01, memory_limit_gib=85.92),
     dict(shipped_recipe=None, memory_estimate_gib=80.01, memory_limit_gib=85.92)),
    ("VER001", dict(torch_version="2.5.9"), dict(torch_version="2.6.0")),
    # OPT001 Muon and fp16: each term on its own
    ("OPT001", dict(optimizer="muon", bf16=False, fp16=True), dict(optimizer="muon", bf16=True, fp16=False)),
    ("OPT001", dict(optimizer="muon", bf16=False, fp16=True), dict(optimizer="adam", bf16=False, fp16=True)),
    # OPT002 / OPT003 Muon needs megatron-core >= 0.16.0 and Megatron-Bridge >= 0.3.0 (the catalogue's versions)
    ("OPT002", dict(optimizer="muon", mcore_version="0.15.3"), dict(optimizer="muon", mcore_version="0.16.0")),
    ("OPT002", dict(optimizer="muon", mcore_version="0.15.3"), dict(optimizer="adam", mcore_version="0.15.3")),
    ("OPT003", dict(optimizer="muon", bridge_version="0.2.2"), dict(optimizer="muon", bridge_version="0.3.0")),
    ("OPT003", dict(optimizer="muon", bridge_version="0.2.2"), dict(optimizer="adam", bridge_version="0.2.2")),
    # DET001/DET002 deterministic mode against the user's launch environment: each term on its own
    ("DET001", dict(deterministic_mode=True, env={"NCCL_ALGO": "NVLS"}),
     dict(deterministic_mode=True, env={"NCCL_ALGO": "Tree"})),
    ("DET001", dict(deterministic_mode=True, env={"NCCL_ALGO": "NVLS"}),
     dict(deterministic_mode=False, env={"NCCL_ALGO": "NVLS"})),
    ("DET001", dict(deterministic_mode=True, env={"NCCL_ALGO": "ring"}), dict(deterministic_mode=True, env={})),  # case matters
    ("DET002", dict(deterministic_mode=True, te_version="2.12.0", env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}),
     dict(deterministic_mode=True, te_version="2.12.0", env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"})),
    ("DET002", dict(deterministic_mode=True, te_version="2.12.0", env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}),
     dict(deterministic_mode=True, te_version=None, env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"})),
    ("DET002", dict(deterministic_mode=True, te_version="2.12.0", env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}),
     dict(deterministic_mode=False, te_version="2.12.0", env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"})),
    # OPT004-OPT007 Adam's memory levers: each term on its own
    ("OPT004", dict(optimizer="muon", optimizer_state="fp32-remainders"), dict(optimizer="muon", optimizer_state="fp32")),
    ("OPT004", dict(optimizer="muon", optimizer_state="bf16-moments"), dict(optimizer="adam", optimizer_state="bf16-moments",
                                                                         te_version="2.12.0")),
    ("OPT005", dict(optimizer_state="fp32-remainders", te_version=None, optimizer_offload_fraction=0.0),
     dict(optimizer_state="fp32-remainders", te_version="2.12.0", optimizer_offload_fraction=0.0)),
    ("OPT005", dict(optimizer_state="bf16-moments", te_version=None, optimizer_offload_fraction=0.0),
     dict(optimizer_state="fp32", te_version=None, optimizer_offload_fraction=0.0)),
    ("OPT006", dict(optimizer_state="bf16-moments", optimizer_offload_fraction=0.25, te_version="2.12.0"),
     dict(optimizer_state="bf16-moments", optimizer_offload_fraction=0.0, te_version="2.12.0")),
    ("OPT006", dict(optimizer_state="fp32-remainders", optimizer_offload_fraction=1.0, te_version="2.12.0"),
     dict(optimizer_state="fp32", optimizer_offload_fraction=1.0, te_version="2.12.0")),
    ("OPT007", dict(optimizer="muon", optimizer_offload_fraction=0.25), dict(optimizer="muon", optimizer_offload_fraction=0.0)),
    ("OPT007", dict(optimizer="muon", optimizer_offload_fraction=1.0), dict(optimizer="adam", optimizer_offload_fraction=1.0)),
    # AOF001-AOF005 fine-grained activation offload
    ("AOF001", dict(offload_modules=["attn_proj"]), dict(offload_modules=["core_attn", "attn_proj"])),
    ("AOF002", dict(offload_modules=["expert_fc1"], recompute_granularity="selective", recompute_modules=["moe"]),
     dict(offload_modules=["expert_fc1"], recompute_granularity="selective", recompute_modules=["moe_act"])),
    ("AOF002", dict(offload_modules=["moe_act"], recompute_granularity="selective", recompute_modules=["moe"]),
     dict(offload_modules=["moe_act"], recompute_granularity="full", recompute_modules=["moe"])),
    ("AOF003", dict(offload_modules=["core_attn"], te_version=None), dict(offload_modules=[], te_version=None)),
    ("AOF003", dict(offload_modules=["core_attn"], te_version=None), dict(offload_modules=["core_attn"], te_version="2.12.0")),
    ("AOF004", dict(offload_modules=["core_attn"], te_version="2.12.0", env={"NVTE_CPU_OFFLOAD_V1": "0"}),
     dict(offload_modules=["core_attn"], te_version="2.12.0", env={"NVTE_CPU_OFFLOAD_V1": "1"})),
    ("AOF004", dict(offload_modules=["core_attn"], te_version="2.12.0", env={"NVTE_CPU_OFFLOAD_V1": "0"}),
     dict(offload_modules=[], te_version="2.12.0", env={"NVTE_CPU_OFFLOAD_V1": "0"})),
    ("AOF005", dict(offload_modules=["moe_act", "core_attn"], cuda_graph_impl="local"),
     dict(offload_modules=["moe_act", "expert_fc1"], cuda_graph_impl="local")),
    ("AOF005", dict(offload_modules=["core_attn"], cuda_graph_impl="local"),
     dict(offload_modules=["core_attn"], cuda_graph_impl="transformer_engine")),
    # FSD001-FSD004 Megatron-FSDP: each clause flipped on its own, VPP at its boundary (1 vs 2)
    ("FSD001", dict(use_megatron_fsdp=True, overlap_moe_expert_parallel_comm=True, virtual_pipeline_model_parallel_size=2),
     dict(use_megatron_fsdp=True, overlap_moe_expert_parallel_comm=True, virtual_pipeline_model_parallel_size=1)),
    ("FSD001", dict(use_megatron_fsdp=True, overlap_moe_expert_parallel_comm=True, virtual_pipeline_model_parallel_size=2),
     dict(use_megatron_fsdp=True, overlap_moe_expert_parallel_comm=False, virtual_pipeline_model_parallel_size=2)),
    ("FSD001", dict(use_megatron_fsdp=True, overlap_moe_expert_parallel_comm=True, virtual_pipeline_model_parallel_size=2),
     dict(use_megatron_fsdp=False, overlap_moe_expert_parallel_comm=True, virtual_pipeline_model_parallel_size=2)),
    ("FSD002", dict(use_megatron_fsdp=True, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
     dict(use_megatron_fsdp=True, env={"CUDA_DEVICE_MAX_CONNECTIONS": "2"})),
    ("FSD002", dict(use_megatron_fsdp=True, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
     dict(use_megatron_fsdp=False, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})),
    ("FSD002", dict(use_megatron_fsdp=True, env={"CUDA_DEVICE_MAX_CONNECTIONS": 1}), dict(use_megatron_fsdp=True, env={})),
    ("FSD003", dict(use_megatron_fsdp=True, data_parallel_size=1, expert_data_parallel_size=1),
     dict(use_megatron_fsdp=True, data_parallel_size=2, expert_data_parallel_size=1)),
    ("FSD003", dict(use_megatron_fsdp=True, data_parallel_size=1, expert_data_parallel_size=1),
     dict(use_megatron_fsdp=True, data_parallel_size=1, expert_data_parallel_size=2)),
    ("FSD003", dict(use_megatron_fsdp=True, data_parallel_size=1, expert_data_parallel_size=1),
     dict(use_megatron_fsdp=False, data_parallel_size=1, expert_data_parallel_size=1)),
    ("FSD004", dict(use_megatron_fsdp=True, save="/ckpt", ckpt_format="torch_dist"),
     dict(use_megatron_fsdp=True, save="/ckpt", ckpt_format="fsdp_dtensor")),
    ("FSD004", dict(use_megatron_fsdp=True, load="/ckpt", ckpt_format="torch_dist"),
     dict(use_megatron_fsdp=True, ckpt_format="torch_dist")),  # nothing saved or loaded: the format is never used
    ("FSD004", dict(use_megatron_fsdp=True, save="/ckpt", ckpt_format="torch_dist"),
     dict(use_megatron_fsdp=False, save="/ckpt", ckpt_format="torch_dist")),
    # FSD005: any offload share with FSDP; none, or no FSDP, passes
    ("FSD005", dict(use_megatron_fsdp=True, optimizer_offload_fraction=0.25),
     dict(use_megatron_fsdp=True, optimizer_offload_fraction=0.0)),
    ("FSD005", dict(use_megatron_fsdp=True, optimizer_offload_fraction=0.25),
     dict(use_megatron_fsdp=False, optimizer_offload_fraction=0.25)),
    ("CKPT005", dict(save="/ckpt", ckpt_format="fsdp_dtensor"), dict(save="/ckpt", ckpt_format="fsdp_dtensor",
                                                                      use_megatron_fsdp=True)),
    ("OVL007", dict(**OVERLAP, recompute_method="uniform"), dict(**OVERLAP)),
    ("OVL008", dict(**OVERLAP, recompute_num_layers=1), dict(**OVERLAP)),
    ("OVL013", dict(**OVERLAP, num_moe_experts=1, expert_model_parallel_size=1),
     dict(**OVERLAP, num_moe_experts=2, expert_model_parallel_size=2)),
    ("PP003", dict(pipeline_model_parallel_size=2, pipeline_model_parallel_layout="Ettt|ttttL"),
     dict(pipeline_model_parallel_size=2, pipeline_model_parallel_layout="Etttt|ttttL")),
    ("DSP002", dict(**FLEX_HYBRIDEP, expert_model_parallel_size=8, gpu_flex_backends=["deepep"]),
     dict(**FLEX_HYBRIDEP, expert_model_parallel_size=8, gpu_flex_backends=["hybridep"])),
    ("DW005", dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.11.0", cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["attn"]),
     dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.12.0", cuda_graph_impl="transformer_engine",
          cuda_graph_modules=["attn"])),
    # DW005: delayed wgrad AND TE graphs AND (attn scope, or the router scope with unoverlapped shared experts)
    ("DW005", dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.11.0", cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["moe_router", "moe_preprocess"], moe_shared_expert_intermediate_size=512),
     dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.11.0", cuda_graph_impl="transformer_engine",
          cuda_graph_modules=["moe_router", "moe_preprocess"])),
    ("DW005", dict(delay_wgrad_compute=True, **OVERLAP, te_version="2.11.0", cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["attn"]),
     dict(**OVERLAP, te_version="2.11.0", cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"])),
    # DW007: graphed weight gradients need gradient_accumulation_fusion, which is off without Apex (issue 11)
    ("DW007", dict(delay_wgrad_compute=True, **OVERLAP, cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["attn"], gradient_accumulation_fusion=False),
     dict(delay_wgrad_compute=True, **OVERLAP, cuda_graph_impl="transformer_engine",
          cuda_graph_modules=["attn"], gradient_accumulation_fusion=True)),
    ("DW007", dict(delay_wgrad_compute=True, **OVERLAP, cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["moe_router"], moe_shared_expert_intermediate_size=512,
                   gradient_accumulation_fusion=False),
     dict(delay_wgrad_compute=True, **OVERLAP, cuda_graph_impl="transformer_engine",
          cuda_graph_modules=["moe_router"], gradient_accumulation_fusion=False)),
    ("DW007", dict(delay_wgrad_compute=True, **OVERLAP, cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["attn"], gradient_accumulation_fusion=False),
     dict(**OVERLAP, cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"],
          gradient_accumulation_fusion=False)),
    ("DW006", dict(delay_wgrad_compute=True, **OVERLAP, cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["attn"], add_bias_linear=True),
     dict(delay_wgrad_compute=True, **OVERLAP, cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"])),
    ("TOK001", dict(tokenizer_vocab_size=32001, vocab_size=32000), dict(tokenizer_vocab_size=32000, vocab_size=32000)),
    ("TOK002", dict(data_type="gpt", tokenizer_type="NullTokenizer"),
     dict(data_type="gpt", tokenizer_type="HuggingFaceTokenizer")),
    ("DATA001", dict(eval_interval=10, split="100,0,0"), dict(eval_interval=10, split="99,1,0")),
    # the flex backend's own package, missing on the probed cluster; another package missing, or no probe
    ("CLU001", dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep", cluster_missing=["deep_ep"]),
     dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep", cluster_missing=["hybrid_ep"])),
    ("CLU001", dict(FLEX_HYBRIDEP, cluster_missing=["apex", "hybrid_ep"]), dict(FLEX_HYBRIDEP, cluster_missing=None)),
    ("CLU001", dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep", cluster_missing=["deep_ep"]),
     dict(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None, cluster_missing=["deep_ep"])),
    # a multi-node Kubernetes job without an RDMA resource; one node, a resource, or no Kubernetes target
    ("LAU002", dict(kubernetes_target=True, nodes=2, kubernetes_rdma=None),
     dict(kubernetes_target=True, nodes=1, kubernetes_rdma=None)),
    ("LAU002", dict(kubernetes_target=True, nodes=2, kubernetes_rdma=None),
     dict(kubernetes_target=True, nodes=2, kubernetes_rdma=["rdma/ib", 1])),
    ("LAU002", dict(kubernetes_target=True, nodes=2, kubernetes_rdma=None),
     dict(kubernetes_target=False, nodes=2, kubernetes_rdma=None)),
    # pyxis' separators: one ',' or ':' anywhere in any mounted folder, against the same path without it
    ("LAU001", dict(container_mounts=["/data", "/ckpt,a"]), dict(container_mounts=["/data", "/ckpt-a"])),
    ("LAU001", dict(container_mounts=["/a:b"]), dict(container_mounts=["/a;b"])),
    ("LAU001", dict(container_mounts=["/a:b"]), dict(container_mounts=None)),  # no container: nothing mounted
    ("DATA001", dict(eval_interval=10, split="100,0,0"), dict(eval_interval=10, split=None)),
    ("CKPT001", dict(load="/ckpt"), dict(load="/ckpt", save="/ckpt")),
    ("CKPT002", dict(async_save=True, save="/ckpt", ckpt_format="torch"),
     dict(async_save=True, save="/ckpt", ckpt_format="torch_dist")),
    ("CKPT003", dict(async_save=True), dict(async_save=True, save="/ckpt")),
    ("CKPT004", dict(save="/ckpt", save_interval=101), dict(save="/ckpt", save_interval=100)),
    ("CKPT004", dict(save="/ckpt", save_interval=101), dict(save="/ckpt", save_interval=50)),
    ("CKPT005", dict(ckpt_format="fsdp_dtensor", save="/ckpt"), dict(ckpt_format="fsdp_dtensor")),
    ("CKPT006", dict(ckpt_format="torch_dcp", save="/ckpt"), dict(ckpt_format="torch_dist", save="/ckpt")),
    ("CKPT006", dict(ckpt_format="torch", load="/ckpt"), dict(ckpt_format="torch")),
    ("CKPT006", dict(ckpt_format="torch", pretrained_checkpoint="/base"), dict(ckpt_format="torch")),
    ("LOG001", dict(log_interval=101), dict(log_interval=100)),
    ("LOG001", dict(log_interval=2, train_iters=1), dict(log_interval=None, train_iters=1)),
    ("CKPT007", dict(load="/ckpt", save="/ckpt", te_version=None), dict(load="/ckpt", save="/ckpt")),
    # MOE003: a dense prefix must leave at least one MoE layer (7 of 8 passes, 8 of 8 fails).
    ("MOE003", dict(first_k_dense=8, num_layers=8), dict(first_k_dense=7, num_layers=8)),
    ("MOE003", dict(first_k_dense=9, num_layers=8), dict(first_k_dense=None, num_layers=8)),
    # PAR014: a node of the GPU's own size passes, one more GPU per host warns (H100: HGX/DGX 8; GB200: a tray of 4)
    ("PAR014", dict(gpu="h100", gpus_per_node=9), dict(gpu="h100", gpus_per_node=8)),
    ("PAR014", dict(gpu="gb200", gpus_per_node=8), dict(gpu="gb200", gpus_per_node=4)),
    # MOE004: top-k may equal the expert count (every expert, every token), one more cannot be picked
    ("MOE004", dict(moe_router_topk=17, num_moe_experts=16), dict(moe_router_topk=16, num_moe_experts=16)),
    # PAR013: heads a multiple of the KV groups (16 over 8 passes, over 6 fails); MHA (groups = heads) passes
    ("PAR013", dict(num_attention_heads=16, num_query_groups=6), dict(num_attention_heads=16, num_query_groups=8)),
    ("PAR013", dict(num_attention_heads=7, num_query_groups=3), dict(num_attention_heads=7, num_query_groups=7)),
    # PAR015: a head width that is the floor of hidden / heads warns only where the division leaves a remainder
    # (1000 / 16 = 62.5); one head width more than the floor is a width the user chose; 1024 / 16 divides; MLA's
    # kv_channels is its value head width, not a split of the hidden size
    ("PAR015", dict(hidden_size=1000, num_attention_heads=16, kv_channels=62),
     dict(hidden_size=1000, num_attention_heads=16, kv_channels=63)),
    ("PAR015", dict(hidden_size=1000, num_attention_heads=16, kv_channels=62),
     dict(hidden_size=992, num_attention_heads=16, kv_channels=62)),
    ("PAR015", dict(hidden_size=1000, num_attention_heads=16, kv_channels=62),
     dict(hidden_size=1000, num_attention_heads=16, kv_channels=62, multi_latent_attention=True)),
    # PROF: torch's schedule needs end - start >= 1; the stop runs only at step == end (<= train_iters);
    # a rank outside the job records nothing; without a TensorBoard folder the trace lands in ./torch_profile.
    ("PROF001", dict(PROFILE, profile_step_start=4, profile_step_end=4),
     dict(PROFILE, profile_step_start=4, profile_step_end=5)),
    ("PROF001", dict(PROFILE, profile_step_start=5, profile_step_end=4),
     dict(PROFILE, use_pytorch_profiler=False, profile_step_start=5, profile_step_end=4)),
    ("PROF002", dict(PROFILE, profile_step_end=11, train_iters=10), dict(PROFILE, profile_step_end=10, train_iters=10)),
    ("PROF002", dict(PROFILE, profile_step_end=11, train_iters=10),
     dict(PROFILE, use_pytorch_profiler=False, profile_step_end=11, train_iters=10)),
    ("PROF003", dict(PROFILE, profile_ranks=[0, 8], world_size=8), dict(PROFILE, profile_ranks=[0, 7], world_size=8)),
    ("PROF003", dict(PROFILE, profile_ranks=[8], world_size=8),
     dict(PROFILE, use_pytorch_profiler=False, profile_ranks=[8], world_size=8)),
    ("PROF004", dict(PROFILE, tensorboard_dir=None), dict(PROFILE, tensorboard_dir="/tb")),
    ("PROF004", dict(PROFILE, tensorboard_dir=None), dict(PROFILE, use_pytorch_profiler=False, tensorboard_dir=None)),
]


@pytest.mark.parametrize("rule,fails,passes", BOUNDARIES,
                         ids=[f"{r}-{'-'.join(f'{k}={v}' for k, v in f.items() if k not in OVERLAP)[:60]}"
                              for r, f, _ in BOUNDARIES])
def test_rule_boundary(base, rule, fails, passes):
    assert rule in by_id(), f"{rule} has boundary cases but is missing from the rule catalogue"
    assert broken(base, rule, **fails), f"{rule} should fire on {fails}"
    assert not broken(base, rule, **passes), f"{rule} should be quiet on {passes}"


def test_every_rule_has_a_boundary_case():
    covered = {r for r, _, _ in BOUNDARIES}
    assert sorted(set(by_id()) - covered) == []


# --- sweeps: rules over several sizes, against the rule as the upstream source states it -------

SIZES = (1, 2, 3, 4, 6, 8)


@pytest.mark.parametrize("world", (1, 2, 4, 6, 8, 12, 16, 24))
def test_model_and_expert_grids_divide_the_world(base, world):
    for tp, pp, cp in itertools.product(SIZES, repeat=3):
        expect = world % (tp * pp * cp) != 0  # Bridge set_data_parallel_size
        assert CHECKS["PAR001"]({**base, "world_size": world, "tensor_model_parallel_size": tp,
                                 "pipeline_model_parallel_size": pp, "context_parallel_size": cp}) == expect
    for ep, etp, pp in itertools.product(SIZES, repeat=3):
        expect = world % (etp * ep * pp) != 0  # parallel_state expert grid
        assert CHECKS["PAR002"]({**base, "world_size": world, "expert_model_parallel_size": ep,
                                 "expert_tensor_parallel_size": etp, "pipeline_model_parallel_size": pp}) == expect


def test_batch_and_interleaving_sweep(base):
    for gbs, mbs, dp, pp, vpp in itertools.product((1, 2, 3, 4, 6, 8, 12, 16), (1, 2, 3, 4), (1, 2, 4), (1, 2, 4),
                                                   (None, 2)):
        cfg = {**base, "global_batch_size": gbs, "micro_batch_size": mbs, "data_parallel_size": dp,
               "pipeline_model_parallel_size": pp, "virtual_pipeline_model_parallel_size": vpp}
        assert CHECKS["PAR007"](cfg) == (gbs % (mbs * dp) != 0)
        microbatches = gbs // (mbs * dp)
        assert CHECKS["PP005"](cfg) == (vpp is not None and pp > 1 and microbatches < pp)


def test_deepep_group_sizes_sweep(base):
    for ep, etp in itertools.product(range(1, 41), (1, 2, 3)):
        group = ep * etp
        cfg = {**base, **FLEX_DEEPEP, "expert_model_parallel_size": ep, "expert_tensor_parallel_size": etp}
        assert CHECKS["DSP003"](cfg) == (group > 1 and group not in (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)), group
    assert DEEPEP_GROUP_SIZES == (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)


def test_sm_count_sweep(base):
    for sms in range(0, 41):
        assert CHECKS["DSP008"]({**base, **FLEX_DEEPEP, "moe_flex_dispatcher_num_sms": sms}) == (sms % 2 == 1)


def test_tensor_expert_parallel_sweep(base):
    for ep, tp, sp in itertools.product((1, 2, 4), (1, 2, 4), (False, True)):
        cfg = {**base, "expert_model_parallel_size": ep, "tensor_model_parallel_size": tp, "sequence_parallel": sp}
        assert CHECKS["PAR009"](cfg) == (ep > 1 and tp > 1 and not sp)


# --- the engine: where a diagnostic points, and the values its message quotes ------------------

def _with(plan, **decisions: Decision):
    plan = dataclasses.replace(plan, settings={**plan.settings, **decisions})
    return plan


def test_diagnostic_points_at_the_users_pin_not_an_earlier_field():
    """PAR001 reads TP first; TP came from the model line, CP was pinned: point at the CP pin."""
    plan = _plan()
    model_line, pin = Position("r.yaml", 4, 8), Position("r.yaml", 9, 20)
    plan = _with(plan, tensor_model_parallel_size=Decision(2, "goal", "chosen", position=model_line),
                 context_parallel_size=Decision(2, "user", "pinned", position=pin),
                 world_size=Decision(2, "hardware", "gpus", position=Position("r.yaml", 5, 1)),
                 pipeline_model_parallel_size=Decision(1, "goal", "chosen", position=model_line))
    d = next(d for d in check(plan) if d.rule == "PAR001")
    assert d.position == pin
    assert d.message == "world size 2 is not divisible by TP*PP*CP = 2*1*2"


def test_diagnostic_without_a_pin_points_at_the_first_positioned_field():
    plan = _plan()
    first = Position("r.yaml", 4, 8)
    plan = _with(plan, tensor_model_parallel_size=Decision(2, "goal", "chosen", position=None),
                 pipeline_model_parallel_size=Decision(1, "goal", "chosen", position=first),
                 context_parallel_size=Decision(2, "goal", "chosen", position=Position("r.yaml", 6, 1)),
                 world_size=Decision(2, "hardware", "gpus", position=None))
    d = next(d for d in check(plan) if d.rule == "PAR001")
    assert d.position == first


def test_messages_quote_the_values():
    plan = _plan()
    values = {"expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1, "pipeline_model_parallel_size": 1,
              "world_size": 2, "moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None}
    plan = _with(plan, **{k: Decision(v, "user", "pinned", position=Position("r.yaml", 9, 1)) for k, v in values.items()})
    msgs = {d.rule: d.message for d in check(plan)}
    assert msgs["PAR002"].startswith("world size 2 is not divisible by ETP*EP*PP = 1*4*1")


@pytest.mark.parametrize("values,rule", [
    (dict(memory_estimate_gib=78.69, memory_limit_gib=73.6, memory_biggest_term="weights and optimizer 77.5 GiB",
          memory_min_gpus=168), "MEM001"),
    (dict(memory_estimate_gib=80.49, memory_limit_gib=87.36, shipped_recipe="r_config"), "MEM002"),
])
def test_memory_messages_name_the_limit_and_the_margin(values, rule):
    """MEM001 says what limit it applied and why; MEM002 names the margin over the GPU and the error it is within."""
    plan = _with(_plan(), **{k: Decision(v, "derived", "test") for k, v in values.items()})
    msg = next(d.message for d in check(plan) if d.rule == rule)
    if rule == "MEM001":
        assert msg == ("estimated peak 78.69 GiB per GPU exceeds the 73.6 GiB a plan may fill on "
                       f"{plan['gpu_display']} (92% of its 80 GiB: the planner's headroom); largest term: weights "
                       f"and optimizer 77.5 GiB; the smallest GPU count (whole nodes of {plan['gpus_per_node']}) with a layout "
                       "that fits is 168")
    else:
        assert msg.startswith(f"estimated peak 80.49 GiB per GPU is 0.49 GiB (0.6%) over the 80 GiB of "
                              f"{plan['gpu_display']}, within the memory estimate's measured error (9.2%: up to "
                              "87.36 GiB); the plan is Bridge's r_config run as shipped")
    assert "None" not in msg and "{" not in msg


def test_diagnostic_with_no_positioned_field_points_at_the_recipes_first_line():
    plan = _plan()
    plan = _with(plan, **{k: Decision(v, "goal", "chosen", position=None) for k, v in dict(
        tensor_model_parallel_size=2, pipeline_model_parallel_size=1, context_parallel_size=2, world_size=2).items()})
    d = next(d for d in check(plan) if d.rule == "PAR001")
    assert d.position == Position(plan.source, 1, 1)



@pytest.mark.parametrize("change", ["duplicate", "extra", "missing"])
def test_catalogue_and_checks_must_list_the_same_rules(monkeypatch, change):
    from mocompile.rules import engine
    entries = list(engine.load_yaml(engine.CATALOGUE))
    if change == "duplicate":  # same ids as CHECKS, one twice
        entries.append(entries[0])
    elif change == "extra":
        entries.append({**entries[0], "id": "XXX001"})
    else:
        entries = entries[1:]
    monkeypatch.setattr(engine, "load_yaml", lambda path: entries)
    engine.rules.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="rule catalogue and checks disagree"):
            engine.rules()
    finally:
        engine.rules.cache_clear()

@pytest.mark.parametrize("cfg,expect", [
    ({}, dict(vpp=1, cp2=2, ep_group=1, stages=1, layers_per_rank=0, num_microbatches=0, hybridep_ranks=None)),
    (dict(virtual_pipeline_model_parallel_size=None, pipeline_model_parallel_size=3, num_layers=12,
          context_parallel_size=3, expert_model_parallel_size=4, expert_tensor_parallel_size=2,
          hybridep_ranks_per_domain=8, global_batch_size=64, micro_batch_size=2, data_parallel_size=4),
     dict(vpp=1, cp2=6, ep_group=8, stages=3, layers_per_rank=4, num_microbatches=8, hybridep_ranks=8)),
    (dict(virtual_pipeline_model_parallel_size=2, pipeline_model_parallel_size=3, num_layers=13),
     dict(vpp=2, stages=6, layers_per_rank=4)),
    # each size alone, the others at their defaults
    (dict(expert_model_parallel_size=4), dict(ep_group=4)),
    (dict(expert_tensor_parallel_size=3), dict(ep_group=3)),
    (dict(num_layers=6), dict(layers_per_rank=6, stages=1)),
    (dict(global_batch_size=8), dict(num_microbatches=8)),
    (dict(global_batch_size=8, micro_batch_size=2), dict(num_microbatches=4)),
    (dict(global_batch_size=8, data_parallel_size=4), dict(num_microbatches=2)),
    (dict(global_batch_size=8, micro_batch_size=2, data_parallel_size=4), dict(num_microbatches=1)),
    (dict(global_batch_size=8, micro_batch_size=3), dict(num_microbatches=2)),  # whole micro-batches
])
def test_message_context_values(cfg, expect):
    from mocompile.rules.engine import context
    ctx = context(cfg)
    assert {k: ctx[k] for k in expect} == expect
    assert ctx["deepep_sizes"] == ", ".join(map(str, DEEPEP_GROUP_SIZES))
    assert "layout_error" not in ctx


@pytest.mark.parametrize("cfg,error", [
    (dict(pipeline_model_parallel_layout="EL"), None),  # no layers, no MTP, one stage: the defaults
    (dict(pipeline_model_parallel_layout="EtL"), "1 decoder layers `t`, but the model has 0"),
    (dict(pipeline_model_parallel_layout="Et|tmL", pipeline_model_parallel_size=2, num_layers=2, mtp_num_layers=None),
     "1 MTP layers `m`, but the model has 0"),
    (dict(pipeline_model_parallel_layout="Et|t|t|tmL", pipeline_model_parallel_size=2,
          virtual_pipeline_model_parallel_size=2, num_layers=4, mtp_num_layers=1), None),
])
def test_message_context_checks_the_layout_against_the_plan(cfg, error):
    from mocompile.rules.engine import context
    assert context(cfg)["layout_error"] == error


# --- pipeline layouts, clause by clause --------------------------------------------------------

@pytest.mark.parametrize("layout,pp,vpp,layers,mtp,error", [
    ("Et|tL", 2, 1, 2, 0, None),
    ("Et|t|tL", 2, 1, 2, 0, "3 stages, but PP*VPP = 2*1 = 2"),
    ("EttL", 2, 1, 2, 0, "1 stages, but PP*VPP = 2*1 = 2"),
    ("Et|tL", 2, 2, 2, 0, "2 stages, but PP*VPP = 2*2 = 4"),
    ("Ett|tL", 2, 1, 1, 0, "3 decoder layers `t`, but the model has 1"),
    ("tE|tL", 2, 1, 2, 0, "the first stage must start with the single E"),
    ("Et|EtL", 2, 1, 2, 0, "the first stage must start with the single E"),
    ("EtL|t", 2, 1, 2, 0, "the last stage must end with the single L"),
    ("EtL|tL", 2, 1, 2, 0, "the last stage must end with the single L"),
    ("Et|tL", 2, 1, 3, 0, "2 decoder layers `t`, but the model has 3"),
    ("Ett|tL", 2, 1, 3, 0, None),
    ("Et|tmL", 2, 1, 2, 2, "1 MTP layers `m`, but the model has 2"),
    ("Et|tmmL", 2, 1, 2, 1, "2 MTP layers `m`, but the model has 1"),
    ("Et|tmL", 2, 1, 2, 0, "1 MTP layers `m`, but the model has 0"),
    ("Etm|tL", 2, 1, 2, 1, "MTP layers must sit in the last stage"),
    ("Et|mtL", 2, 1, 2, 1, "MTP layers must come after every decoder layer"),
    ("Et|tmL", 2, 1, 2, 1, None),
    ("Et|(tt|)*30mL", 8, 4, 61, 1, None),
    ("Et|(tt|)*30mL", 8, 4, 62, 1, "61 decoder layers `t`, but the model has 62"),
    ("Et|t*3|L", 3, 1, 4, 0, None),
    ("Et|tx|L", 3, 1, 2, 0, "unexpected characters in 'Et|tx|L'"),
])
def test_layout_validation(layout, pp, vpp, layers, mtp, error):
    assert layout_error(layout, pp, vpp, layers, mtp) == error


def test_layout_repeats_expand():
    assert expand("E(t|)*2t*2L") == ["Et", "t", "ttL"]
    assert expand("E, t | t L") == ["Et", "tL"]
    # rounds go on until nothing changes, even when a round's text sorts before the last: dropping `()*0`
    # leaves `((` where `()` stood
    assert expand("()*0(((t)*2)*2)*2") == ["t" * 8]


@pytest.mark.parametrize("pp,vpp,layers,mtp", [(8, 4, 61, 1), (4, 1, 30, 0), (2, 2, 7, 0), (4, 2, 27, 2), (16, 1, 14, 0)])
def test_derived_layout_is_legal_and_balanced(pp, vpp, layers, mtp):
    layout = derive(pp, vpp, layers, mtp)
    assert layout_error(layout, pp, vpp, layers, mtp) is None
    sizes = [len(s) for s in expand(layout)]
    assert max(sizes) - min(sizes) <= 1 or min(sizes) == 0, (layout, sizes)


def test_deepseek_v3_layout_on_pp8_vpp4():
    assert derive(8, 4, 61, 1) == "Et|(tt|)*30mL"


@pytest.mark.parametrize("pp,vpp,layers,expect", [(2, 1, 8, True), (3, 1, 8, False), (2, 2, 8, True),
                                                    (2, 2, 6, False), (2, 3, 6, True), (1, 1, 7, True)])
def test_even_split_needs_layers_divisible_by_pp_then_vpp(pp, vpp, layers, expect):
    from mocompile.layout import even
    assert even(pp, vpp, layers) is expect


def test_split_shares_normalise_and_an_all_zero_split_has_none():
    from mocompile.rules.checks import split_share
    assert split_share("99,1,0", 1) == pytest.approx(0.01)
    assert split_share("2,2", 2) == 0.0
    assert split_share("0,0,0", 1) is None
    assert split_share("1,1,2,4", 0) == 0.25  # a fourth part is ignored
    assert split_share("100", 1) == 0.0  # missing parts are 0
    assert split_share("0.6,0.4", 0) == pytest.approx(0.6)  # a total of 1 is already normalised
    assert split_share(None, 0) is None


def test_unknown_message_placeholder_is_left_as_written():
    from mocompile.rules.engine import _Safe
    assert "{a} and {b}".format_map(_Safe(a=1)) == "1 and {b}"


def test_every_message_placeholder_has_a_value(base):
    """A misspelt `{field}` in a catalogue message would reach the user verbatim."""
    from mocompile.rules.engine import _Safe, context
    ctx = context({**base, "pipeline_model_parallel_layout": "Et|tL", "pipeline_model_parallel_size": 2})
    for rule in by_id().values():
        text = rule.message.format_map(_Safe(ctx))
        assert "{" not in text, f"{rule.id}: {text}"


def _derive_stage_by_stage(pp, vpp, num_layers, mtp):
    """``derive`` as it was before a808d29: size every stage, list them all, fold equal neighbours."""
    n = pp * vpp
    base, extra = divmod(num_layers + 2 + mtp, n)
    stages, remaining = [], num_layers
    for i in range(n):
        size = base + (1 if i >= n - extra else 0)
        head, tail = ("E" if i == 0 else ""), ("m" * mtp + "L" if i == n - 1 else "")
        t = remaining if i == n - 1 else max(0, min(size - len(head) - len(tail), remaining))
        remaining -= t
        stages.append(head + "t" * t + tail)
    out, i = [], 0
    while i < n:
        j = i
        while j + 1 < n and stages[j + 1] == stages[i]:
            j += 1
        count = j - i + 1
        out.append(f"({stages[i]}|)*{count}" if count > 2 else "|".join(stages[i:j + 1]) + "|")
        i = j + 1
    return "".join(out)[:-1]


def test_derived_layout_counts_runs_but_gives_the_stage_by_stage_layout():
    """a808d29 counts runs of equal stages instead of listing them; the layouts must not change.

    Small sizes cover every shape: PP*VPP 1 and 2 (no middle), empty middle stages (fewer units than
    stages), a partial stage, base-size stages only, base+1 only, and both; MTP 4 and more with one-unit
    stages runs the layers out inside the base-size stages, before the base+1 ones (``E|t|||mmmmL`` at PP 5).
    """
    for pp, vpp, layers, mtp in itertools.product(range(1, 9), range(1, 5), range(1, 40), range(8)):
        assert derive(pp, vpp, layers, mtp) == _derive_stage_by_stage(pp, vpp, layers, mtp), (pp, vpp, layers, mtp)


@pytest.mark.parametrize("layout,limit,stages", [
    ("t*3t*3", 6, ["tttttt"]),
    ("(tt|)*3", 9, ["tt", "tt", "tt", ""]),
    ("tttttttt(t)*2", 10, ["t" * 10]),  # text around the repeat counts, and the `(t)*2` it replaces does not
    ("((t)*3)*3", 9, ["t" * 9]),
    ("(t|)*4(t|)*4", 16, ["t"] * 8 + [""]),  # the second repeat passes 15, the first not
])
def test_expansion_stops_just_past_its_limit(layout, limit, stages):
    assert expand(layout, limit=limit) == stages
    assert expand(layout) == stages
    with pytest.raises(ValueError, match=rf"^{re.escape(repr(layout))} expands past {limit - 1} characters$"):
        expand(layout, limit=limit - 1)


def test_expansion_limit_message_quotes_sixty_characters():
    layout = "Et|" + "t" * 70 + "|(t|)*99"
    with pytest.raises(ValueError) as err:
        expand(layout, limit=100)
    assert str(err.value) == f"{layout[:60]!r} expands past 100 characters"


@pytest.mark.parametrize("pp,vpp,layers,mtp,limit", [(2, 1, 2, 0, 28), (2, 3, 5, 1, 44), (1, 1, 7, 3, 42)])
def test_layout_check_expands_up_to_twice_a_legal_layout(pp, vpp, layers, mtp, limit):
    """2 * (letters + stages) + 16: letters num_layers + mtp + E + L, and pp*vpp - 1 bars."""
    assert layout_error(f"t*{limit}", pp, vpp, layers, mtp) != f"'t*{limit}' expands past {limit} characters"
    assert layout_error(f"t*{limit + 1}", pp, vpp, layers, mtp) == f"'t*{limit + 1}' expands past {limit} characters"


def test_a_hint_names_the_value_not_a_placeholder():
    """DSP016's hint tells the user the EP bound of this cluster: the node's NVLink width, filled in."""
    plan = _plan()
    values = dict(**FLEX_DEEPEP, expert_model_parallel_size=16, world_size=16, gpu_arch="blackwell",
                  nvlink_domain=8, gpus_per_node=8, nodes=2, data_parallel_size=16)
    plan = _with(plan, **{k: Decision(v, "user", "pinned", position=Position("r.yaml", 9, 1)) for k, v in values.items()})
    d = next(d for d in check(plan) if d.rule == "DSP016")
    assert "(parallelism.ep <= 8)" in d.hint and "{" not in d.hint


def test_every_hint_placeholder_is_one_its_message_fills():
    """A hint is filled from the context its message is formatted with: a name the message does not use may be
    missing there and would print as ``{name}``. Quoted YAML (``{type: huggingface, ...}``) is not a placeholder."""
    from mocompile.rules import engine
    for entry in engine.load_yaml(engine.CATALOGUE):
        names = set(re.findall(r"\{(\w+)\}", entry.get("hint") or ""))
        assert names <= set(re.findall(r"\{(\w+)[^}]*\}", entry["message"])), entry["id"]
