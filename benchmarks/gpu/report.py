#!/usr/bin/env python3
"""Turn benchmarks/results/<host-tag>.json files into RESULTS.md and one PNG plot per host tag.

Runs anywhere (no GPU). The table needs only the standard library; the plot needs matplotlib
(``python3 -m pip install matplotlib`` in a scratch venv if it is missing: the report is still
written, with a note, when it is absent).

  python3 benchmarks/gpu/report.py                       # all results in benchmarks/results/
  python3 benchmarks/gpu/report.py --merge OUT.json A.json B.json
      # join runs of the SAME machine taken in several device calls (budget splits), then report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import run_bench  # noqa: E402  (summaries are computed by the same code that ran the benchmark)

GIB = 2**30


def load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or "variants" not in doc:
        raise ValueError(f"{path}: not a run_bench results file")
    return doc


def resummarize(doc: dict[str, Any]) -> None:
    warmup = int(doc.get("method", {}).get("warmup_iterations_excluded", 5))
    prefix = "bench-"
    for var in doc["variants"].values():
        var["summary"] = run_bench.summarize_variant(var, var.get("runs", []), warmup)
    base = [n for n in doc["variants"] if run_bench.variant_key(n, prefix)[0] < len(run_bench.ORDER)]
    losses = {n: doc["variants"][n]["summary"].get("last_loss") for n in base
              if doc["variants"][n]["summary"].get("runs_ok")}
    doc["checks"] = {
        "alltoall_variant_last_losses": losses,
        "alltoall_losses_match": (len(set(losses.values())) == 1 if losses and None not in losses.values() else None),
    }


def merge(out: Path, inputs: list[Path], tag: str | None) -> dict[str, Any]:
    """Join runs from several calls on one machine; every run keeps the call it came from."""
    docs = [load(p) for p in inputs]
    gpu_names = {d.get("host", {}).get("gpu_name") for d in docs}
    if len(gpu_names) > 1:
        raise SystemExit(f"report: refusing to merge results from different GPUs: {gpu_names}")
    base = json.loads(json.dumps(docs[0]))
    base["host_tag"] = tag or base["host_tag"]
    base["merged_from"] = []
    rounds_done: dict[str, int] = {}
    for path, doc in zip(inputs, docs, strict=False):
        base["merged_from"].append({"file": path.name, "host_tag": path.stem, "created": doc.get("created"),
                                    "order": doc.get("order"), "elapsed_s": doc.get("elapsed_s")})
    for name in base["variants"]:
        base["variants"][name]["runs"] = []
    for path, doc in zip(inputs, docs, strict=False):
        call = path.stem
        for name, var in doc["variants"].items():
            if name not in base["variants"]:
                base["variants"][name] = json.loads(json.dumps(var))
                base["variants"][name]["runs"] = []
            for run in var.get("runs", []):
                if run.get("rc") is None and run.get("skipped") == "time budget":
                    continue  # a later call ran it
                run = dict(run)
                run["call"] = call
                if run.get("rc") is not None:
                    run["repeat"] = rounds_done.get(name, 0)
                    rounds_done[name] = run["repeat"] + 1
                base["variants"][name]["runs"].append(run)
        if doc.get("deepep"):
            base["deepep"] = doc["deepep"]
    base["order"] = [f"{m['host_tag']}:{o}" for m in base["merged_from"] for o in (m.get("order") or [])]
    resummarize(base)
    out.write_text(json.dumps(base, indent=1) + "\n")
    print(f"report: merged {len(inputs)} files into {out}")
    return base


def short_name(name: str) -> str:
    return name[len("bench-"):] if name.startswith("bench-") else name


def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def table(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| variant | GPUs | EP | dispatcher | EP overlap | delay wgrad | DP grad-reduce overlap | runs ok | median step ms "
        "| spread: min–max of run medians (half-range, % of median) | tokens/s | peak alloc GiB | peak reserved GiB "
        "| loss at last it. | compiler estimate GiB | estimate error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, var in doc["variants"].items():
        s = var.get("summary", {})
        short = short_name(name)
        if s.get("runs_ok"):
            spread = (f"{fmt(s['spread_min_ms'])}–{fmt(s['spread_max_ms'])} (±{fmt(s['spread_pct'] / 2)} %)"
                      if s["runs_ok"] > 1 else "single run: no spread")
            losses = s.get("last_losses") or []
            loss = (f"{losses[0]:.6f}" if s.get("losses_identical_across_repeats") else
                    " / ".join(f"{v:.6f}" for v in losses))
            err = s.get("estimate_error_pct")
            row = [short, fmt(var.get("gpus")), fmt(var.get("ep")), fmt(var.get("dispatcher")),
                   fmt(var.get("overlap")), fmt(var.get("delay_wgrad")), fmt(var.get("overlap_grad_reduce")),
                   f"{s['runs_ok']}/{s['runs_total']}",
                   fmt(s["median_step_ms"]), spread, fmt(s.get("tokens_per_s"), 0),
                   fmt(s["peak_allocated_gib"], 2), fmt(s["peak_reserved_gib"], 2), loss,
                   fmt(var.get("estimate_gib"), 2), (f"{err:+.0f} %" if err is not None else "–")]
        else:
            why = "; ".join(str(r.get("skipped") or " | ".join((r.get("error") or [])[-2:])) for r in var.get("runs", [])[:1])
            row = [short, fmt(var.get("gpus")), fmt(var.get("ep")), fmt(var.get("dispatcher")),
                   fmt(var.get("overlap")), fmt(var.get("delay_wgrad")), fmt(var.get("overlap_grad_reduce")),
                   f"0/{s.get('runs_total', 0)}",
                   f"**failed**: {why}"[:300].replace("|", "/"), "", "", "", "", "", fmt(var.get("estimate_gib"), 2), ""]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def runs_table(doc: dict[str, Any]) -> list[str]:
    lines = ["| call | round | variant | rc | wall s | median step ms | first step ms | loss at last it. | peak alloc GiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = []
    for name, var in doc["variants"].items():
        for run in var.get("runs", []):
            order.append((run.get("call", doc.get("host_tag")), run.get("repeat", 0), name, run))
    for call, rnd, name, run in order:
        s = run.get("summary") or {}
        lines.append("| " + " | ".join([
            str(call), str(rnd), short_name(name), fmt(run.get("rc")), fmt(run.get("wall_s")),
            fmt(s.get("median_step_ms")), fmt(s.get("first_step_ms")),
            (f"{s['last_loss']:.6f}" if s.get("last_loss") is not None else "–"),
            fmt(s.get("peak_allocated_gib"), 2)]) + " |")
    return lines


def plot(doc: dict[str, Any], png: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (pip install matplotlib in a scratch venv)"
    names = [n for n, v in doc["variants"].items() if v.get("summary", {}).get("runs_ok")]
    if not names:
        return "no successful runs to plot"
    short = [short_name(n) for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for i, n in enumerate(names):
        s = doc["variants"][n]["summary"]
        ax1.bar(i, s["median_step_ms"], color="#4c72b0", alpha=0.75)
        ax1.errorbar(i, s["median_step_ms"], yerr=[[s["median_step_ms"] - s["spread_min_ms"]],
                                                  [s["spread_max_ms"] - s["median_step_ms"]]],
                     color="black", capsize=6)
        ax1.scatter([i] * len(s["run_medians_ms"]), s["run_medians_ms"], color="#dd8452", zorder=3, s=18,
                    label="per-run median" if i == 0 else None)
    ax1.set_xticks(range(len(names)), short, rotation=20, ha="right")
    ax1.set_ylabel("step time, ms (median of run medians; bar = min–max)")
    ax1.set_title("Step time")
    ax1.legend(loc="lower right")
    x = range(len(names))
    alloc = [doc["variants"][n]["summary"]["peak_allocated_gib"] for n in names]
    reserved = [doc["variants"][n]["summary"]["peak_reserved_gib"] for n in names]
    est = [doc["variants"][n].get("estimate_gib") or 0 for n in names]
    w = 0.27
    ax2.bar([i - w for i in x], alloc, w, label="measured peak allocated")
    ax2.bar(list(x), reserved, w, label="measured peak reserved")
    ax2.bar([i + w for i in x], est, w, label="mocompile estimate when run (calibration table: RESULTS.md)")
    ax2.set_xticks(list(x), short, rotation=20, ha="right")
    ax2.set_ylabel("GiB per GPU (rank 0)")
    ax2.set_title("Peak memory vs compiler estimate")
    ax2.legend(loc="lower right", fontsize=8)
    host = doc.get("host", {})
    fig.suptitle(f"{doc['host_tag']}: {host.get('gpu_count')}× {host.get('gpu_name')}, torch {host.get('torch')}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return None


def calibration(files: list[Path]) -> list[str]:
    """Measured peak allocated per variant (all runs, all files) next to the current compiler estimate."""
    peaks: dict[str, float] = {}
    for path in files:
        try:
            doc = load(path)
        except (OSError, ValueError):
            continue
        for name, var in doc.get("variants", {}).items():
            alloc = (var.get("summary") or {}).get("peak_allocated_gib")
            if alloc:
                peaks[name] = max(peaks.get(name, 0.0), float(alloc))
    rows = ["## Memory estimate calibration", "",
            "The compiler's current per-GPU estimate of PyTorch's peak allocation (`memory.estimate_gib` in "
            "`generated/<variant>/mocompile.lock.json`, after calibrating on the runs above) next to the highest "
            "measured `max_memory_allocated` of any run. Goal: within ±10 %.", "",
            "| variant | measured peak alloc GiB | compiler estimate GiB | error |", "|---|---|---|---|"]
    for name in sorted(peaks):
        lock = REPO / "generated" / name / "mocompile.lock.json"
        try:
            est = json.loads(lock.read_text())["memory"]["estimate_gib"]
        except (OSError, ValueError, KeyError):
            continue
        rows.append(f"| {short_name(name)} | {peaks[name]:.2f} | {est:.2f} | {(est - peaks[name]) / peaks[name] * 100:+.1f} % |")
    return rows + [""]


def report(results: Path) -> Path:
    files = sorted(p for p in results.glob("*.json") if p.is_file())
    md = ["# GPU benchmark results", "",
          "Generated by `benchmarks/gpu/report.py` from the JSON files in this folder; do not edit by hand.",
          "Reproduce on a GPU host with `benchmarks/gpu/run.sh` (see `benchmarks/gpu/README.md`).", ""]
    for path in files:
        try:
            doc = load(path)
        except (OSError, ValueError) as exc:
            md += [f"## {path.name}", "", f"unreadable: {exc}", ""]
            continue
        host = doc.get("host", {})
        method = doc.get("method", {})
        md += [f"## {doc['host_tag']}", "",
               f"- Host: {host.get('gpu_count')}× {host.get('gpu_name')} (driver {host.get('driver')}), "
               f"{host.get('cpus')} CPU cores; torch {host.get('torch')}, CUDA {host.get('cuda')}, NCCL {host.get('nccl')}.",
               f"- Method: {method.get('launcher')}; {method.get('repeats')} interleaved rounds "
               f"({method.get('interleaving')}); first {method.get('warmup_iterations_excluded')} iterations "
               f"of each run left out; step time = {method.get('step_time')}.",
               f"- Variant step time = {method.get('variant_step_ms')}. Tokens/s = {method.get('tokens_per_s')}. "
               f"Memory = {method.get('memory')}. Estimate error = (estimate − measured peak allocated) / measured.",
               f"- Run order: {', '.join(doc.get('order') or [])}."]
        if doc.get("merged_from"):
            md.append("- Joined from several device calls on the same held machine (lease kept warm between "
                      "calls): " + "; ".join(f"{m['file']} ({m.get('elapsed_s')} s)" for m in doc["merged_from"]) + ".")
        checks = doc.get("checks", {})
        match = checks.get("alltoall_losses_match")
        same = "identical" if match else "NOT identical" if match is False else "not comparable"
        losses = ", ".join(f"{short_name(k)}={v}" for k, v in (checks.get("alltoall_variant_last_losses") or {}).items())
        md.append(f"- Loss at the last iteration, alltoall variants (same seed): {same} ({losses}).")
        dep = doc.get("deepep")
        if dep:
            md.append(f"- DeepEP (hybrid-ep branch): {dep.get('status')}: {dep.get('reason')}.")
        for note in doc.get("notes", []):
            md.append(f"- {note}")
        md += ["", *table(doc), ""]
        png = results / f"{doc['host_tag']}.png"
        problem = plot(doc, png)
        md += [f"![{doc['host_tag']}]({png.name})" if problem is None else f"_Plot: {problem}_", ""]
        md += ["<details><summary>Every run</summary>", "", *runs_table(doc), "", "</details>", ""]
    md += calibration(files)
    out = results / "RESULTS.md"
    out.write_text("\n".join(md))
    print(f"report: wrote {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--merge", nargs="+", metavar=("OUT", "IN"), help="OUT.json IN1.json IN2.json ...")
    ap.add_argument("--tag", default=None, help="host tag of the merged file (default: the first input's)")
    ap.add_argument("--note", action="append", default=[], help="note to store in the merged file")
    args = ap.parse_args(argv)
    if args.merge:
        if len(args.merge) < 3:
            ap.error("--merge needs OUT and at least two inputs")
        doc = merge(Path(args.merge[0]), [Path(p) for p in args.merge[1:]], args.tag)
        if args.note:
            doc["notes"] = args.note
            Path(args.merge[0]).write_text(json.dumps(doc, indent=1) + "\n")
    report(Path(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
