#!/usr/bin/env python3
"""Derive the step-time model's attention and expert-bias facts from a gptoss_micro.py run (GPU kernel time).

    python3 benchmarks/gpu/attention_fit.py benchmarks/results/gptoss-micro-h100-2026-11-26/gptoss_micro.json

Fused attention (TE's cuDNN backend) costs, per query, a time linear in the keys it attends: a slope per key and
an intercept that does not depend on the keys (measured: the same intercept at 8192 tokens for causal 2048-8192
and windowed 128-1024 keys). For one head width the slope is FLOPs at some rate plus softmax exponentials at
some multiple of the special-function-unit rate; two head widths (64 and 128, the same query width) separate
the two (the FLOPs part as a share of the dense BF16 peak: flash attention's matmuls, not the model's fitted
GEMM efficiency, which absorbs end-to-end overheads). The intercept is stated in keys (the work of that many keys: the
same for both widths), learnable softmax sinks likewise (their extra pass does not depend on the window). Biased
grouped GEMMs: the busy time with bias over without (``_grouped_ms``), FLOP-weighted over a GLU expert's fc1
(2/3 of its FLOPs) and fc2 (1/3).

Prints the facts as data/steptime.yaml states them; tests/test_steptime_facts.py checks that the file agrees.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from typing import Any

H100_BF16_DENSE = 989e12   # datasheet dense BF16 (SXM)
H100_EXP_RATE = 4.5e12     # MUFU.EX2 exponentials per second (steptime.yaml facts.exp_tera_per_s "9.0")


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def _keys(name: str) -> float:
    """Keys a query attends to on average in a case: causal s/2 (+1/2), a window of w keys about w."""
    seq = int(re.search(r" s(\d+) ", name).group(1))
    w = re.search(r"window(\d+)", name)
    if not w:
        return (seq + 1) / 2.0
    w = int(w.group(1))
    return (w * (w + 1) / 2.0 + (seq - w) * w) / seq


def _grouped_ms(case: dict[str, Any]) -> float:
    """The time a grouped-GEMM case keeps the GPU busy. Not the kernel-time sum (``gpu_ms``): TE runs up to four
    experts' GEMMs at once on its compute streams, and the sum counts the overlapping kernels (and a bias's small
    kernels beside them) each in full: on 1x H200 1.2-1.5x the busy time, and the bias ratio 1.19 where the busy
    time says 1.02 (benchmarks/results/gemm-width-h200-2026-11-28). ``busy_ms`` (the union of the kernels'
    intervals) where the run recorded it, else the CUDA-event wall time, which these 3-7 ms GPU-bound cases
    match (1.03 against the busy ratio's 1.02 on H200)."""
    return float(case.get("busy_ms") or case["ms"])


def derive(doc: dict[str, Any]) -> dict[str, Any]:
    """The facts from one run's cases (kernel milliseconds at 8192 tokens per case)."""
    cases = doc["cases"]
    lines: dict[tuple[int, int], list[tuple[float, float]]] = {}
    sinks: list[float] = []
    for name, c in cases.items():
        if not name.startswith("attn ") or "gpu_ms" not in c or " s4096 b4 " in name:
            continue  # the one 16384-token case only checks that time is linear in tokens
        d, h = (int(x) for x in re.match(r"attn d(\d+) h(\d+)", name).groups())
        if name.endswith(" sinks"):
            plain = cases.get(name[: -len(" sinks")])
            if plain and "gpu_ms" in plain:
                sinks.append(c["gpu_ms"] - plain["gpu_ms"])
            continue
        lines.setdefault((d, h), []).append((_keys(name), c["gpu_ms"] / 1e3))
    fits = {dh: _fit_line(pts) for dh, pts in lines.items()}
    (s64, i64), (s128, i128) = fits[(64, 64)], fits[(128, 32)]
    tokens = 8192
    # slope (s per key, 8192 tokens, fwd+bwd = 3 forward passes) = flops at share `share` of the dense peak
    # + exponentials at x times the MUFU rate
    flops_part = 3 * tokens * 4 * 64 * 64 / H100_BF16_DENSE   # d*h = 4096 for both shapes
    exps = {64: 3 * tokens * 64 * 2 / 3 / H100_EXP_RATE, 128: 3 * tokens * 32 * 2 / 3 / H100_EXP_RATE}
    x = (s64 - s128) / (exps[64] - exps[128])
    share = flops_part / (s64 - exps[64] * x)
    k0 = statistics.mean([i64 / s64, i128 / s128])
    sink_keys = statistics.median(sinks) / 1e3 / s64
    bias = {}
    for fc in ("fc1 2880->5760", "fc2 2880->2880"):
        bias[fc] = _grouped_ms(cases[f"grouped {fc} bias"]) / _grouped_ms(cases[f"grouped {fc}"])
    bias_factor = (2 * bias["fc1 2880->5760"] + bias["fc2 2880->2880"]) / 3
    return {"attention_peak_share": share, "attention_exp_factor": x, "attention_key_overhead": k0,
            "attention_sink_keys": sink_keys, "expert_bias_factor": bias_factor,
            "_slope_d64_us_per_key": s64 * 1e6, "_intercept_d64_ms": i64 * 1e3,
            "_slope_d128_us_per_key": s128 * 1e6, "_intercept_d128_ms": i128 * 1e3,
            "_sink_deltas_ms": sorted(sinks), "_bias_ratios": bias}


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        doc = json.load(fh)
    for k, v in derive(doc).items():
        print(f"{k}: {v if isinstance(v, (list, dict)) else round(v, 4)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
