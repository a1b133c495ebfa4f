"""The kernel probe: which GEMMs and all-to-alls ``mocompile probe`` measures on the target, and what the
step-time model takes from the measurements.

The generated ``train.py`` runs the measurements itself when ``MOCOMPILE_PROBE_KERNELS`` names a file
(through the same torchrun / Slurm / Kubernetes launcher as the training), so they run with the
plan's own GEMM shapes on the nodes and software the training will use. This module holds the CPU
side: the shapes, rendered into ``train.py`` as integer literals, and the fits over what comes back.
Nothing here imports torch.

Two figures reach the model, each as a ratio to the same measurement on a healthy Hopper SXM GPU
(``probe_reference_*`` in data/steptime.yaml), never as an absolute efficiency: the model's own
``gemm_efficiency`` and ``nccl_a2a_efficiency`` are fitted end to end on published steps, so they are
not a microbenchmark's share and must not be replaced by one.

- ``gemm_scale``: the achieved share of the datasheet BF16 peak at an 8192-cubed GEMM over the
  reference share. A throttled, power-capped or PCIe part shows below 1; the lent SXM parts show ~1.
- ``a2a_scale``: NCCL all-to-all throughput inside a node per GPU (bytes each rank sends to the other
  ranks over time, fitted over the large messages) as a share of the datasheet NVLink rate, over the
  reference share; with the fitted per-call latency.
"""

from __future__ import annotations

import statistics
from typing import Any

REFERENCE_GEMM = (8192, 8192, 8192)
MAX_ROWS = 65536                           # longer rows measure nothing new and cost seconds per shape
A2A_BYTES = tuple(2 ** p for p in range(16, 29, 2))  # 64 KiB ... 256 MiB sent per rank
SCALE_BOUNDS = (0.1, 2.0)                  # outside: the measurement is broken, not the cluster
REFERENCE_ARCH = "hopper"                  # the architecture the probe_reference_* shares were measured on


def gemm_shapes(m: dict[str, Any], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The reference GEMM and the plan's own: attention QKV and the experts' fc1/fc2 at the rows one
    micro-batch gives each rank (after the TP/SP split and routing; ``rows`` as the step-time model counts
    them)."""
    tp = int(settings["tensor_model_parallel_size"])
    cp = int(settings["context_parallel_size"])
    ep = int(settings["expert_model_parallel_size"])
    etp = int(settings.get("expert_tensor_parallel_size") or 1)
    tokens = int(settings["seq_length"]) * int(settings["micro_batch_size"]) // max(1, cp)
    h = int(m["hidden_size"])
    kv = int(m.get("kv_channels") or h // int(m["num_attention_heads"]))
    qkv = (int(m["num_attention_heads"]) + 2 * int(m.get("num_query_groups") or m["num_attention_heads"])) * kv
    shapes = [{"what": "reference", "m": REFERENCE_GEMM[0], "n": REFERENCE_GEMM[1], "k": REFERENCE_GEMM[2]},
              {"what": "attention qkv", "m": min(MAX_ROWS, tokens), "n": max(1, qkv // tp), "k": h}]
    experts = int(m.get("num_moe_experts") or 0)
    if experts:
        rows = tokens // tp * int(m["moe_router_topk"]) * ep // experts
        f = int(m["moe_ffn_hidden_size"]) // etp
        gated = 2 if m.get("gated_linear_unit", True) else 1
        shapes += [{"what": "expert fc1", "m": max(1, min(MAX_ROWS, rows)), "n": gated * f, "k": h},
                   {"what": "expert fc2", "m": max(1, min(MAX_ROWS, rows)), "n": h, "k": f}]
    return shapes


def fit_a2a(points: list[dict[str, float]], ranks: int) -> dict[str, float] | None:
    """Latency and per-GPU throughput of an all-to-all over ``ranks`` ranks from (bytes per rank, us)
    points: the bytes a rank sends to the others are ``bytes * (ranks - 1) / ranks``; throughput by least
    squares over the messages of 4 MiB and more (the bandwidth-bound end), latency the fastest of the smaller
    messages (latency-bound: noise only adds to them; on a lent H100 node 64 KiB took 95 or 154 us in two
    runs, 256 KiB-1 MiB 77-101 us). None with fewer than two usable points or a non-positive slope."""
    if ranks < 2:
        return None
    pts = sorted((float(p["bytes"]) * (ranks - 1) / ranks, float(p["us"]) * 1e-6) for p in points
                 if p.get("bytes") and p.get("us") and p["us"] > 0)
    big = [p for p in pts if p[0] >= 4 * 2 ** 20 * (ranks - 1) / ranks]
    if len(big) < 2:
        return None
    mx, my = statistics.fmean(x for x, _ in big), statistics.fmean(y for _, y in big)
    sxx = sum((x - mx) ** 2 for x, _ in big)
    slope = sum((x - mx) * (y - my) for x, y in big) / sxx if sxx else 0.0
    if slope <= 0:
        return None
    small = [y for x, y in pts if x < 4 * 2 ** 20 * (ranks - 1) / ranks] or [pts[0][1]]
    return {"gbps": round(1.0 / slope / 1e9, 1), "latency_us": round(min(small) * 1e6, 1), "ranks": ranks}


def reference_share(result: dict[str, Any], peak_tflops: float) -> float | None:
    """The reference GEMM's achieved share of the datasheet BF16 peak, or None if it was not measured."""
    for g in result.get("gemm") or []:
        if g.get("what") == "reference" and g.get("tflops"):
            return float(g["tflops"]) / peak_tflops
    return None


def clamp(x: float) -> float:
    return max(SCALE_BOUNDS[0], min(SCALE_BOUNDS[1], x))
