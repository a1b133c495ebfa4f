#!/usr/bin/env python3
"""FP8 against BF16 for the linear layers of a narrow and a wide MoE on one GPU, with Transformer Engine.

The step-time model's worst in-sample row is Qwen3-30B-A3B FP8 (current scaling) on 16 H100s: measured slower
than its BF16 sibling, predicted faster. This times the layers' GEMMs forward + backward in BF16 and under FP8
recipes (current scaling, delayed scaling; blockwise scaling, Hopper's ``Float8BlockScaling``, with
``FP8_RECIPES="bf16 fp8-cs fp8-blockwise"``) at Qwen3-30B's widths (hidden 2048, expert FFN 768) and at a wide
model's (hidden 7168, expert FFN 2048), so the FP8 gain the model assumes can be checked per width.

    python3 benchmarks/gpu/fp8_micro.py OUT.json      (on a GPU host after benchmarks/gpu/te.sh)

Each case, in interleaved rounds (ROUNDS, default 2): wall time between CUDA events (median of 10 after 3 warm-up
passes) and GPU kernel time from the PyTorch profiler; errors are recorded, not raised.
"""
from __future__ import annotations

import os
import sys

from microbench import kernel_and_busy_ms, run_cases, timed, write_results

# (name, experts (0 = a plain Linear), rows per expert, in, out)
SHAPES = [
    ("q30 expert fc1 2048->1536 x8", 8, 4096, 2048, 1536),
    ("q30 expert fc2 768->2048 x8", 8, 4096, 768, 2048),
    ("q30 qkv 2048->5120", 0, 4096, 2048, 5120),
    ("q30 proj 4096->2048", 0, 4096, 4096, 2048),
    ("wide expert fc1 7168->4096 x8", 8, 4096, 7168, 4096),
    ("wide expert fc2 2048->7168 x8", 8, 4096, 2048, 7168),
]


def case(te, torch, recipe_name: str, experts: int, rows: int, din: int, dout: int) -> dict:
    from transformer_engine.common import recipe as te_recipe

    if experts:
        layer = te.GroupedLinear(experts, din, dout, bias=False, params_dtype=torch.bfloat16, device="cuda")
        n = experts * rows
    else:
        layer = te.Linear(din, dout, bias=False, params_dtype=torch.bfloat16, device="cuda")
        n = rows
    x = torch.randn(n, din, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(n, dout, device="cuda", dtype=torch.bfloat16)
    recipe = {"bf16": None, "fp8-cs": te_recipe.Float8CurrentScaling(),
              "fp8-ds": te_recipe.DelayedScaling(),
              "fp8-blockwise": getattr(te_recipe, "Float8BlockScaling", lambda: None)()}[recipe_name]
    if recipe is None and recipe_name != "bf16":
        raise RuntimeError(f"this Transformer Engine has no recipe for {recipe_name}")

    def step():
        with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
            y = layer(x, [rows] * experts) if experts else layer(x)
        y.backward(g)

    ms = timed(torch, step)
    flops = 3 * 2 * n * din * dout
    gpu, busy = kernel_and_busy_ms(torch, step)
    return {"ms": ms, "gpu_ms": gpu, "busy_ms": busy, "tflops": flops / ms / 1e9}


def main() -> int:
    out_path = sys.argv[1] if len(sys.argv) > 1 else "fp8_micro.json"
    import torch
    import transformer_engine.pytorch as te

    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cases": {}}
    cases = [(f"{name} {r}", (r, e, rows, din, dout)) for name, e, rows, din, dout in SHAPES
             for r in os.environ.get("FP8_RECIPES", "bf16 fp8-cs fp8-ds").split()]
    res["cases"] = run_cases(torch, lambda *a: case(te, torch, *a), cases)
    write_results(res, out_path, lambda r: f"{r['ms']:8.3f} ms  kernels {r['gpu_ms']:8.3f} ms  {r['tflops']:7.1f} TFLOPS", 44)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
