#!/usr/bin/env python3
"""Time the Gated DeltaNet core (flash-linear-attention's chunked gated delta rule, the kernel Megatron-Core's
GatedDeltaNet calls) forward and forward + backward on one GPU, at Qwen3-Next's head widths and a few lengths and
head counts, so that the step-time model can cost a hybrid model's linear-attention layers.

    python3 benchmarks/gpu/gdn_micro.py OUT_DIR      # needs torch, triton and fla (fla-core) on the path

Per case: the CUDA-event wall time of the call (median of ``REPEATS`` after warm-up, which also runs Triton's
autotuning), and the time the GPU was busy (the union of the kernels' intervals from torch.profiler), which the
3-30 ms calls here match. Writes ``gdn_micro.json``; ``gdn_fit.py`` derives the model's constant from it.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from microbench import timed, union_length  # benchmarks/gpu: run as a script from here

REPEATS = 10
# (batch, tokens, q/k heads, value heads, key dim, value dim): Qwen3-Next is 16 q/k heads and 32 value heads of
# width 128 (HF linear_num_key_heads / linear_num_value_heads / linear_*_head_dim)
CASES = [(1, 2048, 16, 32, 128, 128), (1, 4096, 16, 32, 128, 128), (1, 8192, 16, 32, 128, 128),
         (2, 4096, 16, 32, 128, 128), (1, 4096, 16, 16, 128, 128), (1, 4096, 32, 32, 128, 128),
         (1, 4096, 16, 32, 64, 64)]


def _inputs(b: int, t: int, h: int, hv: int, dk: int, dv: int) -> list[torch.Tensor]:
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(b, t, h, dk, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(b, t, h, dk, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(b, t, hv, dv, device=dev, dtype=bf, requires_grad=True)
    g = F.logsigmoid(torch.randn(b, t, hv, device=dev, dtype=torch.float32)).requires_grad_(True)
    beta = torch.rand(b, t, hv, device=dev, dtype=bf).requires_grad_(True)
    return [q, k, v, g, beta]


def _busy_ms(fn: Any) -> float:
    """GPU busy time of one call: the union of its kernels' intervals."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    return union_length(spans) / 1000.0  # us -> ms


def _measure(kernel: Any, b: int, t: int, h: int, hv: int, dk: int, dv: int) -> dict[str, Any]:
    """One case: forward and forward + backward wall time, and forward + backward busy time."""
    q, k, v, g, beta = _inputs(b, t, h, hv, dk, dv)
    do = torch.randn(b, t, hv, dv, device="cuda", dtype=torch.bfloat16)

    def fwd() -> torch.Tensor:
        o, _ = kernel(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        return o

    def fwd_bwd() -> None:
        fwd().backward(do)

    start = time.time()
    case: dict[str, Any] = {"batch": b, "tokens": t, "qk_heads": h, "v_heads": hv, "dk": dk, "dv": dv,
                            "fwd_ms": timed(torch, lambda: fwd().detach(), REPEATS),
                            "fwd_bwd_ms": timed(torch, fwd_bwd, REPEATS)}
    case["fwd_bwd_busy_ms"] = _busy_ms(fwd_bwd)
    case["seconds"] = round(time.time() - start, 1)
    return case


def main(out: Path) -> int:
    import fla
    import fla.ops.common.chunk_o as chunk_o
    import triton
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    # fla refuses the gated backward on Hopper with Triton 3.4-3.7.0 (its values are wrong there, fla issue #640);
    # the GPU hosts have Triton 3.6 and its 3.7.1 wheel (197 MB) cannot travel with the command. For timing only,
    # GDN_MICRO_BYPASS=1 lets the kernel run: the file records that its backward values were not to be trusted.
    bypass = bool(int(__import__("os").environ.get("GDN_MICRO_BYPASS", "0"))) and chunk_o.IS_NVIDIA_HOPPER \
        and not chunk_o.TRITON_ABOVE_3_7_1
    if bypass:
        chunk_o.TRITON_ABOVE_3_7_1 = True
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                           "fla": getattr(fla, "__version__", "?"), "repeats": REPEATS,
                           "backward_guard_bypassed": bypass, "cases": []}
    for b, t, h, hv, dk, dv in CASES:
        case = _measure(chunk_gated_delta_rule, b, t, h, hv, dk, dv)
        print(json.dumps(case), flush=True)
        doc["cases"].append(case)
    (out / "gdn_micro.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
