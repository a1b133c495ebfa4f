#!/usr/bin/env python3
"""Minimal HybridEP dispatch/combine outside Megatron (issue 10: the SIGSEGV at the first dispatch).

Run with torchrun on one host, e.g.
    torchrun --nproc-per-node 4 benchmarks/gpu/hybridep_min.py MODE [--hidden 2048 --tokens 4096 --experts 64 --topk 8]

MODE:
  default     HybridEPBuffer(group, hidden, max_tokens, local_experts) with DeepEP's defaults
  megatron    the constructor arguments Megatron-Core 0.19.2 passes (fused_a2a.init_hybrid_ep_buffer):
              num_sms_dispatch_api = num_sms_combine_api = moe_flex_dispatcher_num_sms (32, as emitted),
              num_sms_preprocessing_api = moe_hybridep_num_sms_preprocessing (default 108)
  sidestream  as `megatron`, but constructed and first dispatched on a side CUDA stream (the EP-overlap path)
  fa2a        through Megatron-Core's own fused_a2a.hybrid_ep_dispatch/combine (autograd functions)

Each step prints a line before it starts ("step: ..."), faulthandler is on, so a native crash shows
the last step reached and the Python stack. Checks: the number of tokens received equals the
reference count from the all-gathered routing maps, and combine(dispatch(x)) == topk * x (no expert
compute in between; combine sums the copies) within bf16 rounding.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import sys
import time

faulthandler.enable(all_threads=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["default", "megatron", "sidestream", "fa2a"])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()

    def say(msg: str) -> None:
        print(f"[rank {rank}] {args.mode}: {msg}", flush=True)

    env_keys = ["CUDA_HOME", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "USE_MNNVL", "NVSHMEM_DISABLE_NVLS",
                "HYBRID_EP_CACHE_DIR"]
    if rank == 0:
        say("env " + " ".join(f"{k}={os.environ.get(k)}" for k in env_keys))
        say(f"torch {torch.__version__} cuda {torch.version.cuda} device {torch.cuda.get_device_name()} "
            f"SMs {torch.cuda.get_device_properties(local).multi_processor_count}")
    group = dist.new_group(list(range(world)))  # an EP group, as Megatron builds one
    local_experts = args.experts // world
    torch.manual_seed(1234 + rank)
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16)
    scores = torch.rand(args.tokens, args.experts, device="cuda")
    topv, topi = scores.topk(args.topk, dim=-1)
    routing_map = torch.zeros(args.tokens, args.experts, device="cuda", dtype=torch.bool).scatter(1, topi, True)
    probs = torch.zeros(args.tokens, args.experts, device="cuda", dtype=torch.float32).scatter(
        1, topi, torch.softmax(topv, dim=-1))
    maps = [torch.empty_like(routing_map) for _ in range(world)]
    dist.all_gather(maps, routing_map)
    ref_recv = int(sum(m[:, rank * local_experts:(rank + 1) * local_experts].sum() for m in maps))

    say("step: import deep_ep")
    import deep_ep  # noqa: F401
    from deep_ep import HybridEPBuffer

    side = torch.cuda.Stream() if args.mode == "sidestream" else None
    ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
    ok = True
    with ctx:
        if args.mode == "fa2a":
            from megatron.core.transformer.moe import fused_a2a as f

            say(f"step: Megatron fused_a2a.hybrid_ep_dispatch (HAVE_HYBRIDEP={f.HAVE_HYBRIDEP}); builds the buffer")
            out, dprobs, _, tpe, handle = f.hybrid_ep_dispatch(
                x=x, routing_map=routing_map, probs=probs, group=group, num_local_experts=local_experts,
                num_sms_dispatch_api=32, num_sms_combine_api=32, num_sms_preprocessing_api=108)
            torch.cuda.synchronize()
            say(f"step: dispatched {tuple(out.shape)}; combine")
            n_recv = int(tpe.sum())
            comb = f.hybrid_ep_combine(out, handle, n_recv, None)
            torch.cuda.synchronize()
        else:
            kwargs = {}
            if args.mode in ("megatron", "sidestream"):
                kwargs = {"num_sms_dispatch_api": 32, "num_sms_combine_api": 32, "num_sms_preprocessing_api": 108}
            say(f"step: HybridEPBuffer constructor {kwargs}")
            t0 = time.time()
            buf = HybridEPBuffer(group=group, hidden_dim=args.hidden, max_num_of_tokens_per_rank=args.tokens,
                                 num_local_experts=local_experts, use_fp8=False, **kwargs)
            torch.cuda.synchronize()
            say(f"step: constructed in {time.time() - t0:.1f} s; dispatch_with_permute (JIT at first use)")
            t0 = time.time()
            out, dprobs, _, tpe, handle = buf.dispatch_with_permute(
                hidden=x, routing_map=routing_map, probs=probs, num_of_experts_per_rank=local_experts)
            torch.cuda.synchronize()
            say(f"step: dispatched {tuple(out.shape)} in {time.time() - t0:.1f} s; combine_with_unpermute")
            comb, _ = buf.combine_with_unpermute(hidden=out, handle=handle)
            torch.cuda.synchronize()
            n_recv = int(tpe.sum())
    if n_recv < ref_recv:
        ok = False
    ref = x.float() * args.topk
    rel = float((comb.float() - ref).norm() / ref.norm())
    ok = ok and rel < 2e-2
    say(f"check: received {n_recv} rows (reference {ref_recv}; padded counts may exceed it), "
        f"combine(dispatch(x)) vs topk*x rel err {rel:.2e} -> {'OK' if ok else 'MISMATCH'}")
    if args.mode != "fa2a" and ok:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            out, _, _, tpe, handle = buf.dispatch_with_permute(
                hidden=x, routing_map=routing_map, probs=probs, num_of_experts_per_rank=local_experts)
            comb, _ = buf.combine_with_unpermute(hidden=out, handle=handle)
        torch.cuda.synchronize()
        say(f"time: dispatch+combine {(time.perf_counter() - t0) / args.iters * 1000:.2f} ms/iter "
            f"({args.tokens} tokens x top-{args.topk}, hidden {args.hidden})")
    flag = torch.tensor([1 if ok else 0], device="cuda")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    if rank == 0:
        say("RESULT " + ("PASS" if int(flag) == 1 else "FAIL"))
    return 0 if int(flag) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
