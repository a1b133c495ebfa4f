# mocompile: generated file, do not edit: change the recipe and run `mocompile compile`
# mocompile: source recipes/deepseek-v3-h100-deepep.yaml (mocompile 0.1.0)
# mocompile: checksum sha256:36f75ac36778f511 input sha256:6fa67c8f10564798
"""deepseek-v3-h100-deepep: Megatron-Bridge pretraining recipe compiled by mocompile.

DeepSeek-V3 (671B-A37B) on 1024x NVIDIA H100 80GB HBM3, goal throughput.
Each non-default line names the decision or rule behind it; run
`mocompile explain recipes/deepseek-v3-h100-deepep.yaml` for the full reasoning. Launch with torchrun.sh or
slurm.sbatch beside this file; `build_config()` imports without training.
"""

from __future__ import annotations

import json
import os
import time

import torch
from megatron.bridge.recipes.deepseek import deepseek_v3_pretrain_config
from megatron.bridge.training.comm_overlap import CommOverlapConfig
from megatron.bridge.training.config import (
    CheckpointConfig,
    ConfigContainer,
    DistributedDataParallelConfig,
    LoggerConfig,
    MockGPTDatasetConfig,
    OptimizerConfig,
    RNGConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainingConfig,
    ValidationConfig,
)
from megatron.bridge.training.flex_dispatcher_backend import apply_flex_dispatcher_backend
from megatron.bridge.training.mixed_precision import get_mixed_precision_config

# Model fields the plan decided. Checked after Bridge's helpers ran: a silent fallback
# (e.g. DeepEP -> alltoall on an unsupported GPU) stops the job instead of training another plan.
PLANNED = {'seq_length': 4096, 'tensor_model_parallel_size': 2, 'pipeline_model_parallel_size': 8, 'virtual_pipeline_model_parallel_size': 4, 'pipeline_model_parallel_layout': 'Et|(tt|)*30mL', 'context_parallel_size': 1, 'expert_model_parallel_size': 64, 'expert_tensor_parallel_size': 1, 'sequence_parallel': True, 'moe_flex_dispatcher_num_sms': 20, 'moe_shared_expert_overlap': False, 'moe_router_force_load_balancing': False, 'moe_grouped_gemm': True, 'recompute_granularity': 'selective', 'recompute_method': None, 'recompute_num_layers': None, 'recompute_modules': ['mla_up_proj', 'layernorm', 'moe_act'], 'cuda_graph_impl': 'none', 'cuda_graph_modules': [], 'use_te_rng_tracker': False, 'mtp_num_layers': 1, 'apply_rope_fusion': False, 'cross_entropy_loss_fusion': True, 'cross_entropy_fusion_impl': 'te', 'moe_permute_fusion': True, 'bias_activation_fusion': True, 'moe_router_fusion': True, 'deterministic_mode': False, 'fine_grained_activation_offloading': False, 'offload_modules': [], 'cuda_graph_scope': None, 'moe_deepep_num_sms': None, 'moe_hybridep_num_sms': None, 'account_for_embedding_in_pipeline_split': False, 'account_for_loss_in_pipeline_split': False, 'num_layers_in_first_pipeline_stage': None, 'num_layers_in_last_pipeline_stage': None, 'moe_token_dispatcher_type': 'flex', 'moe_flex_dispatcher_backend': 'deepep'}

