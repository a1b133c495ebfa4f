#!/usr/bin/env python3
"""Check the values of the kernel ``gdn_micro.py`` timed: flash-linear-attention's chunked gated delta rule, forward
and backward, against fla's own step-by-step PyTorch recurrence (``naive_recurrent_gated_delta_rule``, float32).

    GDN_MICRO_BYPASS=1 python3 benchmarks/gpu/gdn_check.py OUT_DIR

fla refuses the gated backward on Hopper with Triton 3.4-3.7.0 (fla issue 640: wrong values). The GPU hosts have
Triton 3.6, so ``gdn_micro.py`` ran with that guard bypassed and its timings came with unchecked values; this says
whether the values on that host are right (relative error of the output and of every gradient, at Qwen3-Next's
head widths and one short sequence, where the recurrence in PyTorch is affordable). Writes ``gdn_check.json``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# (batch, tokens, q/k heads, value heads, head width): value heads > q/k heads is Qwen3-Next's grouping (32 over 16)
CASES = [(1, 512, 4, 4, 128), (2, 256, 2, 4, 128), (1, 1024, 4, 8, 128)]
# fla's own tests accept a gradient whose error ratio is below ~0.01-0.02 against this reference (bf16 inputs)
TOLERANCE = 0.02


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _case(kernel: Any, naive: Any, b: int, t: int, h: int, hv: int, d: int) -> dict[str, Any]:
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(b, t, h, d, device=dev, dtype=bf)
    k = torch.randn(b, t, h, d, device=dev, dtype=bf)
    v = torch.randn(b, t, hv, d, device=dev, dtype=bf)
    g = F.logsigmoid(torch.randn(b, t, hv, device=dev, dtype=torch.float32))
    beta = torch.rand(b, t, hv, device=dev, dtype=bf)
    do = torch.randn(b, t, hv, d, device=dev, dtype=bf)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
    o, _ = kernel(*leaves, use_qk_l2norm_in_kernel=True)
    o.backward(do)
    out = {"batch": b, "tokens": t, "qk_heads": h, "v_heads": hv, "width": d}
    # the kernel normalises q and k itself (use_qk_l2norm_in_kernel) and shares each q/k head among hv // h value
    # heads; the reference takes them normalised and repeated, in whichever order matches the kernel's output
    best: dict[str, Any] | None = None
    for order in (("interleave", "tile") if hv > h else ("interleave",)):
        ref_leaves = [x.clone().float().requires_grad_(True) for x in (q, k, v, g, beta)]
        rq, rk, rv, rg, rbeta = ref_leaves
        nq, nk = F.normalize(rq, dim=-1), F.normalize(rk, dim=-1)
        nq, nk = ((x.repeat_interleave(hv // h, dim=2) if order == "interleave" else x.repeat(1, 1, hv // h, 1))
                  for x in (nq, nk))
        ro, _ = naive(nq, nk, rv, rbeta, rg)
        ro.backward(do.float())
        errs = {"heads": order, "o": _rel(o, ro)}
        for name, got, want in zip(("dq", "dk", "dv", "dg", "dbeta"), leaves, ref_leaves, strict=True):
            errs[name] = _rel(got.grad, want.grad)
        if best is None or errs["o"] < best["o"]:
            best = errs
    assert best is not None
    out.update(best)
    return out


def main(out: Path) -> int:
    import fla
    import fla.ops.common.chunk_o as chunk_o
    import triton
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    bypass = bool(int(os.environ.get("GDN_MICRO_BYPASS", "0"))) and chunk_o.IS_NVIDIA_HOPPER \
        and not chunk_o.TRITON_ABOVE_3_7_1
    if bypass:
        chunk_o.TRITON_ABOVE_3_7_1 = True
    doc: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                           "fla": getattr(fla, "__version__", "?"), "backward_guard_bypassed": bypass,
                           "tolerance": TOLERANCE, "cases": []}
    for case in CASES:
        got = _case(chunk_gated_delta_rule, naive_recurrent_gated_delta_rule, *case)
        print(json.dumps(got), flush=True)
        doc["cases"].append(got)
    worst = max(v for c in doc["cases"] for k, v in c.items() if k in ("o", "dq", "dk", "dv", "dg", "dbeta"))
    doc["worst"] = worst
    doc["values_right"] = worst <= TOLERANCE
    print(f"worst relative error {worst:.4g} (tolerance {TOLERANCE}): values {'right' if worst <= TOLERANCE else 'WRONG'}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gdn_check.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
