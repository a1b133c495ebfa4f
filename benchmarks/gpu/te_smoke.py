#!/usr/bin/env python3
"""Prove a Transformer Engine install on one GPU before training with it (benchmarks/gpu/te.sh step 4).

Each check compares TE's result with a float32 PyTorch reference, so an install whose device code
is missing or wrong (te_pack.py keeps only sm_90 code) fails here, not an hour into a grid.
Usage: python3 te_smoke.py OUT.json   (exit 1 if any check fails)
"""
from __future__ import annotations

import json
import sys
import time
import traceback


def rel_err(got, ref) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def check_linear(te, torch) -> dict:
    lin = te.Linear(2048, 4096, bias=False, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = lin(x)
    y.float().square().mean().backward()
    ref = x.detach().float() @ lin.weight.detach().float().t()
    xr = x.detach().float().requires_grad_(True)
    (xr @ lin.weight.detach().float().t()).square().mean().backward()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        lin(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / 20
    return {"fwd_rel_err": rel_err(y, ref), "dgrad_rel_err": rel_err(x.grad, xr.grad),
            "fwd_tflops": 2 * 4096 * 2048 * 4096 / dt / 1e12, "tol": 2e-2}


def check_grouped(te, torch) -> dict:
    splits = [256, 512, 0, 768]
    gl = te.GroupedLinear(4, 1024, 2048, bias=False, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(sum(splits), 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = gl(x, splits)
    y.float().sum().backward()
    parts, start = [], 0
    for i, n in enumerate(splits):
        w = getattr(gl, f"weight{i}").detach().float()
        parts.append(x.detach()[start:start + n].float() @ w.t())
        start += n
    return {"fwd_rel_err": rel_err(y, torch.cat(parts)), "wgrad_present": gl.weight1.grad is not None,
            "tol": 2e-2}


def check_attention(te, torch) -> dict:
    s, b, h, d = 2048, 2, 16, 128
    attn = te.DotProductAttention(h, d, qkv_format="sbhd", attn_mask_type="causal")
    q, k, v = (torch.randn(s, b, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    y = attn(q, k, v)  # [s, b, h*d]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.permute(1, 2, 0, 3).float() for t in (q, k, v)), is_causal=True)
    ref = ref.permute(2, 0, 1, 3).reshape(s, b, h * d)
    return {"fwd_rel_err": rel_err(y, ref), "tol": 2e-2}


def check_permute(te, torch) -> dict:
    from transformer_engine.pytorch import moe_permute, moe_unpermute
    tokens, hidden, experts = 512, 256, 8
    inp = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    routing_map = torch.zeros(tokens, experts, device="cuda", dtype=torch.bool)
    routing_map[torch.arange(tokens), torch.randint(0, experts, (tokens,))] = True
    out, row_id_map = moe_permute(inp, routing_map, num_out_tokens=tokens, map_type="mask")
    back = moe_unpermute(out, row_id_map, restore_shape=inp.shape, map_type="mask")
    return {"roundtrip_rel_err": rel_err(back, inp), "tol": 1e-6}


def main(path: str) -> int:
    doc: dict = {"checks": {}}
    try:
        import torch
        t = time.perf_counter()
        import transformer_engine
        import transformer_engine.pytorch as te
        doc["import_s"] = round(time.perf_counter() - t, 2)
        doc["te_version"] = getattr(transformer_engine, "__version__", "?")
        doc["torch"] = torch.__version__
        doc["gpu"] = torch.cuda.get_device_name(0)
        doc["capability"] = list(torch.cuda.get_device_capability(0))
    except Exception as exc:  # the whole point is to record why
        doc["import_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        doc["traceback"] = traceback.format_exc()[-4000:]
        doc["ok"] = False
        open(path, "w").write(json.dumps(doc, indent=2) + "\n")
        print(json.dumps(doc, indent=2))
        return 1
    torch.manual_seed(0)
    for name, fn in [("linear", check_linear), ("grouped_linear", check_grouped),
                     ("attention", check_attention), ("permute", check_permute)]:
        try:
            res = fn(te, torch)
            errs = [v for k, v in res.items() if k.endswith("rel_err")]
            res["ok"] = all(e <= res["tol"] for e in errs) and res.get("wgrad_present", True)
        except Exception as exc:
            res = {"ok": False, "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]}
        doc["checks"][name] = res
    doc["ok"] = all(c["ok"] for c in doc["checks"].values())
    open(path, "w").write(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "te-smoke.json"))