# The launch environment this plan was compiled for (launchers export the same block).
ENV_VARS = {'CUDA_DEVICE_MAX_CONNECTIONS': '32', 'NCCL_NVLS_ENABLE': '0', 'NVTE_BWD_LAYERNORM_SM_MARGIN': '20', 'NVTE_FWD_LAYERNORM_SM_MARGIN': '20', 'PYTHONUNBUFFERED': '1', 'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}

# MOCOMPILE_RANK_PROBE (rankprobe.sh, `mocompile rankprobe`): the rank this plan's memory estimate calls most loaded,
# what the probe runs instead of what a fake process group cannot run, and the estimates it is compared with.
RANK_PROBE = {'world_size': 1024, 'rank': 256, 'stage': 2, 'stages': 8, 'rank_why': "the 3rd of 8 pipeline stages: 9 micro-batches' activations in flight on its layers are the largest of the stages (memory estimate)", 'iterations': 6, 'microbatches': {'plan': 128, 'probe': 16}, 'global_batch_size': 1024, 'model': {'moe_token_dispatcher_type': 'alltoall', 'moe_router_force_load_balancing': True}, 'substitutions': [{'field': 'moe_token_dispatcher_type', 'plan': 'flex (deepep)', 'probe': 'alltoall', 'rule': 'PRB002', 'why': "DeepEP needs real peers (its buffers exchange IPC and NVSHMEM handles at construction); Megatron-LM refuses the flex dispatcher under a fake process group. The alltoall dispatcher moves the same tokens through PyTorch's allocator; the flex dispatcher's own buffers are outside it"}, {'field': 'moe_router_force_load_balancing', 'plan': False, 'probe': True, 'rule': 'PRB003', 'why': "the tokens a rank's experts receive depend on every other rank's routing, which a fake group does not run: routing is forced to balance (random router logits), so each expert gets its mean share; the estimate's natural-routing imbalance is not measured"}, {'field': 'global_batch_size', 'plan': 8192, 'probe': 1024, 'rule': 'PRB004', 'why': "16 of the plan's 128 micro-batches per iteration (the pipeline's warm-up, and so the peak, is the plan's); compute times are scaled by 128/16 to compare with the step-time model"}], 'estimate': {'plan': {'estimate_gib': 55.74, 'total_gib': 58.24, 'weights_and_optimizer_gib': 14.54, 'activations_gib': 41.21, 'logits_gib': 0.0, 'dispatcher_buffers_gib': 2.0, 'graph_buffers_gib': 0.0, 'unfused_wgrad_gib': 0.0, 'optimizer_step_gib': 0.0, 'params_per_gpu_m': 2811.9, 'in_flight_microbatches': 9.0}, 'probe': {'estimate_gib': 51.04, 'total_gib': 51.54, 'weights_and_optimizer_gib': 14.54, 'activations_gib': 36.5, 'logits_gib': 0.0, 'dispatcher_buffers_gib': 0.0, 'graph_buffers_gib': 0.0, 'unfused_wgrad_gib': 0.0, 'optimizer_step_gib': 0.0, 'params_per_gpu_m': 2811.9, 'in_flight_microbatches': 9.0}, 'probe_by_stage_gib': [41.66, 46.42, 51.04, 49.01, 46.98, 44.96, 42.93, 49.22], 'difference_gib': {'allocated': 4.7, 'total': 6.7}}, 'model_compute_s': {'plan': 27.959, 'probe': 3.4949}}


def build_config() -> ConfigContainer:
    """Build the ConfigContainer for this plan (importable without starting training)."""
    cfg = deepseek_v3_pretrain_config()  # Bridge's own recipe for DeepSeek-V3 (671B-A37B) (reads the HF config of deepseek-ai/DeepSeek-V3)
    # Bridge's recipe config, then only what the plan decides, field by field (each line names the decision);
    # everything else stays the recipe's (its optimizer, DDP and data-loader options, logger, environment).
    cfg.optimizer.use_precision_aware_optimizer = True  # training.optimizer_state bf16-moments: default: Bridge's recipe deepseek_v3_pretrain_config builds its optimizer this way (use_precision_aware_optimizer and its dtypes; train.py keeps it); the memory estimate follows
    cfg.optimizer.main_params_dtype = torch.float32  # fp32 master, stored as remainders
    cfg.optimizer.store_param_remainders = True  # the 16 bits the bf16 weight lacks
    cfg.optimizer.exp_avg_dtype = torch.bfloat16  # first moment
    cfg.optimizer.exp_avg_sq_dtype = torch.bfloat16  # second moment
    cfg.optimizer.optimizer_cpu_offload = False  # training.optimizer_offload 0: default: auto: on the GPU unless no plan fits
    cfg.optimizer.optimizer_offload_fraction = 0.0  # share stepped on the CPU
    if cfg.comm_overlap is None:
        cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)
    cfg.train.train_iters = 100  # user: pinned in the recipe
    cfg.train.global_batch_size = 8192  # user: pinned in the recipe
    cfg.train.micro_batch_size = 1  # user: pinned in the recipe
    cfg.train.exit_signal_handler = False  # derived: nothing to save on SIGTERM
    cfg.train.manual_gc = True  # goal: Bridge perf_recipes/_common.py::_benchmark_common: Python GC only every 100 steps, never inside a step (the GC pauses it removes are a cause of step-time jitter)
    cfg.train.manual_gc_interval = 100  # goal: Bridge perf_recipes/_common.py::_benchmark_common; one full collection (0.54 s measured in a Bridge run) every 100 steps costs 5.4 ms a step
    cfg.optimizer.bf16 = True  # user: from precision bf16
    cfg.optimizer.fp16 = False  # user: from precision bf16
    cfg.scheduler.lr_warmup_iters = 10  # derived: a tenth of train_iters, at most 500: the schedule fits the run's length
    cfg.scheduler.lr_decay_iters = 100  # derived: cosine decay over the whole run (train_iters)
    cfg.dataset.seq_length = 4096  # user: pinned in the recipe
    cfg.dataset.random_seed = 1234  # default: schema default
    cfg.dataset.blend = None  # derived: mock data has no blend
    cfg.logger.log_interval = 1  # default: log every iteration
    cfg.logger.tensorboard_dir = None  # default: no TensorBoard
    cfg.checkpoint.save = None  # default: no checkpoint key: nothing is saved
    cfg.checkpoint.load = None  # default: no resume directory
    cfg.checkpoint.save_interval = None  # default: nothing is saved
    cfg.checkpoint.ckpt_format = 'torch_dist'  # default: torch_dist: the format Bridge 0.6.2 saves and resumes without Megatron FSDP
    cfg.checkpoint.async_save = False  # default: synchronous saves
    cfg.checkpoint.pretrained_checkpoint = None  # default: weights start from random init
    cfg.validation.eval_iters = 0  # derived: no evaluation: no validation batches are built
    cfg.validation.eval_interval = None  # default: no evaluation during training
    cfg.ddp.grad_reduce_in_fp32 = False  # goal: Bridge perf_recipes/_common.py::_benchmark_common: gradients reduced in BF16 (half the DP traffic)
    cfg.ddp.use_distributed_optimizer = True  # the distributed optimizer (Muon: plain DDP); default: schema default: Megatron's distributed Adam
    cfg.ddp.overlap_grad_reduce = True  # derived: overlap the DP gradient reduce-scatter
    cfg.ddp.overlap_param_gather = True  # derived: follows overlap_grad_reduce
    cfg.comm_overlap.tp_comm_overlap = False  # derived: TP communication overlap needs TE userbuffers set up for the exact shapes; mocompile does not plan it (Bridge's CommOverlapConfig.tp_comm_overlap)
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True  # user: pinned in the recipe
    cfg.comm_overlap.delay_wgrad_compute = False  # goal: part of the chosen plan (35.60 s/step; see tensor_model_parallel_size)
    cfg.comm_overlap.overlap_p2p_comm = True  # derived: interleaved pipeline: overlap p2p (Bridge's derivation)
    cfg.comm_overlap.batch_p2p_comm = False  # derived: not needed
    cfg.comm_overlap.overlap_grad_reduce = True  # derived: overlap the DP gradient reduce-scatter
    cfg.comm_overlap.overlap_param_gather = True  # derived: follows overlap_grad_reduce
    cfg.rng.seed = 1234  # default: schema default
    cfg.rng.te_rng_tracker = False  # derived: no graphs
    # mock data: no tokenizer files (nothing downloaded at start-up)
    cfg.tokenizer = TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=129280)
    model = cfg.model
    model.seq_length = 4096  # training.seq_length
    model.tensor_model_parallel_size = 2  # user: pinned in the recipe
    model.pipeline_model_parallel_size = 8  # user: pinned in the recipe
    model.virtual_pipeline_model_parallel_size = 4  # user: pinned in the recipe
    model.pipeline_model_parallel_layout = 'Et|(tt|)*30mL'  # derived: balanced layout: embedding and loss counted as a layer each [PP002, PP003]
    model.context_parallel_size = 1  # goal: part of the chosen plan (35.60 s/step; see tensor_model_parallel_size)
    model.expert_model_parallel_size = 64  # user: pinned in the recipe
    model.expert_tensor_parallel_size = 1  # user: pinned in the recipe
    model.sequence_parallel = True  # goal: part of the chosen plan (35.60 s/step; see tensor_model_parallel_size)
    model.moe_flex_dispatcher_num_sms = 20  # derived: flex dispatcher SM budget used by the shipped perf recipes
    model.moe_shared_expert_overlap = False  # derived: off under EP overlap and with flex dispatchers (OVL010, Bridge's apply_flex_dispatcher_backend); else the provider's default [OVL010]
    model.moe_router_force_load_balancing = False  # goal: natural routing: forced balancing is for benchmarks only
    model.moe_grouped_gemm = True  # derived: TE grouped GEMM experts
    model.recompute_granularity = 'selective'  # user: pinned in the recipe
    model.recompute_method = None  # goal: the reference plan's (deepseek_v3_pretrain_1024gpu_h100_bf16_config with this intent's changes) recompute: 58.6 GiB <= 73.6 GiB usable
    model.recompute_num_layers = None  # goal: the reference plan's (deepseek_v3_pretrain_1024gpu_h100_bf16_config with this intent's changes) recompute: 58.6 GiB <= 73.6 GiB usable
    model.recompute_modules = ['mla_up_proj', 'layernorm', 'moe_act']  # user: pinned in the recipe
    model.cuda_graph_impl = 'none'  # goal: part of the chosen plan (35.60 s/step; see tensor_model_parallel_size)
    model.cuda_graph_modules = []  # goal: part of the chosen plan (35.60 s/step; see tensor_model_parallel_size)
    model.use_te_rng_tracker = False  # derived: no graphs
    model.mtp_num_layers = 1  # model: model catalogue (deepseek-v3)
    model.apply_rope_fusion = False  # goal: needs TE >= 1.4 and, with MLA, YaRN RoPE (transformer_config.py)
    model.cross_entropy_loss_fusion = True  # goal: Bridge perf_recipes/_common.py::_benchmark_common: fused cross-entropy in TE
    model.cross_entropy_fusion_impl = 'te'  # goal: Bridge perf_recipes/_common.py::_benchmark_common: cross_entropy_fusion_impl='te'
    model.moe_permute_fusion = True  # goal: perf recipes fuse token permutation (TE >= 2.1; the unfused permute is part of why the published alltoall run without it took 41.25 s vs 24.71 s for HybridEP)
    model.bias_activation_fusion = True  # derived: fused SwiGLU/quick-GeGLU with the router probabilities (Megatron-Core weighted_bias_swiglu_impl): less activation memory than the unfused GLU, as Bridge's perf recipes set it
    model.moe_router_fusion = True  # goal: Bridge's perf recipes fuse top-k routing and the aux loss (TE >= 2.7, megatron/core/transformer/moe/moe_utils.py)
    model.deterministic_mode = False  # default: schema default: Megatron's fast kernels, not bitwise reproducible
    model.fine_grained_activation_offloading = False  # derived: no module offloaded
    model.offload_modules = []  # default: auto: activations stay on the GPU unless no plan fits
    model.cuda_graph_scope = None  # deprecated alias of cuda_graph_modules; both set raises
    model.moe_deepep_num_sms = None  # deprecated alias of moe_flex_dispatcher_num_sms
    model.moe_hybridep_num_sms = None  # deprecated alias of moe_flex_dispatcher_num_sms
    model.account_for_embedding_in_pipeline_split = False  # pipeline split comes from the plan (layout or even split)
    model.account_for_loss_in_pipeline_split = False  # pipeline split comes from the plan (layout or even split)
    model.num_layers_in_first_pipeline_stage = None  # pipeline split comes from the plan (layout or even split)
    model.num_layers_in_last_pipeline_stage = None  # pipeline split comes from the plan (layout or even split)
    # Bridge's own helper sets the flex dispatcher and clears shared-expert overlap.
    apply_flex_dispatcher_backend(model, 'deepep')  # user: pinned in the recipe
    cfg.mixed_precision = get_mixed_precision_config('bf16_mixed')
    # the precision config writes this into the DDP config at setup: set it here, not only above
    cfg.mixed_precision.grad_reduce_in_fp32 = False
    cfg.env_vars = {**(cfg.env_vars or {}), **ENV_VARS}  # the recipe's environment, the plan's block on top
    check_plan(cfg)
    return cfg


