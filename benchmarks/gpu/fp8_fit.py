#!/usr/bin/env python3
"""Derive the step-time model's per-tensor FP8 quantisation cost from an fp8_micro.py run (GPU kernel time).

    python3 benchmarks/gpu/fp8_fit.py benchmarks/results/fp8-micro-h100-2026-11-26/fp8_micro.json

For each layer shape, FP8 kernel time = BF16 kernel time / gain + bytes x quantised elements / usable HBM
bandwidth, where the quantised elements are the GEMM's input, its output gradient and its weights (what the
model's ``fp8_quant_bytes`` term counts). Least squares over the six shapes and both per-tensor recipes
(current and delayed scaling) gives the gain and the bytes per element; data/steptime.yaml states the bytes
as ``fp8_tensor_quant_bytes`` (tests/test_steptime.py checks that it agrees).

    python3 benchmarks/gpu/fp8_fit.py --blockwise benchmarks/results/fp8-blockwise-h200-2026-11-29/fp8_micro.json

gives ``fp8_block_gemm_extra``: what blockwise scaling costs over per-tensor scaling, as a share of the BF16 GEMM
time, from busy time on one machine (``derive_blockwise``).
"""
from __future__ import annotations

import json
import re
from typing import Any

H100_HBM = 3.35e12 * 0.7   # datasheet HBM3 bandwidth x the share elementwise kernels reach (steptime.HBM_EFFICIENCY)


def _shape(name: str) -> tuple[int, int, int, int]:
    """(experts or 1, rows per expert, in, out) from a case name like 'q30 expert fc1 2048->1536 x8 bf16'."""
    din, dout = (int(x) for x in re.search(r"(\d+)->(\d+)", name).groups())
    experts = re.search(r" x(\d+) ", name)
    return (int(experts.group(1)) if experts else 1), 4096, din, dout


def derive(doc: dict[str, Any], recipes: tuple[str, ...] = ("fp8-cs", "fp8-ds"), metric: str = "gpu_ms",
           hbm: float = H100_HBM) -> dict[str, float]:
    """Least squares of FP8 time = BF16 time / gain + bytes x elements / ``hbm`` over the cases of ``recipes``,
    timed by ``metric`` (``gpu_ms``: kernel sum, as the committed H100 derivation; ``busy_ms``: the union of the
    kernels' intervals, which does not count TE's concurrent grouped-GEMM streams twice)."""
    pts = []
    for name, c in doc["cases"].items():
        if not name.endswith(tuple(" " + r for r in recipes)) or metric not in c:
            continue
        base = doc["cases"][name.rsplit(" ", 1)[0] + " bf16"][metric] / 1e3
        e, rows, din, dout = _shape(name)
        n = e * rows
        elements = n * din + n * dout + e * din * dout
        pts.append((base, elements / hbm, c[metric] / 1e3))
    sbb = sum(b * b for b, _, _ in pts)
    sbe = sum(b * q for b, q, _ in pts)
    see = sum(q * q for _, q, _ in pts)
    sbf = sum(b * f for b, _, f in pts)
    sef = sum(q * f for _, q, f in pts)
    det = sbb * see - sbe * sbe
    inv_gain = (sbf * see - sef * sbe) / det
    quant_bytes = (sbb * sef - sbe * sbf) / det
    return {"fp8_gemm_gain": 1.0 / inv_gain, "fp8_tensor_quant_bytes": quant_bytes, "_points": len(pts)}


def derive_blockwise(doc: dict[str, Any]) -> dict[str, float]:
    """Blockwise FP8 (Hopper's ``Float8BlockScaling``) against per-tensor current scaling, one machine, busy time:
    least squares through the origin of (blockwise - per-tensor) on the BF16 time of each shape. Blockwise costs
    per-tensor's time plus ``fp8_block_gemm_extra`` of the BF16 GEMM time: the difference grows with the GEMM's
    FLOPs (x11.7 from Qwen3-30B's fc1 to the wide fc1), not with its quantised elements (x4.3), so it is the
    per-block-scaled GEMM, not the cast, that costs more."""
    num = den = 0.0
    points = 0
    for name, c in doc["cases"].items():
        if not name.endswith(" fp8-blockwise") or "busy_ms" not in c:
            continue
        stem = name.rsplit(" ", 1)[0]
        base, cs = doc["cases"][stem + " bf16"]["busy_ms"], doc["cases"][stem + " fp8-cs"]["busy_ms"]
        num += (c["busy_ms"] - cs) * base
        den += base * base
        points += 1
    return {"fp8_block_gemm_extra": num / den, "_points": points}


def main() -> int:
    """``fp8_fit.py RUN.json`` (the committed derivation); ``--busy --hbm 4.8e12`` fits busy time at another GPU's
    datasheet bandwidth, per recipe, so per-tensor and blockwise scaling are compared on one machine."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--busy", action="store_true", help="fit busy time (busy_ms), not the kernel sum")
    ap.add_argument("--hbm", type=float, default=3.35e12, help="the GPU's datasheet HBM bandwidth, bytes/s")
    ap.add_argument("--recipe", action="append", help="fit these recipes alone, each on its own (repeatable)")
    ap.add_argument("--blockwise", action="store_true", help="blockwise against per-tensor (derive_blockwise)")
    args = ap.parse_args()
    with open(args.run, encoding="utf-8") as fh:
        doc = json.load(fh)
    if args.blockwise:
        print(", ".join(f"{k}: {round(v, 4)}" for k, v in derive_blockwise(doc).items()))
        return 0
    metric, hbm = ("busy_ms" if args.busy else "gpu_ms"), args.hbm * 0.7
    for group in ([(r,) for r in args.recipe] if args.recipe else [("fp8-cs", "fp8-ds")]):
        print(f"{'+'.join(group)} ({metric}, {args.hbm:.3g} B/s):",
              ", ".join(f"{_label(k, group)}: {round(v, 4)}" for k, v in derive(doc, group, metric, hbm).items()))
    return 0


def _label(key: str, group: tuple[str, ...]) -> str:
    """A fitted constant named for what it was fitted on: ``fp8_tensor_quant_bytes`` is the per-tensor recipes'
    constant; fitted on other recipes (``--recipe fp8-blockwise``) the same least squares gives their own bytes."""
    if key == "fp8_tensor_quant_bytes" and not set(group) <= {"fp8-cs", "fp8-ds"}:
        return f"quant_bytes ({'+'.join(group)})"
    return key


if __name__ == "__main__":
    raise SystemExit(main())
