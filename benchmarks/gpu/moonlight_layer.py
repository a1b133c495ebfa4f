#!/usr/bin/env python3
"""Moonlight-16B's MoE layer piece by piece on one GPU, against the step-time model's per-layer terms (issue 19).

Why: the step-time model over-predicts Moonlight-16B's verification-card pretraining run on 16x H100 by +43.8 %,
and its compute term alone (15.3 s) is above the measured step (11.6 s). This times the pieces of one MoE layer
at that run's per-rank shape (EP 8, micro-batch 2 x 4096 tokens: 8192 tokens per rank; balanced routing, so each
of the 8 local experts gets 8192 x 6 / 8 = 6144 rows), forward + backward, so the model can be checked term by term:
the MLA projections and core attention, the routed experts (TE's GroupedLinear), the shared experts, and the
memory-bound work (RMSNorm, TE's fused permute / unpermute, SwiGLU).

    python3 benchmarks/gpu/moonlight_layer.py OUT.json     (on a GPU host after benchmarks/gpu/te.sh)
    python3 benchmarks/gpu/moonlight_layer.py --report OUT.json   (here: measured beside the model's terms)

Busy time (``microbench.busy_ms``: the union of the kernels' intervals) is what the model's GPU terms stand for;
wall time between CUDA events is printed beside it. Interleaved rounds (ROUNDS, default 3), medians.
"""
from __future__ import annotations

import json
import os
import sys

TOKENS, SEQ, BATCH = 8192, 4096, 2            # per rank: micro-batch 2 x 4096 (the card's MBS 2, TP 1, CP 1)
HIDDEN, HEADS, QK, V, KV_LORA, ROPE = 2048, 16, 192, 128, 512, 64
EXPERTS_LOCAL, TOPK, EXPERTS, FFN, SHARED = 8, 6, 64, 1408, 2816
ROWS = TOKENS * TOPK // EXPERTS_LOCAL          # 6144 rows per local expert, balanced (EP 8: 8192 x 6 copies / 8)


def _fb(torch, fn) -> dict:
    """Forward + backward of ``fn`` (a list of outputs built from leaf tensors, each given a random gradient):
    busy, kernel and wall time."""
    from microbench import kernel_and_busy_ms, timed

    grads = [torch.randn_like(o) for o in fn()]

    def step():
        torch.autograd.backward(fn(), grads)

    ms = timed(torch, step)
    gpu, busy = kernel_and_busy_ms(torch, step)
    return {"ms": ms, "gpu_ms": gpu, "busy_ms": busy}


def cases(te, torch) -> list:
    bf = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(TOKENS, HIDDEN, **bf, requires_grad=True)

    def linears(specs):  # te.Linear layers, each on its own input of the layer's tokens
        mods = [te.Linear(i, o, bias=False, params_dtype=torch.bfloat16, device="cuda") for i, o in specs]
        inputs = [torch.randn(TOKENS, i, **bf, requires_grad=True) for i, _ in specs]
        return lambda: [mod(t) for mod, t in zip(mods, inputs, strict=True)]

    # MLA projections without q LoRA (Moonlight): q 2048 -> 16 x 192, kv down 2048 -> 512 + 64, kv up 512 -> 16 x
    # (128 + 128), output 16 x 128 -> 2048
    proj = linears([(HIDDEN, HEADS * QK), (HIDDEN, KV_LORA + ROPE), (KV_LORA, HEADS * (QK - ROPE + V)),
                    (HEADS * V, HIDDEN)])
    attn = te.DotProductAttention(HEADS, (QK, V), qkv_format="sbhd", attn_mask_type="causal").cuda()
    q = torch.randn(SEQ, BATCH, HEADS, QK, **bf, requires_grad=True)
    k = torch.randn(SEQ, BATCH, HEADS, QK, **bf, requires_grad=True)
    v = torch.randn(SEQ, BATCH, HEADS, V, **bf, requires_grad=True)
    fc1 = te.GroupedLinear(EXPERTS_LOCAL, HIDDEN, 2 * FFN, bias=False, params_dtype=torch.bfloat16, device="cuda")
    fc2 = te.GroupedLinear(EXPERTS_LOCAL, FFN, HIDDEN, bias=False, params_dtype=torch.bfloat16, device="cuda")
    splits = [ROWS] * EXPERTS_LOCAL
    xe = torch.randn(ROWS * EXPERTS_LOCAL, HIDDEN, **bf, requires_grad=True)
    he = torch.randn(ROWS * EXPERTS_LOCAL, FFN, **bf, requires_grad=True)
    shared = linears([(HIDDEN, 2 * SHARED), (SHARED, HIDDEN)])  # the 2 shared experts' fc1 and fc2
    norm = te.RMSNorm(HIDDEN, params_dtype=torch.bfloat16, device="cuda")
    gate = torch.randn(ROWS * EXPERTS_LOCAL, 2 * FFN, **bf, requires_grad=True)
    # balanced routing onto the 8 local experts: every token to 6 distinct experts of 8 (a routing mask, as
    # Megatron-Core's fused permutation takes it)
    pick = torch.rand(TOKENS, EXPERTS_LOCAL, device="cuda").argsort(dim=1)[:, :TOPK]
    routing = torch.zeros(TOKENS, EXPERTS_LOCAL, device="cuda", dtype=torch.bool).scatter_(1, pick, True)

    def swiglu(t):
        a, b = t.chunk(2, dim=-1)
        return torch.nn.functional.silu(a) * b

    def routed(inner=lambda t: t):  # permute, ``inner`` on the routed rows, unpermute (no all-to-all: 1 GPU)
        from transformer_engine.pytorch import moe_permute, moe_unpermute

        out, row_map = moe_permute(x, routing, num_out_tokens=TOKENS * TOPK, map_type="mask")
        return [moe_unpermute(inner(out), row_map, restore_shape=x.shape, map_type="mask")]

    return [
        ("mla projections", lambda: _fb(torch, proj)),
        ("mla core attention", lambda: _fb(torch, lambda: [attn(q, k, v)])),
        ("experts fc1", lambda: _fb(torch, lambda: [fc1(xe, splits)])),
        ("experts fc2", lambda: _fb(torch, lambda: [fc2(he, splits)])),
        ("shared experts fc1+fc2", lambda: _fb(torch, shared)),
        ("rmsnorm", lambda: _fb(torch, lambda: [norm(x)])),
        ("swiglu (routed rows)", lambda: _fb(torch, lambda: [swiglu(gate)])),
        ("permute + unpermute", lambda: _fb(torch, routed)),
        # the routed path of one layer: permute, fc1, SwiGLU, fc2, unpermute
        ("routed block", lambda: _fb(torch, lambda: routed(lambda t: fc2(swiglu(fc1(t, splits)), splits)))),
    ]