def check_plan(cfg: ConfigContainer) -> None:
    """Stop if Bridge's helpers changed a field the plan decided (e.g. a silent fallback)."""
    changed = {k: (getattr(cfg.model, k, None), v) for k, v in PLANNED.items() if getattr(cfg.model, k, None) != v}
    if changed:
        detail = ", ".join(f"{k}={have!r} (plan: {want!r})" for k, (have, want) in sorted(changed.items()))
        raise SystemExit(f"mocompile: the built config differs from the compiled plan: {detail}")


def step_metrics_callback(path: str):
    """A Bridge callback writing one JSON line per step to ``path`` on rank 0: time, loss, peak memory."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    class StepMetrics(Callback):
        def __init__(self) -> None:
            self.start = 0.0

        def on_train_step_start(self, context) -> None:
            torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_train_step_end(self, context) -> None:
            torch.cuda.synchronize()
            if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
                return
            losses = {k: float(v) for k, v in (context.loss_dict or {}).items() if hasattr(v, "__float__")}
            row = {
                "iteration": int(context.state.train_state.step) + 1,  # Bridge increments after this hook
                "step_ms": (time.perf_counter() - self.start) * 1000.0,
                "loss": losses.get("lm loss"),
                "max_memory_allocated": torch.cuda.max_memory_allocated(),
                "max_memory_reserved": torch.cuda.max_memory_reserved(),
            }
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    return StepMetrics()


def probe_kernels(path: str) -> None:
    """MOCOMPILE_PROBE_KERNELS=<file>: measure instead of training (`mocompile probe` runs this through the
    launcher). BF16 GEMMs at this plan's shapes, the host's launch time for a tiny kernel, and NCCL
    all-to-all over the ranks of each node and, across nodes, over all ranks; rank 0 writes one JSON object."""
    import statistics

    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    dev = torch.device("cuda", local)

    def timed(fn, reps: int, warm: int) -> float:
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in marks:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in marks) * 1e3  # microseconds

    gemm = []
    for what, m, n, k in [('reference', 8192, 8192, 8192), ('attention qkv', 4096, 24576, 7168), ('expert fc1', 4096, 4096, 7168), ('expert fc2', 4096, 7168, 2048)]:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        us = timed(lambda: a @ b, reps=20, warm=5)
        gemm.append({"what": what, "m": m, "n": n, "k": k, "us": us, "tflops": 2.0 * m * n * k / us / 1e6})
        del a, b
    x = torch.zeros(16, device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        x.add_(1.0)
    launch_us = (time.perf_counter() - t0) / 2000 * 1e6
    torch.cuda.synchronize()

    def all_to_all(group, ranks: int) -> list:
        points = []
        for size in [65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456]:
            send = torch.ones(size // 2, device=dev, dtype=torch.bfloat16)
            recv = torch.empty_like(send)
            dist.barrier()
            us = timed(lambda: dist.all_to_all_single(recv, send, group=group), reps=10, warm=3)
            slowest = torch.tensor([us], device=dev)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            points.append({"bytes": size, "us": float(slowest.item())})
        return points

    intra = None
    nodes = world // per_node
    groups = [dist.new_group(list(range(i * per_node, (i + 1) * per_node))) for i in range(nodes)]
    if per_node > 1:
        intra = all_to_all(groups[rank // per_node], per_node)
    inter = all_to_all(None, world) if nodes > 1 else None
    if rank == 0:
        out = {"device_name": torch.cuda.get_device_name(dev), "world": world, "per_node": per_node,
               "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "gemm": gemm, "launch_us": launch_us, "all_to_all": {"nccl_intra_node": intra, "nccl_world": inter}}
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(out) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def _simulate_collectives() -> None:
    """torch's fake process group skips every collective and leaves its outputs as allocated, uninitialised
    (NVIDIA/Megatron-LM#3025): the alltoall dispatcher would size its buffers from garbage token counts. Fill the
    outputs as if every rank held this rank's data (uniform ranks): an all-gather repeats the input, a reduce-scatter
    keeps this rank's chunk, an all-to-all returns what was sent, a receive gets small random activations. The
    fills copy into the outputs Megatron allocated: no memory beyond the real job's."""
    import sys

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def _flat(t):
        return t.view(-1) if t.is_contiguous() else None

    def _overlaps(a, b) -> bool:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()

    @torch.no_grad()
    def _repeat(out, inp) -> None:  # out <- inp, inp, ... (as much as fits)
        o, i = _flat(out), _flat(inp)
        if o is None or i is None or o.numel() == 0 or _overlaps(out, inp):
            return
        if i.numel() == 0:
            o.zero_()
            return
        for start in range(0, o.numel(), i.numel()):
            n = min(i.numel(), o.numel() - start)
            o[start:start + n].copy_(i[:n])

    def all_gather_into_tensor(output_tensor, input_tensor, *args, **kwargs):
        return _repeat(output_tensor, input_tensor)

    def all_gather(tensor_list, tensor, *args, **kwargs):
        for t in tensor_list:
            _repeat(t, tensor)

    def reduce_scatter_tensor(output, input, *args, **kwargs):
        group = kwargs.get("group", args[1] if len(args) > 1 else None)
        i = _flat(input)
        if i is not None and not _overlaps(output, input) and i.numel() >= output.numel() * dist.get_world_size(group):
            r = dist.get_rank(group)
            _repeat(output, i[r * output.numel():(r + 1) * output.numel()])

    def all_to_all_single(output, input, *args, **kwargs):
        _repeat(output, input)

    def all_to_all(output_tensor_list, input_tensor_list, *args, **kwargs):
        for o, i in zip(output_tensor_list, input_tensor_list):
            _repeat(o, i)

    @torch.no_grad()
    def _recv(tensor, *args, **kwargs):
        if tensor.is_floating_point():
            tensor.normal_(0.0, 0.02)
        else:
            tensor.zero_()

    fills = {"all_gather_into_tensor": all_gather_into_tensor, "_all_gather_base": all_gather_into_tensor,
             "all_gather": all_gather, "reduce_scatter_tensor": reduce_scatter_tensor,
             "_reduce_scatter_base": reduce_scatter_tensor, "all_to_all_single": all_to_all_single,
             "all_to_all": all_to_all, "irecv": _recv, "recv": _recv}
    swap = {}
    for name, fill in fills.items():
        real = getattr(c10d, name, None)
        if real is None:
            continue

        def wrapper(*args, _real=real, _fill=fill, _name=name, **kwargs):
            real_args, real_kwargs = args, kwargs
            if _name == "all_gather":
                # torch's fake group checks every output against the input's size; Megatron-Core's layer-wise
                # optimizer (Muon, optimizer/layer_wise_optimizer.py _allgather_helper) gathers uneven shards: the
                # fake group gets the input as every output (no allocation), the real outputs are filled below
                outs = args[0] if args else kwargs.get("tensor_list")
                inp = args[1] if len(args) > 1 else kwargs.get("tensor")
                if outs and inp is not None and any(t.shape != inp.shape for t in outs):
                    real_args = ([inp] * len(outs),) + tuple(args[1:]) if args else args
                    if not args:
                        real_kwargs = dict(kwargs, tensor_list=[inp] * len(outs))
            work = _real(*real_args, **real_kwargs)
            _fill(*args, **kwargs)
            return work

        wrapper.__name__ = wrapper.__qualname__ = name
        swap[id(real)] = wrapper
        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)
    # modules that bound a collective at import (Megatron's `dist_all_gather_func = torch.distributed....`)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith(("megatron", "transformer_engine")):
            for attr, value in list(vars(mod).items()):
                if callable(value) and id(value) in swap:
                    setattr(mod, attr, swap[id(value)])


