#!/usr/bin/env python3
"""Derive the step-time model's per-tensor FP8 quantisation cost from an fp8_micro.py run (GPU kernel time).

    python3 benchmarks/gpu/fp8_fit.py benchmarks/results/fp8-micro-h100-2026-11-26/fp8_micro.json

For each layer shape, FP8 kernel time = BF16 kernel time / gain + bytes x quantised elements / usable HBM
bandwidth, where the quantised elements are the GEMM's input, its output gradient and its weights (what the
model's ``fp8_quant_bytes`` term counts). Least squares over the six shapes and both per-tensor recipes
(current and delayed scaling) gives the gain and the bytes per element; data/steptime.yaml states the bytes
as ``fp8_tensor_quant_bytes`` (tests/test_steptime.py checks that it agrees).
"""
from __future__ import annotations

import json
import re
import sys
from typing import Any

H100_HBM = 3.35e12 * 0.7   # datasheet HBM3 bandwidth x the share elementwise kernels reach (steptime.HBM_EFFICIENCY)


def _shape(name: str) -> tuple[int, int, int, int]:
    """(experts or 1, rows per expert, in, out) from a case name like 'q30 expert fc1 2048->1536 x8 bf16'."""
    din, dout = (int(x) for x in re.search(r"(\d+)->(\d+)", name).groups())
    experts = re.search(r" x(\d+) ", name)
    return (int(experts.group(1)) if experts else 1), 4096, din, dout


def derive(doc: dict[str, Any]) -> dict[str, float]:
    pts = []
    for name, c in doc["cases"].items():
        if not name.endswith((" fp8-cs", " fp8-ds")) or "gpu_ms" not in c:
            continue
        base = doc["cases"][name.rsplit(" ", 1)[0] + " bf16"]["gpu_ms"] / 1e3
        e, rows, din, dout = _shape(name)
        n = e * rows
        elements = n * din + n * dout + e * din * dout
        pts.append((base, elements / H100_HBM, c["gpu_ms"] / 1e3))
    sbb = sum(b * b for b, _, _ in pts)
    sbe = sum(b * q for b, q, _ in pts)
    see = sum(q * q for _, q, _ in pts)
    sbf = sum(b * f for b, _, f in pts)
    sef = sum(q * f for _, q, f in pts)
    det = sbb * see - sbe * sbe
    inv_gain = (sbf * see - sef * sbe) / det
    quant_bytes = (sbb * sef - sbe * sbf) / det
    return {"fp8_gemm_gain": 1.0 / inv_gain, "fp8_tensor_quant_bytes": quant_bytes, "_points": len(pts)}


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        doc = json.load(fh)
    for k, v in derive(doc).items():
        print(f"{k}: {round(v, 4)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
