#!/usr/bin/env python3
"""Issue 10: join the 4-GPU grid calls, compare with the compiler's predictions, write the results.

    python3 benchmarks/gpu/grid_report.py --out benchmarks/results/grid-4xh200-2026-11-26 \
        --call benchmarks/results/grid-4xh200-2026-11-26/callA.json[:smi-callA.csv.gz] ...

For each variant (a generated/bench-mid-* launcher): every run (call, round, position in the
call's run order, per-run median step time and within-run CV, loss at the last iteration from the
last pipeline stage, per-rank peak memory, GPU busy share from nvidia-smi), then the median of the
per-run medians with min..max spread, tokens/s, max peak allocated/reserved over runs and ranks,
and the compiler's predictions read from generated/<variant>/mocompile.lock.json **now**
(memory.estimate_gib; the step-time estimate under any key whose name contains "step_time").
When predictions exist: Spearman rank correlation (predicted vs measured step time) and the
auto plan vs the best measured plan. Writes <out>.json, <out>.md and <out>.png (matplotlib optional).
Standard library except for the plot.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30


def load_smi(path: Path | None) -> list[tuple[float, int, float]]:
    """(unix time, gpu index, utilization.gpu %) rows of an nvidia-smi CSV log (timestamps UTC)."""
    if path is None or not path.exists():
        return []
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt") as fh:
        for line in fh:
            p = [x.strip() for x in line.split(",")]
            try:
                t = dt.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc).timestamp()
                rows.append((t, int(p[1]), float(p[2].split()[0])))
            except (ValueError, IndexError):
                continue
    return rows


def busy_share(run: dict[str, Any], smi: list[tuple[float, int, float]], warmup: int) -> float | None:
    """Mean utilization.gpu over the measured steps of one run, all GPUs (approximate window).

    The training loop ends where the longest stretch of samples with a mean over GPUs >= 40 % ends
    (teardown and the next job's start stay below that); the window is the sum of the measured steps' wall times before it."""
    if not smi or "started" not in run:
        return None
    start, end = run["started"], run["started"] + run.get("wall_s", 0)
    inside = [r for r in smi if start <= r[0] <= end]
    if not inside:
        return None
    by_t: dict[float, list[float]] = {}
    for t, _, u in inside:
        by_t.setdefault(round(t, 1), []).append(u)
    times = sorted(by_t)
    busy_t = [t for t in times if statistics.fmean(by_t[t]) >= 40]
    if not busy_t:
        return None
    # the training loop = the longest stretch of busy samples (gaps <= 1.5 s); a lone busy sample
    # after it (teardown, next job) is not the end of the loop
    segs, cur = [], [busy_t[0]]
    for t in busy_t[1:]:
        if t - cur[-1] <= 1.5:
            cur.append(t)
        else:
            segs.append(cur)
            cur = [t]
    segs.append(cur)
    stop = max(segs, key=lambda seg: seg[-1] - seg[0])[-1]
    rows = sorted((r for r in run.get("metrics", []) if "step_ms" in r), key=lambda r: r.get("iteration", 0))
    measured_s = sum(float(r["step_ms"]) for r in rows[warmup:]) / 1000.0
    window = [u for t, _, u in inside if stop - measured_s <= t <= stop]
    return statistics.fmean(window) if window else None


LOCKS = REPO / "generated"


def lock_predictions(variant: str) -> dict[str, Any]:
    path = LOCKS / variant / "mocompile.lock.json"
    out: dict[str, Any] = {"lock": str(path), "found": path.exists()}
    if not path.exists():
        return out
    lock = json.loads(path.read_text())
    out["memory_estimate_gib"] = (lock.get("memory") or {}).get("estimate_gib")
    found: dict[str, Any] = {}

    def walk(node: Any, trail: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                here = f"{trail}.{k}" if trail else k
                if "step_time" in k and isinstance(v, (int, float)):
                    found[here] = v
                elif "step_time" in k and isinstance(v, dict) and isinstance(v.get("value"), (int, float)):
                    found[here] = v["value"]
                walk(v, here)

    walk(lock, "")
    out["step_time_keys"] = found
    for key in ("estimate.step_time_s", "steptime.step_time_s", "step_time_s"):
        if key in found:
            out["step_time_s"] = found[key]
            break
    else:
        secs = {k: v for k, v in found.items() if k.endswith("step_time_s")}
        if secs:
            out["step_time_s"] = next(iter(secs.values()))
    s = lock.get("settings") or {}

    def g(k: str) -> Any:
        v = s.get(k)
        return v.get("value") if isinstance(v, dict) else v

    out["plan_now"] = {"tp": g("tensor_model_parallel_size"), "pp": g("pipeline_model_parallel_size"),
                       "vpp": g("virtual_pipeline_model_parallel_size"), "ep": g("expert_model_parallel_size"),
                       "dispatcher": g("moe_token_dispatcher_type"), "backend": g("moe_flex_dispatcher_backend"),
                       "overlap": g("overlap_moe_expert_parallel_comm"), "recompute": g("recompute_granularity")}
    out["input_hash"] = (lock.get("_generated") or {}).get("input") if isinstance(lock.get("_generated"), dict) else None
    return out


PROFILE_FIELDS = ("wall_ms", "busy_ms", "compute_ms", "comm_ms", "comm_hidden_ms", "comm_exposed_ms", "idle_ms")


def _trace_medians(profile: dict[str, Any] | None) -> dict[str, float] | None:
    """Per-step medians of the first rank's trace summary (run_bench.py / trace_report.py), if any."""
    for key, summary in sorted((profile or {}).items()):
        if key != "dir" and isinstance(summary, dict) and summary.get("median"):
            return {k: summary["median"][k] for k in PROFILE_FIELDS if k in summary["median"]}
    return None


def same(run_plan: dict[str, Any], now: dict[str, Any] | None) -> bool:
    """Is the plan a run used (layout, dispatcher, EP overlap) the plan a lock describes now?"""
    if not now:
        return False
    disp = now["dispatcher"] if now["dispatcher"] != "flex" else f"flex/{now['backend']}"
    return (run_plan["tp"], run_plan["pp"], run_plan["ep"], run_plan["dispatcher"], bool(run_plan["overlap"])) == \
        (now["tp"], now["pp"], now["ep"], disp, bool(now["overlap"]))


def ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: list[float], b: list[float]) -> float | None:
    if len(a) < 3:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=False))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output path without suffix")
    ap.add_argument("--call", action="append", required=True, help="results JSON[:smi csv(.gz)] of one device call")
    ap.add_argument("--auto", default="bench-mid-auto")
    ap.add_argument("--asked", default="nvidia-h100-x4",
                    help="the device kind the calls asked for (the header says whether the GPUs in the JSON are that)")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--locks", default=str(REPO / "generated"),
                    help="folder of compiled recipes to read predictions from (default: generated/)")
    args = ap.parse_args(argv)
    global LOCKS
    LOCKS = Path(args.locks).resolve()

    variants: dict[str, dict[str, Any]] = {}
    calls = []
    gpu_names = set()
    for spec in args.call:
        jpath, _, spath = spec.partition(":")
        doc = json.loads(Path(jpath).read_text())
        smi = load_smi(Path(spath) if spath else None)
        warmup = int(doc["method"]["warmup_iterations_excluded"])
        gpu_names.add(doc["host"].get("gpu_name"))
        calls.append({"file": Path(jpath).name, "host_tag": doc["host_tag"], "created": doc["created"],
                      "order": doc["order"], "host": doc["host"], "harness_env": doc["method"].get("harness_env"),
                      "deepep": doc.get("deepep")})
        for lock_name, var in doc["variants"].items():
            # A recipe that compiled to another plan in an earlier call (the auto recipe follows the
            # planner) is a different plan: its runs are kept apart, under "<name> (earlier plan)".
            now = lock_predictions(lock_name).get("plan_now")
            name = lock_name if not now or same(var, now) else f"{lock_name} (earlier plan)"
            entry = variants.setdefault(name, {"lock_name": lock_name, "plan_run": {k: var.get(k) for k in (
                "tp", "pp", "ep", "dispatcher", "overlap", "seq_length", "global_batch_size", "micro_batch_size",
                "train_iters", "estimate_gib")}, "runs": [], "failures": []})
            for run in var["runs"]:
                s = run.get("summary") or {}
                if run.get("rc") == 0 and s:
                    pos = doc["order"].index(f"{run['repeat']}:{name}") if f"{run['repeat']}:{name}" in doc["order"] else None
                    entry["runs"].append({
                        "call": doc["host_tag"], "round": run["repeat"], "position_in_call": pos,
                        "median_step_ms": round(s["median_step_ms"], 1), "mean_step_ms": round(s["mean_step_ms"], 1),
                        "within_run_cv_pct": round(s["cv_pct"], 1), "measured_steps": s["measured_steps"],
                        "steps_ms": [round(r["step_ms"], 1) for r in sorted(run["metrics"], key=lambda r: r["iteration"])],
                        "last_loss": s["last_loss"], "loss_source": s["loss_source"],
                        "loss_curve": s.get("loss_curve"),
                        "peak_allocated_gib": round(s["peak_allocated_gib"], 3),
                        "peak_reserved_gib": round(s["peak_reserved_gib"], 3),
                        "per_rank_peak_allocated_gib": s.get("per_rank_peak_allocated_gib"),
                        "per_rank_peak_reserved_gib": s.get("per_rank_peak_reserved_gib"),
                        "gpu_busy_pct": (round(b, 1) if (b := busy_share(run, smi, warmup)) is not None else None),
                        "wall_s": run.get("wall_s"),
                        "profile": _trace_medians(run.get("profile")),
                    })
                elif run.get("skipped") != "time budget":
                    entry["failures"].append({"call": doc["host_tag"], "round": run.get("repeat"),
                                              "rc": run.get("rc"), "skipped": run.get("skipped"),
                                              "error": (run.get("error") or [])[:4]})
    if len(gpu_names) > 1:
        raise SystemExit(f"grid_report: calls from different GPUs: {gpu_names}")
    gpu = next(iter(gpu_names))

    rows = []
    for name, e in sorted(variants.items()):
        runs = e["runs"]
        pred = lock_predictions(e.get("lock_name", name))
        e["predicted"] = pred
        if not runs:
            e["summary"] = {"runs_ok": 0}
            continue
        med = [r["median_step_ms"] for r in runs]
        m = statistics.median(med)
        gbs, seq = e["plan_run"]["global_batch_size"], e["plan_run"]["seq_length"]
        alloc = max(r["peak_allocated_gib"] for r in runs)
        losses = [r["last_loss"] for r in runs]
        busy = [r["gpu_busy_pct"] for r in runs if r["gpu_busy_pct"] is not None]
        e["summary"] = {
            "runs_ok": len(runs), "median_step_ms": round(m, 1), "run_medians_ms": med,
            "spread_min_ms": min(med), "spread_max_ms": max(med),
            "spread_pct": round((max(med) - min(med)) / m * 100, 1),
            "tokens_per_s": round(gbs * seq / (m / 1000.0)),
            "peak_allocated_gib": round(alloc, 2),
            "peak_reserved_gib": round(max(r["peak_reserved_gib"] for r in runs), 2),
            "last_losses": losses, "loss_median": statistics.median(losses),
            "within_run_cv_pct": [r["within_run_cv_pct"] for r in runs],
            "gpu_busy_pct_median": round(statistics.median(busy), 1) if busy else None,
        }
        est = pred.get("memory_estimate_gib")
        if est is not None:
            e["summary"]["memory_estimate_error_pct"] = round((est - alloc) / alloc * 100, 1)
        est_run = e["plan_run"].get("estimate_gib")
        if est_run is not None:
            e["summary"]["memory_estimate_at_run_gib"] = est_run
            e["summary"]["memory_estimate_at_run_error_pct"] = round((est_run - alloc) / alloc * 100, 1)
        if pred.get("step_time_s") is not None:
            e["summary"]["step_time_error_pct"] = round((pred["step_time_s"] * 1000 - m) / m * 100, 1)
        rows.append(name)

    # A lock recompiled after the run may describe another plan (the auto recipe follows the planner):
    # then its prediction is not for what ran. Use the prediction of a pinned variant whose current
    # plan equals the plan that ran, and say so.
    for n in rows:
        e = variants[n]
        if e["predicted"].get("found") and not same(e["plan_run"], e["predicted"].get("plan_now")):
            e["predicted"]["plan_changed_since_run"] = True
            e["predicted"]["step_time_s_of_current_plan"] = e["predicted"].pop("step_time_s", None)
            e["predicted"]["memory_estimate_gib_of_current_plan"] = e["predicted"].pop("memory_estimate_gib", None)
            twin = next((m for m in rows if m != n and same(e["plan_run"], variants[m]["predicted"].get("plan_now"))
                         and not variants[m]["predicted"].get("plan_changed_since_run")), None)
            if twin:
                e["predicted"]["step_time_s"] = variants[twin]["predicted"].get("step_time_s")
                e["predicted"]["memory_estimate_gib"] = variants[twin]["predicted"].get("memory_estimate_gib")
                e["predicted"]["prediction_from"] = twin
                e["summary"]["duplicate_of"] = twin
            s_ = e["summary"]
            est = e["predicted"].get("memory_estimate_gib")
            peak = s_["peak_allocated_gib"]
            s_["memory_estimate_error_pct"] = round((est - peak) / peak * 100, 1) if est else None
            st = e["predicted"].get("step_time_s")
            s_["step_time_error_pct"] = round((st * 1000 - s_["median_step_ms"]) / s_["median_step_ms"] * 100, 1) if st else None
    # Spearman over distinct plans (a variant that ran the same plan as another is left out).
    with_pred = [n for n in rows if variants[n]["predicted"].get("step_time_s") is not None
                 and not variants[n]["summary"].get("duplicate_of")]
    checks: dict[str, Any] = {}
    if with_pred:
        a = [variants[n]["predicted"]["step_time_s"] for n in with_pred]
        b = [variants[n]["summary"]["median_step_ms"] for n in with_pred]
        checks["spearman_predicted_vs_measured_step_time"] = spearman(a, b)
        checks["spearman_variants"] = with_pred
    else:
        checks["spearman_predicted_vs_measured_step_time"] = None
        checks["spearman_note"] = "no step-time prediction in the lock files at report time"
    if rows:
        best = min(rows, key=lambda n: variants[n]["summary"]["median_step_ms"])
        checks["best_measured"] = best
        if args.auto in rows:
            am = variants[args.auto]["summary"]["median_step_ms"]
            bm = variants[best]["summary"]["median_step_ms"]
            checks["auto_vs_best_pct"] = round((am - bm) / bm * 100, 1)
            checks["auto_plan_run"] = variants[args.auto]["plan_run"]
            checks["auto_plan_now"] = variants[args.auto]["predicted"].get("plan_now")
            now_twin = next((m for m in rows if m != args.auto
                             and same(variants[m]["plan_run"], variants[args.auto]["predicted"].get("plan_now"))), None)
            if variants[args.auto]["predicted"].get("plan_changed_since_run"):
                checks["auto_plan_changed_since_run"] = True
                checks["auto_plan_now_measured_as"] = now_twin
                if now_twin:
                    nm = variants[now_twin]["summary"]["median_step_ms"]
                    checks["auto_plan_now_vs_best_pct"] = round((nm - bm) / bm * 100, 1)
        mem_err = {n: variants[n]["summary"].get("memory_estimate_error_pct") for n in rows}
        checks["memory_estimate_error_pct"] = mem_err
        # a variant whose run plan no current lock describes (the auto recipe moved to an unmeasured plan)
        # has no estimate to compare: it is listed, not counted as a miss
        checks["memory_within_10pct"] = all(abs(v) <= 10 for v in mem_err.values() if v is not None) and \
            any(v is not None for v in mem_err.values())
        checks["memory_without_estimate"] = sorted(n for n, v in mem_err.items() if v is None)
        mem_run = {n: variants[n]["summary"].get("memory_estimate_at_run_error_pct") for n in rows}
        checks["memory_estimate_at_run_error_pct"] = mem_run
        checks["memory_at_run_within_10pct"] = all(v is not None and abs(v) <= 10 for v in mem_run.values())
    doc = {"schema": 1, "gpu": gpu, "gpu_count": calls[0]["host"].get("gpu_count"), "asked_for": args.asked,
           "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "notes": args.note, "predictions_from": str(LOCKS), "calls": calls, "variants": variants, "checks": checks,
           "method": {
               "step_time": "rank-0 wall time between Bridge's step callbacks with torch.cuda.synchronize(); "
                            "per run: median of the steps after the first 4; per variant: median of the run medians, "
                            "spread = min..max of the run medians",
               "loss": "lm loss at the last iteration, Bridge log line of the last rank (last pipeline stage)",
               "memory": "max over ranks and runs of torch.cuda.max_memory_allocated/reserved (every rank sampled)",
               "gpu_busy": "nvidia-smi utilization.gpu (share of time a kernel ran), mean over the 4 GPUs and the "
                           "measured steps' window (approximate: 500 ms sampling, window from the wall times)",
               "tokens_per_s": "global batch x sequence / median step time"}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    md = markdown(doc, rows)
    out.with_suffix(".md").write_text(md)
    note = plot(doc, rows, out.with_suffix(".png"))
    print(md)
    if note:
        print(note)
    return 0


def f(x: Any, nd: int = 0) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def lent_note(doc: dict[str, Any]) -> str:
    """'asked for X; lent Y' from the GPU name the calls recorded, not assumed."""
    asked = doc.get("asked_for") or "nvidia-h100-x4"
    gpu = str(doc.get("gpu") or "")
    asked_model = next((g for g in ("h100", "h200", "b200", "gb200") if g in asked.lower()), None)
    got = next((g for g in ("H100", "H200", "B200", "GB200") if g in gpu.upper()), None)
    if asked_model and got and asked_model.upper() != got:
        return f"asked for {asked}; the tool lent {got}s"
    return f"asked for {asked}; got {got or gpu}" + ("s" if got else "")


def fmt_plan(p: dict[str, Any] | None) -> str:
    if not p:
        return "–"
    disp = p["dispatcher"] if p.get("dispatcher") != "flex" else f"flex/{p.get('backend')}"
    return f"TP{p['tp']} PP{p['pp']} EP{p['ep']} {disp} ovl {'on' if p.get('overlap') else 'off'}"


def markdown(doc: dict[str, Any], rows: list[str]) -> str:
    gpu = doc["gpu"]
    L = [f"### Grid on {doc['gpu_count']}x {gpu} ({lent_note(doc)})", ""]
    L.append("| plan | runs | median step ms (min–max) | spread | tokens/s | within-run CV % | GPU busy % | "
             "peak alloc / reserved GiB (max rank) | est. GiB at run (err) | est. GiB now (err) | predicted step s now (err) | "
             "loss at last it (runs) |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in rows:
        v = doc["variants"][n]
        s, p = v["summary"], v["predicted"]
        pr = v["plan_run"]
        plan = f"TP{pr['tp']} PP{pr['pp']} EP{pr['ep']} {pr['dispatcher']} ovl {'on' if pr['overlap'] else 'off'}"
        L.append(
            f"| `{n}` ({plan}) | {s['runs_ok']} | {f(s['median_step_ms'])} ({f(s['spread_min_ms'])}–{f(s['spread_max_ms'])}) "
            f"| {f(s['spread_pct'], 1)} % | {s['tokens_per_s']:,} | {', '.join(f(x, 1) for x in s['within_run_cv_pct'])} "
            f"| {f(s['gpu_busy_pct_median'])} | {s['peak_allocated_gib']:.2f} / {s['peak_reserved_gib']:.2f} "
            f"| {f(s.get('memory_estimate_at_run_gib'), 2)} ({f(s.get('memory_estimate_at_run_error_pct'), 1)} %) "
            f"| {f(p.get('memory_estimate_gib'), 2)} ({f(s.get('memory_estimate_error_pct'), 1)} %) "
            f"| {f(p.get('step_time_s'), 3)} ({f(s.get('step_time_error_pct'), 1)} %) "
            f"| {', '.join(f(x, 4) for x in s['last_losses'])} |")
    failed = [(n, v) for n, v in doc["variants"].items() if v["failures"] and not v["runs"]]
    if failed:
        L += ["", "Plans that did not train:", ""]
        for n, v in failed:
            err = next((e for fl in v["failures"] for e in fl["error"] if "Error" in e), v["failures"][0]["error"][:1])
            L.append(f"- `{n}`: {err}")
    c = doc["checks"]
    L += ["", f"- Spearman (predicted vs measured step time): {f(c.get('spearman_predicted_vs_measured_step_time'), 2)}"
          + (f" ({c.get('spearman_note')})" if c.get("spearman_note") else ""),
          f"- best measured: `{c.get('best_measured')}`; auto plan as run vs best: {f(c.get('auto_vs_best_pct'), 1)} %"
          + ((f"; the auto recipe now compiles to another plan, measured as `{c.get('auto_plan_now_measured_as')}`: "
              f"{f(c.get('auto_plan_now_vs_best_pct'), 1)} % vs best" if c.get("auto_plan_now_measured_as") else
              f"; the auto recipe now compiles to another plan, not in this grid: {fmt_plan(c.get('auto_plan_now'))}")
             if c.get("auto_plan_changed_since_run") else ""),
          f"- memory estimate within ±10 % of every measured peak allocated: at run time (the locks the runs used) "
          f"{c.get('memory_at_run_within_10pct')}; now (locks at report time) {c.get('memory_within_10pct')}"
          + (f" (no current estimate for the plan that ran: {', '.join(c['memory_without_estimate'])})"
             if c.get("memory_without_estimate") else ""), ""]
    traced = [(n, [r["profile"] for r in doc["variants"][n]["runs"] if r.get("profile")]) for n in rows]
    traced = [(n, t) for n, t in traced if t]
    if traced:
        L += ["Where a profiled step's time goes (PyTorch profiler on rank 0, recipes with `profile:`; "
              "benchmarks/gpu/trace_report.py; median over the traced steps, then over runs; ms). "
              "busy = any kernel ran; comm = NCCL/DeepEP kernels, which also count time spent waiting for "
              "slower peers; hidden = comm while a compute kernel ran; idle = the GPU waited for the host. "
              "Profiled steps run slower than timed ones (profiler overhead); they are not in the step times above.", "",
              "| plan | traced runs | " + " | ".join(k.replace("_ms", "") for k in PROFILE_FIELDS) + " |",
              "|---|---|" + "---|" * len(PROFILE_FIELDS)]
        for n, t in traced:
            L.append(f"| `{n}` | {len(t)} | " + " | ".join(
                f(statistics.median(x[k] for x in t)) for k in PROFILE_FIELDS) + " |")
        L.append("")
    L.append("Run order per call (round:variant): " + "; ".join(
        f"{cl['host_tag']}: " + ", ".join(o.replace("bench-mid-", "") for o in cl["order"]) for cl in doc["calls"]))
    return "\n".join(L) + "\n"


def plot(doc: dict[str, Any], rows: list[str], png: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "grid_report: matplotlib missing, no plot"
    names = [n.replace("bench-mid-", "") for n in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    for i, n in enumerate(rows):
        v = doc["variants"][n]
        meds = [r["median_step_ms"] for r in v["runs"]]
        ax.scatter([i] * len(meds), meds, color="tab:blue", s=18, zorder=3)
        ax.hlines(v["summary"]["median_step_ms"], i - 0.3, i + 0.3, color="black")
        p = v["predicted"].get("step_time_s")
        if p is not None:
            ax.scatter([i], [p * 1000], marker="x", color="tab:red", zorder=4)
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("step time, ms (dots: run medians; bar: median; x: predicted)")
    ax.set_title(f"{doc['gpu_count']}x {doc['gpu']} ({lent_note(doc)}): step time per plan", fontsize=10)
    ax.set_ylim(bottom=0)
    ax = axes[1]
    meas = [doc["variants"][n]["summary"]["peak_allocated_gib"] for n in rows]
    est = [doc["variants"][n]["predicted"].get("memory_estimate_gib") or 0 for n in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], meas, 0.4, label="measured peak allocated (max rank)")
    ax.bar([i + 0.2 for i in x], est, 0.4, label="mocompile estimate")
    ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GiB")
    ax.legend(fontsize=8)
    ax.set_title("memory")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return None


if __name__ == "__main__":
    sys.exit(main())