def _site(frames: list, roots: tuple[str, ...]) -> str:
    """The innermost frame under one of ``roots`` (a path fragment), as ``package/file.py:line function``."""
    for fr in frames:
        name = str(fr.get("filename", ""))
        for root in roots:
            at = name.rfind(root)
            if at >= 0:
                return f"{name[at + 1:]}:{fr.get('line')} {fr.get('name')}"
    return "(no Python frame: allocated by autograd or a C++ extension)"


def _peak_sites(snapshot: dict, top: int = 40) -> dict:
    """Where the allocated bytes sat at the traced peak (MOCOMPILE_RANK_PROBE_SITES=1): replay the caching
    allocator's trace (torch.cuda.memory._snapshot()["device_traces"]: alloc / free_requested / free_completed),
    find its highest point and sum the blocks alive there by the innermost Megatron / Transformer Engine frame that
    allocated them, and by the innermost Megatron-Core module frame. A diagnosis of the estimate, not a measurement
    of the peak (the peak allocated memory is torch.cuda.max_memory_allocated)."""
    events = [e for e in (snapshot.get("device_traces") or [[]])[0] if isinstance(e, dict)]

    def replay(stop: int) -> tuple[dict, int, int, int]:
        live: dict = {}
        cur = peak = 0
        at = -1
        for i, e in enumerate(events[:stop]):
            act, addr = e.get("action"), e.get("addr")
            if act == "alloc":
                live[addr] = e
                cur += int(e.get("size", 0))
                if cur > peak:
                    peak, at = cur, i
            elif act in ("free_requested", "free_completed") and addr in live:
                cur -= int(live.pop(addr).get("size", 0))
        return live, cur, peak, at

    _, _, peak, at = replay(len(events))
    live, _, _, _ = replay(at + 1)
    kernels = ("/transformer_engine/", "/megatron/", "/torch/nn/", "/torch/distributed/")
    modules = ("/megatron/core/transformer/", "/megatron/core/models/", "/megatron/core/ssm/", "/megatron/core/")

    def grouped(roots: tuple[str, ...]) -> list:
        sums: dict = {}
        for e in live.values():
            key = _site(e.get("frames") or [], roots)
            n, b = sums.get(key, (0, 0))
            sums[key] = (n + 1, b + int(e.get("size", 0)))
        ranked = sorted(sums.items(), key=lambda kv: -kv[1][1])[:top]
        return [{"site": k, "blocks": n, "gib": round(b / 2**30, 3)} for k, (n, b) in ranked]

    return {"traced_peak_gib": round(peak / 2**30, 3), "events": len(events), "peak_event": at,
            "by_allocation_site": grouped(kernels), "by_module": grouped(modules)}


