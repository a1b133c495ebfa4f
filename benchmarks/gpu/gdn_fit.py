#!/usr/bin/env python3
"""Derive the step-time model's Gated DeltaNet constants from a gdn_micro.py run (GPU busy time).

    python3 benchmarks/gpu/gdn_fit.py benchmarks/results/gdn-micro-h200-2026-12-01/gdn_micro.json

The chunked gated delta rule (flash-linear-attention's Triton kernels, which Megatron-Core's GatedDeltaNet calls)
runs far below the tensor cores' peak: at Qwen3-Next's widths (32 value heads of 128, 16 q/k heads of 128) 1x H200
spends ~8.7 ns per token and value head forward + backward, ~68 TFLOPS of the chunked algorithm's matmuls, 7 % of
the dense BF16 peak, and far below its memory bandwidth too: the kernels are bound by their own latency. So the
time is fitted as it was measured, per token, linear in the three things the cases vary:

    ns per token = gdn_token_ns + value heads x (gdn_head_ns + gdn_state_ns x key dim x value dim)

(a part per token whatever the heads, the per-head work that does not grow with the state, and the state's
dk x dv work). Fitted by least squares over the cases at 4096 tokens and more (the 2048-token case is the same to
7 %: the time is linear in tokens), on 1x H200; the model scales it by the dense BF16 peak (H100 and H200 are the
same chip's SMs and clocks).

Prints the facts as data/steptime.yaml states them; tests/test_steptime.py checks that the file agrees.
"""
from __future__ import annotations

import json
import sys
from typing import Any


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Least squares by the normal equations (3 unknowns; Gaussian elimination with partial pivoting)."""
    n = len(a[0])
    ata = [[sum(r[i] * r[j] for r in a) for j in range(n)] for i in range(n)]
    atb = [sum(r[i] * y for r, y in zip(a, b, strict=True)) for i in range(n)]
    m = [row + [v] for row, v in zip(ata, atb, strict=True)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def derive(doc: dict[str, Any]) -> dict[str, Any]:
    """The constants from one run's cases (busy milliseconds, forward + backward)."""
    rows, ys, per_case = [], [], {}
    for c in doc["cases"]:
        tokens = c["batch"] * c["tokens"]
        ns = c["fwd_bwd_busy_ms"] * 1e6 / tokens
        per_case[f"b{c['batch']} t{c['tokens']} h{c['qk_heads']} hv{c['v_heads']} d{c['dk']}"] = round(ns, 2)
        if tokens < 4096:
            continue
        rows.append([1.0, float(c["v_heads"]), float(c["v_heads"] * c["dk"] * c["dv"])])
        ys.append(ns)
    token_ns, head_ns, state_ns = _solve(rows, ys)
    fit = [r[0] * token_ns + r[1] * head_ns + r[2] * state_ns for r in rows]
    worst = max(abs(f / y - 1.0) for f, y in zip(fit, ys, strict=True))
    return {"gdn_token_ns": token_ns, "gdn_head_ns": head_ns, "gdn_state_ns": state_ns,
            "_worst_fit_error": worst, "_ns_per_token": per_case, "_gpu": doc["gpu"],
            "_backward_guard_bypassed": doc.get("backward_guard_bypassed")}


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        doc = json.load(fh)
    for k, v in derive(doc).items():
        print(f"{k}: {v if isinstance(v, (list, dict, str, bool)) or v is None else format(v, '.6g')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
