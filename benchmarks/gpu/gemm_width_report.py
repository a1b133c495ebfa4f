#!/usr/bin/env python3
"""What a ``gemm_width.py`` run says about the step-time model's expert-GEMM efficiency.

    python3 benchmarks/gpu/gemm_width_report.py benchmarks/results/gemm-width-h200-2026-11-28/gemm_width.json

Per MoE family and rows per expert: the measured fc1 + fc2 throughput over the GPU's busy time, relative to the
family's 8192-row value, beside what ``steptime._gemm_eff`` (rows x ``grouped_gemm_concurrency``) predicts
relative to its own 8192-row value; then two one-curve fits over every case, by the GEMM's roofline intensity
1/(1/rows + 1/in + 1/out) and by its FLOPs (one forward of the 8 experts), with their RMS log error.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compiler"))
from mocompile import steptime  # noqa: E402

FAMILIES = [("qwen3-30b", 2048, 768), ("moonlight", 2048, 1408), ("qwen3-235b", 4096, 1536),
            ("gpt-oss", 2880, 2880), ("deepseek-v3", 7168, 2048)]
ROWS = (8192, 4096, 2048, 1024, 512)
PEAK = 989.0   # dense BF16 TFLOP/s of H100 / H200 SXM (the same tensor cores)


class _Batch:
    te = True
    grouped_gemm = True


def _model_tflops(h: int, f: int, rows: int, experts: int, c: dict[str, float]) -> float:
    m = {"moe_ffn_hidden_size": f, "hidden_size": h, "num_moe_experts": experts, "gated_linear_unit": True}
    conc = steptime.grouped_gemm_concurrency(m, {"sm_count": 132}, rows, 1, 1, _Batch())  # type: ignore[arg-type]
    return steptime._gemm_eff(rows * conc, c) * PEAK


def _fit(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """tflops = top * x / (x + half): grid least squares in log space; (top, half, rms log error)."""
    best = (math.inf, 0.0, 0.0)
    xs = sorted(x for x, _ in points)
    for top in range(500, 1000, 5):
        for i in range(400):
            half = xs[-1] * i / 400 / 10
            err = sum((math.log(t) - math.log(top * x / (x + half))) ** 2 for x, t in points)
            if err < best[0]:
                best = (err, float(top), half)
    return best[1], best[2], math.sqrt(best[0] / len(points))


def report(doc: dict[str, Any]) -> list[str]:
    cases, c = doc["cases"], steptime.constants()
    out = [f"{doc.get('gpu', '?')}: fc1 + fc2 forward + backward, 8 experts, TFLOP/s over the busy time "
           "(relative to 8192 rows per expert)", f"{'family':12s} {'rows':>5s} {'measured':>14s} {'model':>14s}"]
    for fam, h, f in FAMILIES:
        base = None
        for rows in ROWS:
            a, b = cases[f"{fam} fc1 {h}->{2 * f} r{rows}"], cases[f"{fam} fc2 {f}->{h} r{rows}"]
            flops = 3 * 2 * a["experts"] * rows * (h * 2 * f + f * h)
            meas = flops / (a["busy_ms"] + b["busy_ms"]) / 1e9
            model = _model_tflops(h, f, rows, a["experts"], c)
            base = base or (meas, model)
            out.append(f"{fam:12s} {rows:5d} {meas:7.0f} ({meas / base[0]:.2f}) {model:7.0f} ({model / base[1]:.2f})")
    by_intensity, by_flops = [], []
    for v in cases.values():
        if "busy_ms" not in v:
            continue
        r, din, dout = v["rows"], v["din"], v["dout"]
        by_intensity.append((1.0 / (1.0 / r + 1.0 / din + 1.0 / dout), v["tflops"]))
        by_flops.append((2.0 * v["experts"] * r * din * dout / 1e9, v["tflops"]))
    for name, pts, unit in (("roofline intensity", by_intensity, ""), ("forward GFLOPs", by_flops, " GFLOP")):
        top, half, rms = _fit(pts)
        out.append(f"one curve by {name}: {top:.0f} TFLOP/s x x / (x + {half:.1f}{unit}), RMS log error "
                   f"{rms * 100:.1f} % over {len(pts)} cases")
    return out


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        print("\n".join(report(json.load(fh))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