def rank_probe(path: str) -> None:
    """MOCOMPILE_RANK_PROBE=<file> (rankprobe.sh, `mocompile rankprobe`): one rank of this plan, at its full size, on
    this process's one GPU under torch's fake process group (Megatron-LM's --fake-process-group: collectives skipped,
    RANK and WORLD_SIZE the target's). The rank builds its real model shard and optimizer state and runs real forward
    and backward passes on its share of the batch; every step's time and peak memory go to ``path`` (JSON), beside
    the memory estimate. MOCOMPILE_RANK_PROBE_RANK picks another rank, MOCOMPILE_RANK_PROBE_ITERS the iterations."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    spec = RANK_PROBE
    world = int(spec["world_size"])
    try:
        rank = int(os.environ.get("MOCOMPILE_RANK_PROBE_RANK") or spec["rank"])
        iters = int(os.environ.get("MOCOMPILE_RANK_PROBE_ITERS") or spec["iterations"])
    except ValueError as exc:
        raise SystemExit(f"mocompile: rank probe: {exc}") from None
    if not 0 <= rank < world or iters < 1:
        raise SystemExit(f"mocompile: rank probe: rank {rank} is not one of this plan's {world} or {iters} iterations < 1")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.cuda.set_device(0)
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    result = {"spec": spec, "rank": rank, "world_size": world, "device_name": torch.cuda.get_device_name(0),
              "gpu_memory_gib": round(gpu_gib, 2), "torch": torch.__version__, "replaced_at_run_time": [],
              "iterations": [], "max_memory_allocated": 0, "max_memory_reserved": 0, "error": None}

    def write() -> None:
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        result["max_memory_reserved"] = torch.cuda.max_memory_reserved()
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(result) + "\n")

    # the estimate of this rank's stage (MOCOMPILE_RANK_PROBE_RANK may pick another stage than the spec's)
    by_stage = spec["estimate"].get("probe_by_stage_gib") or []
    stage = min(int(spec["stages"]) - 1, rank // max(1, world // int(spec["stages"])))
    estimate_gib = by_stage[stage] if by_stage and rank != spec["rank"] else spec["estimate"]["probe"]["estimate_gib"]
    result["stage"], result["estimate_gib"] = stage, estimate_gib
    if estimate_gib > gpu_gib and os.environ.get("MOCOMPILE_RANK_PROBE_FORCE") != "1":
        result["error"] = (f"PRB001 the estimated peak of rank {rank}, {estimate_gib} GiB, "
                           f"exceeds this GPU's {gpu_gib:.1f} GiB (MOCOMPILE_RANK_PROBE_FORCE=1 runs it anyway)")
        write()
        raise SystemExit(f"mocompile: {result['error']}")
    sites = os.environ.get("MOCOMPILE_RANK_PROBE_SITES") == "1"
    if sites:  # every allocation with its Python stack, from before the model is built (slows the probe)
        torch.cuda.memory._record_memory_history(max_entries=5_000_000, stacks="python")

    def diagnose() -> None:
        if not sites:
            return
        try:
            result["peak_sites"] = _peak_sites(torch.cuda.memory._snapshot())
        except Exception as exc:  # noqa: BLE001  (a diagnosis never fails the probe)
            result["peak_sites"] = {"error": f"{type(exc).__name__}: {exc}"}

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    from megatron.bridge.training.callbacks import Callback
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    _simulate_collectives()
    cfg = build_config()
    for field, value in spec["model"].items():
        setattr(cfg.model, field, value)
    if getattr(cfg.comm_overlap, "tp_comm_overlap", False):
        cfg.comm_overlap.tp_comm_overlap = False
        result["replaced_at_run_time"].append({"rule": "PRB005", "field": "comm_overlap.tp_comm_overlap",
                                               "plan": True, "probe": False})
    cfg.train.global_batch_size = spec["global_batch_size"]
    cfg.train.train_iters = iters
    cfg.scheduler.lr_warmup_iters = 0
    cfg.scheduler.lr_decay_iters = iters
    cfg.validation.eval_interval = None
    cfg.validation.eval_iters = 0
    cfg.checkpoint.save = None  # the probe never reads or writes checkpoints, logs or traces
    cfg.checkpoint.load = None
    cfg.checkpoint.pretrained_checkpoint = None
    cfg.logger.tensorboard_dir = None
    cfg.logger.wandb_project = None
    cfg.profiling = None
    cfg.dist.distributed_backend = "fake"
    cfg.dist.use_gloo_process_groups = False  # as Megatron-LM's --fake-process-group
    cfg.ddp.check_for_nan_in_grad = False
    cfg.rerun_state_machine.check_for_nan_in_loss = False

    class StepProbe(Callback):
        def __init__(self) -> None:
            self.start = 0.0

        def on_train_start(self, context) -> None:
            torch.cuda.synchronize()
            result["before_first_step"] = {"allocated": torch.cuda.memory_allocated(),
                                           "max_allocated": torch.cuda.max_memory_allocated()}
            write()

        def on_train_step_start(self, context) -> None:
            torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_train_step_end(self, context) -> None:
            torch.cuda.synchronize()
            losses = {k: float(v) for k, v in (context.loss_dict or {}).items() if hasattr(v, "__float__")}
            result["iterations"].append({
                "iteration": int(context.state.train_state.step) + 1,
                "step_ms": (time.perf_counter() - self.start) * 1000.0, "loss": losses.get("lm loss"),
                "max_memory_allocated": torch.cuda.max_memory_allocated(),
                "max_memory_reserved": torch.cuda.max_memory_reserved()})
            write()

    try:
        pretrain(config=cfg, forward_step_func=forward_step, callbacks=[StepProbe()])
    except torch.cuda.OutOfMemoryError as exc:
        result["error"] = f"out of memory: {str(exc).splitlines()[0]}"
        diagnose()
        write()
        raise SystemExit(f"mocompile: rank probe: {result['error']}") from None
    diagnose()
    write()


def main() -> None:
    probe = os.environ.get("MOCOMPILE_PROBE_KERNELS")
    if probe:
        probe_kernels(probe)
        return
    rank = os.environ.get("MOCOMPILE_RANK_PROBE")
    if rank:
        rank_probe(rank)
        return
    # Training-only imports stay here so that build_config() imports on any machine.
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    cfg = build_config()
    metrics = os.environ.get("MOCOMPILE_METRICS")
    pretrain(config=cfg, forward_step_func=forward_step,
             callbacks=[step_metrics_callback(metrics)] if metrics else None)


if __name__ == "__main__":
    main()
