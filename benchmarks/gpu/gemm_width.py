#!/usr/bin/env python3
"""How fast the grouped expert GEMMs run as a function of their widths, not only their rows, on one GPU.

The step-time model gives every GEMM one share of peak that depends on its rows alone (``steptime._gemm_eff``;
for experts, the rows of the experts TE's grouped GEMM runs at once, ``grouped_gemm_concurrency``).
This sweeps the expert shapes of the catalogue's MoE families, fc1 (hidden
-> 2 x moe_ffn, gated) and fc2 (moe_ffn -> hidden), 8 local experts, over rows per expert, forward + backward
with ``te.GroupedLinear`` in BF16, so a width term can be read off measurements instead of fitted.

    python3 benchmarks/gpu/gemm_width.py OUT.json      (on a GPU host after benchmarks/gpu/te.sh)

``WGRAD_ACCUM=1`` instead times Qwen3-30B's and DeepSeek-V3's experts with and without Megatron's gradient
accumulation fusion (TE ``fuse_wgrad_accumulation``: the weight-gradient GEMM adds into an fp32 ``main_grad``).
``EXPERT_SWEEP=1`` instead varies the local experts per call (1-16) for the narrowest and the widest family at
512 and 2048 rows per expert: whether the fixed cost is per grouped call or per expert GEMM.

Each case, in interleaved rounds (ROUNDS, default 2): wall time between CUDA events and GPU kernel time from the
PyTorch profiler (``microbench``): the sum of kernel times and the time any kernel runs (``busy_ms``, which does
not count the concurrent experts twice; TFLOP/s are over it). Errors are recorded, not raised.
"""
from __future__ import annotations

import os
import sys

from microbench import kernel_and_busy_ms, run_cases, timed, write_results

# (family, hidden, moe_ffn): the expert shapes of the catalogue's MoE families (data/models.yaml)
FAMILIES = [
    ("qwen3-30b", 2048, 768),
    ("moonlight", 2048, 1408),
    ("qwen3-235b", 4096, 1536),
    ("gpt-oss", 2880, 2880),
    ("deepseek-v3", 7168, 2048),
]
ROWS = (512, 1024, 2048, 4096, 8192)   # tokens per expert
EXPERTS = 8                            # local experts: TE runs up to 4 at once on its compute streams


def _expert_gemms(h: int, f: int) -> tuple[tuple[str, int, int], ...]:
    """(name, in, out) of one gated expert's GEMMs: fc1 hidden -> 2 x moe_ffn, fc2 moe_ffn -> hidden."""
    return ("fc1", h, 2 * f), ("fc2", f, h)


def case(te, torch, experts: int, rows: int, din: int, dout: int, accumulate: bool = False) -> dict:
    layer = te.GroupedLinear(experts, din, dout, bias=False, params_dtype=torch.bfloat16, device="cuda",
                             fuse_wgrad_accumulation=accumulate)
    if accumulate:  # Megatron's gradient_accumulation_fusion: the wgrad GEMM adds into the fp32 main_grad
        for p in layer.parameters():
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
    n = experts * rows
    x = torch.randn(n, din, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(n, dout, device="cuda", dtype=torch.bfloat16)

    def step():
        layer(x, [rows] * experts).backward(g)

    ms = timed(torch, step)
    gpu, busy = kernel_and_busy_ms(torch, step)
    flops = 3 * 2 * n * din * dout
    return {"ms": ms, "gpu_ms": gpu, "busy_ms": busy, "tflops": flops / busy / 1e9,
            "wall_tflops": flops / ms / 1e9, "rows": rows, "din": din, "dout": dout, "experts": experts,
            "accumulate": accumulate}


def main() -> int:
    out_path = sys.argv[1] if len(sys.argv) > 1 else "gemm_width.json"
    import torch
    import transformer_engine.pytorch as te

    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "cases": {}}
    narrow_and_wide = (FAMILIES[0], FAMILIES[-1])
    if os.environ.get("EXPERT_SWEEP"):  # local experts per call at two row counts: a cost per call or per expert?
        cases = [(f"{fam} {fc} r{rows} e{e}", (e, rows, din, dout))
                 for fam, h, f in narrow_and_wide for rows in (512, 2048) for e in (1, 2, 4, 8, 16)
                 for fc, din, dout in _expert_gemms(h, f)]
    elif os.environ.get("WGRAD_ACCUM"):  # the weight gradient added into fp32 main_grad, against written in bf16
        cases = [(f"{fam} {fc} r{rows} {'accum' if acc else 'plain'}", (EXPERTS, rows, din, dout, acc))
                 for fam, h, f in narrow_and_wide for rows in (512, 2048, 8192) for acc in (False, True)
                 for fc, din, dout in _expert_gemms(h, f)]
    else:
        cases = [(f"{fam} {fc} {din}->{dout} r{rows}", (EXPERTS, rows, din, dout))
                 for fam, h, f in FAMILIES for rows in ROWS for fc, din, dout in _expert_gemms(h, f)]
    res["cases"] = run_cases(torch, lambda *a: case(te, torch, *a), cases)
    write_results(res, out_path, lambda r: f"{r['ms']:8.3f} ms  busy {r['busy_ms']:8.3f} ms  {r['tflops']:7.1f} TFLOP/s busy", 40)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
