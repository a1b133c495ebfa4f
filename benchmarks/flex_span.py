"""How often the planner's own plan carries DSP016 (DeepEP across the 8-GPU NVLink nodes of B200/B300, where
NVIDIA's internode runs failed): a grid of intents (5 models x B200/B300/H100 x 4-32 nodes x BF16/MXFP8), with the
shipped recipes in use and withheld. Why a benchmark: the figure behind the planner's ``search.flex_withheld``.

    .venv/bin/python benchmarks/flex_span.py [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "compiler"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from mocompile.pipeline import analyse  # noqa: E402
from mocompile.resolve import search  # noqa: E402
from plan_quality import withheld  # noqa: E402  (the search sees none of the shipped recipes)

MODELS = ["deepseek-v3", "kimi-k2", "qwen3-235b-a22b", "qwen3-30b-a3b", "gpt-oss-120b"]


def grid(tmp: Path, withhold: bool) -> list[str]:
    lines, n, hit = [], 0, 0
    with withheld({a["recipe"] for a in search.anchors()}) if withhold else contextlib.nullcontext():
        for model, gpu, nodes, prec in itertools.product(MODELS, ["b200", "b300", "h100"], [4, 16, 24, 32],
                                                         ["bf16", "mxfp8"]):
            if gpu == "h100" and prec == "mxfp8":
                continue
            path = tmp / f"{model}-{gpu}-{nodes}-{prec}.yaml"
            path.write_text(f"schema: 1\nname: t\nmodel: {model}\nhardware: {{gpu: {gpu}, nodes: {nodes}, gpus_per_node: 8}}\n"
                            f"goal: throughput\ntraining: {{seq_length: 4096, global_batch_size: {nodes * 64}, "
                            f"micro_batch_size: 1, precision: {prec}}}\n")
            res = analyse(str(path))
            if res.plan is None:
                continue
            n += 1
            if "DSP016" in {d.rule for d in res.diagnostics}:
                hit += 1
                p = res.plan
                lines.append(f"  {model} {gpu} x{nodes * 8} {prec}: EP {p['expert_model_parallel_size']} "
                             f"{p['moe_flex_dispatcher_backend']}, {p.settings['tensor_model_parallel_size'].reason[:160]}")
    return [f"shipped recipes {'withheld' if withhold else 'in use'}: {hit}/{n} plans carry DSP016"] + lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = grid(Path(tmp), False) + grid(Path(tmp), True)
    text = "\n".join(out) + "\n"
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