def run(out_path: str) -> int:
    from importlib.metadata import version

    import torch
    import transformer_engine.pytorch as te
    from microbench import run_rounds, write_results

    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "te": getattr(te, "__version__", None) or version("transformer_engine"),
                 "shape": {"tokens": TOKENS, "rows_per_expert": ROWS},
                 "cases": run_rounds(torch, cases(te, torch), int(os.environ.get("ROUNDS", "3")))}
    write_results(res, out_path, lambda r: f"busy {r['busy_ms']:8.3f} ms  wall {r['ms']:8.3f} ms  "
                                          f"kernels {r['gpu_ms']:8.3f} ms", 28)
    return 0


def report(path: str) -> int:
    """The run beside the model's forward + backward terms of one Moonlight MoE layer at the same shape."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "compiler"))
    from mocompile import steptime
    from mocompile.catalogue import _defaults, gpus, models

    with open(path, encoding="utf-8") as fh:
        run_ = json.load(fh)
    m = _defaults({"id": "moonlight-16b-a3b", **models()["moonlight-16b-a3b"]})
    hw = dict(gpus()["h100"], id="h100")  # H200 shares H100 SXM's tensor cores and clocks (its HBM is faster)
    batch = steptime.Batch(SEQ, BATCH, 1024, "bf16", True, True, True)
    terms = steptime.StepModel(m, hw, batch, 16, steptime.constants())._compute_terms(1, 1, 8, 1)
    names = ("attn_gemm", "core", "experts", "shared", "dense", "elem")
    model = {n: 3.0 * terms[i + 1] * 1e3 for i, n in enumerate(names)}  # forward x3: forward + backward, ms
    busy = {k: v.get("busy_ms") for k, v in run_["cases"].items()}
    rows = [("MLA projections", busy["mla projections"], model["attn_gemm"]),
            ("core attention", busy["mla core attention"], model["core"]),
            ("routed experts (GEMMs)", (busy["experts fc1"] or 0) + (busy["experts fc2"] or 0), model["experts"]),
            ("shared experts", busy["shared experts fc1+fc2"], model["shared"]),
            ("memory-bound (2 norms, SwiGLU, permute+unpermute)",
             2 * (busy["rmsnorm"] or 0) + (busy["swiglu (routed rows)"] or 0) + (busy["permute + unpermute"] or 0),
             model["elem"])]
    print(f"{run_['gpu']}, TE {run_['te'] or '(version not recorded)'}: one Moonlight-16B MoE layer, 8192 tokens, "
          f"8 local experts x {ROWS} rows, forward + backward, busy ms (model: balanced routing, H100 SXM constants)")
    print(f"{'piece':52s} {'measured':>9s} {'model':>8s} {'model/measured':>15s}")
    for name, meas, pred in rows:
        print(f"{name:52s} {meas:9.3f} {pred:8.3f} {pred / meas:15.2f}" if meas else f"{name:52s} (failed)")
    total_m, total_p = sum(r[1] or 0 for r in rows), sum(r[2] for r in rows)
    print(f"{'sum':52s} {total_m:9.3f} {total_p:8.3f} {total_p / total_m:15.2f}")
    block = busy.get("routed block")
    if block:
        print(f"routed block chained (permute, fc1, SwiGLU, fc2, unpermute): {block:.3f} ms busy")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--report":
        raise SystemExit(report(sys.argv[2]))
    raise SystemExit(run(sys.argv[1] if len(sys.argv) > 1 else "moonlight_layer.json"))
