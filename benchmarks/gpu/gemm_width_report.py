#!/usr/bin/env python3
"""What ``gemm_width.py`` runs say about the step-time model's expert-GEMM efficiency.

    python3 benchmarks/gpu/gemm_width_report.py benchmarks/results/gemm-width-h200-2026-11-28/gemm_width.json \
        benchmarks/results/gemm-width-h200-2026-11-28/gemm_width_experts.json

Per MoE family and rows per expert (the first run): the measured fc1 + fc2 throughput over the GPU's busy time,
relative to the family's 8192-row value, beside what the step-time model predicts relative to its own 8192-row value
(``steptime._gemm_eff`` of the rows times ``grouped_gemm_concurrency``). Then one-curve fits top x x / (x + half)
over every case of every run, with their RMS log error, by four candidate variables: the GEMM's rows alone (the
model's form), its roofline intensity 1/(1/rows + 1/in + 1/out), the FLOPs of the whole grouped call, and the
FLOPs of one expert's GEMM.
"""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compiler"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_width import EXPERTS, FAMILIES, ROWS  # noqa: E402  (the sweep's own shapes)
from mocompile import steptime  # noqa: E402


class _Batch:
    te = True
    grouped_gemm = True


def _model_share(h: int, f: int, rows: int, c: dict[str, float]) -> float:
    """The step-time model's expert-GEMM efficiency: by rows times the experts it assumes TE runs at once."""
    m = {"moe_ffn_hidden_size": f, "hidden_size": h, "num_moe_experts": EXPERTS, "gated_linear_unit": True}
    conc = steptime.grouped_gemm_concurrency(m, {"sm_count": 132}, rows, 1, 1, _Batch())  # type: ignore[arg-type]
    return steptime._gemm_eff(rows * conc, c)


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


VARIABLES: dict[str, Callable[[dict[str, Any]], float]] = {
    "rows alone": lambda v: v["rows"],
    "roofline intensity": lambda v: 1.0 / (1.0 / v["rows"] + 1.0 / v["din"] + 1.0 / v["dout"]),
    "GFLOPs of the grouped call": lambda v: 2.0 * v["experts"] * v["rows"] * v["din"] * v["dout"] / 1e9,
    "GFLOPs of one expert GEMM": lambda v: 2.0 * v["rows"] * v["din"] * v["dout"] / 1e9,
}


def report(docs: list[dict[str, Any]]) -> list[str]:
    cases, c = docs[0]["cases"], steptime.constants()
    out = [f"{docs[0].get('gpu', '?')}: fc1 + fc2 forward + backward, 8 experts, TFLOP/s over the busy time "
           "(relative to 8192 rows per expert)", f"{'family':12s} {'rows':>5s} {'measured':>14s} {'model':>8s}"]
    for fam, h, f in FAMILIES:
        base = None
        for rows in sorted(ROWS, reverse=True):
            a, b = cases[f"{fam} fc1 {h}->{2 * f} r{rows}"], cases[f"{fam} fc2 {f}->{h} r{rows}"]
            flops = 3 * 2 * a["experts"] * rows * (h * 2 * f + f * h)
            meas = flops / (a["busy_ms"] + b["busy_ms"]) / 1e9
            model = _model_share(h, f, rows, c)
            base = base or (meas, model)
            out.append(f"{fam:12s} {rows:5d} {meas:7.0f} ({meas / base[0]:.2f}) {model / base[1]:8.2f}")
    every = [v for doc in docs for v in doc["cases"].values() if "busy_ms" in v]
    for name, var in VARIABLES.items():
        top, half, rms = _fit([(var(v), v["tflops"]) for v in every])
        out.append(f"one curve by {name}: {top:.0f} TFLOP/s x x / (x + {half:.3g}), RMS log error "
                   f"{rms * 100:.1f} % over {len(every)} cases")
    return out


def main() -> int:
    docs = []
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as fh:
            docs.append(json.load(fh))
    print("\n".join(report(docs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
