#!/usr/bin/env python3
"""GPT-OSS's layer features on one GPU with Transformer Engine: what do they cost? (issue 8, calibration)

The step-time model under-predicts every published GPT-OSS-120B row (-9 % to -34 %) while it fits the other
models; GPT-OSS differs in attention (64 heads of 64 dims, learnable softmax sinks, a 128-token sliding window
on every other layer) and in biased expert GEMMs. This times each feature alone, forward + backward, against
the same shape without it, so the model can be checked feature by feature instead of fitted on the total.

    python3 benchmarks/gpu/gptoss_micro.py OUT.json      (on a GPU host after benchmarks/gpu/te.sh)

Each case, in interleaved rounds (ROUNDS, default 3): the median of 10 timed forward+backward passes after 3
warm-up passes between CUDA events (wall time: it includes the host's launch time when the GPU waits for it), the
GPU kernel time per pass from the PyTorch profiler, and the attention backend TE chose (its debug log); errors
are recorded, not raised.
"""
from __future__ import annotations

import logging
import os
import sys

from microbench import kernel_and_busy_ms, kernel_ms, run_rounds, timed, write_results

os.environ.setdefault("NVTE_DEBUG", "1")
os.environ.setdefault("NVTE_DEBUG_LEVEL", "2")


class _Backends(logging.Handler):
    """Collect TE's 'Running with ... backend' lines."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "backend" in msg.lower() and ("running with" in msg.lower() or "selected" in msg.lower()
                                         or "available" in msg.lower()):
            self.lines.append(msg[:300])


def attention_case(te, torch, heads: int, groups: int, dim: int, batch: int, window, softmax: str,
                   seq: int = 4096) -> dict:
    kw = {}
    if window is not None:
        kw["window_size"] = window
    if softmax != "vanilla":
        kw["softmax_type"] = softmax
    attn = te.DotProductAttention(heads, dim, num_gqa_groups=groups, qkv_format="sbhd",
                                  attn_mask_type="causal", **kw).cuda()
    q = torch.randn(seq, batch, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(seq, batch, groups, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(seq, batch, groups, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(seq, batch, heads * dim, device="cuda", dtype=torch.bfloat16)

    def step():
        o = attn(q, k, v)
        o.backward(grad)

    def forward():
        with torch.no_grad():
            attn(q, k, v)

    ms = timed(torch, step)
    fwd_ms = timed(torch, forward)
    gpu_ms = kernel_ms(torch, step)
    # FLOPs as the step-time model counts them: 4*d per attended key per head forward (QK^T and PV), x3 fwd+bwd
    keys = (seq + 1) / 2 if window is None else min(window[0] + 1, (seq + 1) / 2)
    flops = 3 * 4 * dim * heads * keys * seq * batch
    return {"ms": ms, "fwd_ms": fwd_ms, "gpu_ms": gpu_ms, "model_flops": flops, "tflops": flops / ms / 1e9}


def grouped_case(te, torch, experts: int, rows: int, din: int, dout: int, bias: bool) -> dict:
    gl = te.GroupedLinear(experts, din, dout, bias=bias, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(experts * rows, din, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(experts * rows, dout, device="cuda", dtype=torch.bfloat16)
    splits = [rows] * experts

    def step():
        y = gl(x, splits)
        y.backward(g)

    ms = timed(torch, step)
    flops = 3 * 2 * experts * rows * din * dout
    gpu, busy = kernel_and_busy_ms(torch, step)
    return {"ms": ms, "gpu_ms": gpu, "busy_ms": busy, "tflops": flops / ms / 1e9}


def matmul_case(torch, m: int, k: int, n: int) -> dict:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ms = timed(torch, lambda: a @ b, reps=20)
    return {"ms": ms, "tflops": 2 * m * k * n / ms / 1e9}


def _line(r: dict) -> str:
    return (f"{r['ms']:8.3f} ms {r['tflops']:7.1f} TFLOPS" + (f"  fwd {r['fwd_ms']:.3f} ms" if "fwd_ms" in r else "")
            + (f"  kernels {r['gpu_ms']:.3f} ms" if "gpu_ms" in r else "")
            + f"  runs {' '.join(f'{x:.3f}' for x in r['ms_runs'])}")


def main() -> int:
    out_path = sys.argv[1] if len(sys.argv) > 1 else "gptoss_micro.json"
    backends = _Backends()
    logging.getLogger().addHandler(backends)
    logging.getLogger().setLevel(logging.DEBUG)
    import torch
    import transformer_engine.pytorch as te

    try:  # after TE's import torch may find another cuDNN than it was built with (seen: 9.14 vs 9.19)
        cudnn = torch.backends.cudnn.version()
    except RuntimeError as e:
        cudnn = str(e)[:200]
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "te": getattr(te, "__version__", None), "cudnn": cudnn, "cases": {}}
    def attn(heads, groups, dim, batch, seq, window, softmax):
        return lambda: attention_case(te, torch, heads, groups, dim, batch, window, softmax, seq)

    cases = [
        ("matmul 16384x2880x5760", lambda: matmul_case(torch, 16384, 2880, 5760)),
        ("matmul 16384x4096x4096", lambda: matmul_case(torch, 16384, 4096, 4096)),
        # expert GEMMs of GPT-OSS (hidden 2880, expert FFN 2880, GLU fc1 2x): 8 local experts, with and without bias
        ("grouped fc1 2880->5760", lambda: grouped_case(te, torch, 8, 4096, 2880, 5760, False)),
        ("grouped fc1 2880->5760 bias", lambda: grouped_case(te, torch, 8, 4096, 2880, 5760, True)),
        ("grouped fc2 2880->2880", lambda: grouped_case(te, torch, 8, 4096, 2880, 2880, False)),
        ("grouped fc2 2880->2880 bias", lambda: grouped_case(te, torch, 8, 4096, 2880, 2880, True)),
    ]
    # attention: GPT-OSS's shape (64 q heads, 8 kv, d 64) and the same query width with d 128 (Qwen3-like), at
    # 8192 tokens per case (and 16384), causal or a sliding window of w keys (MCore window_size (w-1, 0)), with
    # and without learnable sinks
    for dim, heads, groups in ((64, 64, 8), (128, 32, 4)):
        for seq, batch in ((2048, 4), (4096, 2), (8192, 1)):
            for window in (None, 128, 1024):
                for softmax in ("vanilla", "learnable"):
                    if dim == 128 and (softmax != "vanilla" or window == 1024):
                        continue
                    name = (f"attn d{dim} h{heads} g{groups} s{seq} b{batch} "
                            f"{'causal' if window is None else f'window{window}'}{' sinks' if softmax != 'vanilla' else ''}")
                    cases.append((name, attn(heads, groups, dim, batch, seq, None if window is None else (window - 1, 0),
                                             softmax)))
    cases.append(("attn d64 h64 g8 s4096 b4 window128", attn(64, 8, 64, 4, 4096, (127, 0), "vanilla")))
    def first_round_backends(r: dict, rnd: int) -> None:
        if rnd == 0:
            r["backend_log"] = backends.lines[-3:]

    res["cases"] = run_rounds(torch, cases, int(os.environ.get("ROUNDS", "3")), before=backends.lines.clear,
                              after=first_round_backends)
    write_results(res, out_path, _line, 44)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
