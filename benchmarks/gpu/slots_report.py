"""Tables for a grid run by issue22_slots.py: per plan the median of run medians, its spread, tokens/s,
GPU busy share, peak memory against the lock's estimate, and which plans the data can rank.

Why a rule for ranking: step times on the lent hosts swing about +-20 % between runs of one plan, so a
plan is called faster than another only where their ranges of run medians do not overlap.

    python3 benchmarks/gpu/slots_report.py RESULTS_DIR [--auto PLAN] [--skip-first N]

RESULTS_DIR holds runs.jsonl, time-<plan>-r<k>.jsonl, time-<plan>-r<k>-rank<N>.json, lock-i22-<plan>.json
and smi.csv; writes grid.md and grid.json there. --auto names the pinned plan whose lock settings equal
those of lock-i22-auto.json (checked here, not assumed).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import re
import statistics
import sys
from pathlib import Path

GIB = 2**30
# lock settings that name or explain a plan rather than change what runs
NOT_PLAN = {"name", "train_iters", "profile", "memory_biggest_term", "step_time_estimate_s", "memory_estimate_gib",
            "decision", "shipped_recipe"}


def _settings(lock: dict) -> dict:
    return {k: (v.get("value") if isinstance(v, dict) else v) for k, v in lock.get("settings", {}).items()}


def _gpu_busy(smi: list[dict], gpus: set[int], start: float, end: float) -> float | None:
    """Mean nvidia-smi utilization of the run's GPUs over the second half of its wall time (the steps)."""
    mid = start + (end - start) / 2
    vals = [r["util"] for r in smi if r["gpu"] in gpus and mid <= r["t"] <= end]
    return round(statistics.mean(vals), 1) if vals else None


def _read_smi(path: Path) -> list[dict]:
    """nvidia-smi samples (smi.csv or smi.csv.gz): time, GPU index, utilization %."""
    import gzip

    if not path.is_file():
        return []
    rows = []
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        for rec in csv.reader(f):
            if not rec or rec[0].startswith("timestamp"):
                continue
            try:
                t = dt.datetime.strptime(rec[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.UTC).timestamp()
                rows.append({"t": t, "gpu": int(rec[1]), "util": float(rec[2].strip().rstrip(" %"))})
            except ValueError:
                continue
    return rows


def _runs(root: Path, skip_first: int, smi: list[dict]) -> list[dict]:
    out = []
    for line in (root / "runs.jsonl").read_text().splitlines():
        rec = json.loads(line)
        m = re.fullmatch(r"(time|det)-(.+)-r(\d+)([a-z]?)", rec["tag"]) or re.fullmatch(r"(det)-(.+)()()", rec["tag"])
        if not m:
            continue
        kind, plan, rnd = m.group(1), m.group(2), m.group(3)
        rows = []
        path = root / f"{rec['tag']}.jsonl"
        if path.is_file():
            rows = [json.loads(x) for x in path.read_text().splitlines()]
        ms = [r["step_ms"] for r in rows if r["iteration"] > skip_first]
        peaks = [json.loads(p.read_text())["max_memory_allocated"] for p in root.glob(f"{rec['tag']}-rank*.json")]
        run = {"tag": rec["tag"], "kind": kind, "plan": plan, "round": int(rnd) if rnd else None, "rc": rec["rc"],
               "slot": rec["slot"], "beside": rec["overlapped"], "steps": len(rows)}
        if ms:
            run.update(median_ms=statistics.median(ms), cv=statistics.pstdev(ms) / statistics.mean(ms) * 100,
                       last_loss=rows[-1].get("loss"), peak_gib=max(peaks) / GIB if peaks else None,
                       gpu_busy=_gpu_busy(smi, {int(g) for g in rec["gpus"].split(",")}, rec["start"], rec["end"]))
        else:
            log = root / f"{rec['tag']}.log.gz"
            run["failure"] = _failure(log)
        out.append(run)
    return out


def _failure(log: Path) -> str:
    import gzip

    if not log.is_file():
        return "no log"
    lines = [x for x in gzip.open(log, "rt", errors="replace").read().splitlines() if "Error" in x or "error:" in x]
    return lines[-1].strip()[:200] if lines else "no error line"


def summarise(root: Path, auto: str | None, skip_first: int) -> dict:
    smi = _read_smi(root / "smi.csv.gz") or _read_smi(root / "smi.csv")
    runs = _runs(root, skip_first, smi)
    plans: dict[str, dict] = {}
    for run in runs:
        if run["kind"] != "time":
            continue
        p = plans.setdefault(run["plan"], {"plan": run["plan"], "runs": [], "failed": []})
        (p["runs"] if "median_ms" in run else p["failed"]).append(run)
    for name, p in plans.items():
        lock_path = root / f"lock-i22-{name}.json"
        lock = json.loads(lock_path.read_text()) if lock_path.is_file() else {}
        s = _settings(lock)
        meds = [r["median_ms"] for r in p["runs"]]
        gpus = int(s.get("world_size") or 0) or (4 if name.startswith("pp") else 2)
        gbs = int(s.get("global_batch_size") or 16)
        seq = int(s.get("seq_length") or 2048)
        peak = max((r["peak_gib"] for r in p["runs"] if r.get("peak_gib")), default=None)
        est = s.get("memory_estimate_gib")
        p.update(
            repeats=len(meds), median_ms=statistics.median(meds) if meds else None,
            lo_ms=min(meds, default=None), hi_ms=max(meds, default=None), gpus=gpus,
            tokens_per_s=gbs * seq / (statistics.median(meds) / 1000) if meds else None,
            within_run_cv=[round(r["cv"], 1) for r in p["runs"]],
            gpu_busy=statistics.median([r["gpu_busy"] for r in p["runs"] if r.get("gpu_busy") is not None] or [0]) or None,
            peak_gib=peak, estimate_gib=est,
            memory_error=(est / peak - 1) if (est and peak) else None,
            predicted_ms=(s.get("step_time_estimate_s") or 0) * 1000 or None,
            losses=[r["last_loss"] for r in p["runs"]])
    two = {k: v for k, v in plans.items() if v["gpus"] == 2 and v["median_ms"]}
    for p in two.values():
        p["faster_than"] = sorted(q["plan"] for q in two.values() if p["hi_ms"] < q["lo_ms"])
    result = {"plans": plans, "runs": runs}
    if two:
        best = min(two.values(), key=lambda p: p["median_ms"])
        result["best"] = best["plan"]
    if auto and auto in two:
        auto_lock = root / "lock-i22-auto.json"
        same = None
        if auto_lock.is_file():
            a = {k: v for k, v in _settings(json.loads(auto_lock.read_text())).items() if k not in NOT_PLAN}
            b = {k: v for k, v in _settings(json.loads((root / f"lock-i22-{auto}.json").read_text())).items()
                 if k not in NOT_PLAN}
            same = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        ap, bp = two[auto], two[result["best"]]
        result["auto"] = {
            "as": auto, "settings_differing_from_auto_lock": same,
            "best": bp["plan"], "gap_vs_best": ap["median_ms"] / bp["median_ms"] - 1,
            "best_distinguishable": bp["hi_ms"] < ap["lo_ms"]}
    done = [r for r in runs if "median_ms" in r and r["kind"] == "time" and r["plan"] in two]
    for key in ("slot", "round"):
        groups: dict[str, list[float]] = {}
        for r in done:
            groups.setdefault(str(r[key]), []).append(r["median_ms"] / two[r["plan"]]["median_ms"])
        result[f"by_{key}"] = {k: (round(statistics.median(v), 3), len(v)) for k, v in sorted(groups.items())}
    alone = [r["median_ms"] / two[r["plan"]]["median_ms"] for r in done if not r["beside"]]
    result["alone"] = (round(statistics.median(alone), 3), len(alone)) if alone else None
    return result


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(res: dict) -> str:
    lines = ["| plan | GPUs | runs | median step ms (min-max of run medians) | run medians | tokens/s | within-run CV % "
             "| GPU busy % | peak allocated GiB | estimate GiB (error) | faster than (ranges apart) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(res["plans"].values(), key=lambda p: (p["gpus"], p["median_ms"] or 1e9)):
        meds = ", ".join(format(r["median_ms"], ".0f") for r in p["runs"])
        lines.append(
            f"| {p['plan']} | {p['gpus']} | {p['repeats']}{' + ' + str(len(p['failed'])) + ' failed' if p['failed'] else ''} "
            f"| {_fmt(p['median_ms'], '.0f')} ({_fmt(p['lo_ms'], '.0f')}-{_fmt(p['hi_ms'], '.0f')}) "
            f"| {meds} | {_fmt(p['tokens_per_s'], ',.0f')} "
            f"| {', '.join(str(c) for c in p['within_run_cv'])} | {_fmt(p['gpu_busy'], '.0f')} | {_fmt(p['peak_gib'], '.2f')} "
            f"| {_fmt(p['estimate_gib'], '.2f')} ({_fmt((p['memory_error'] or 0) * 100, '+.1f')} %) "
            f"| {', '.join(p.get('faster_than', [])) or '-'} |")
    lines.append("")
    if "auto" in res:
        a = res["auto"]
        differ = a["settings_differing_from_auto_lock"]
        lines.append(f"auto compiles to the plan `{a['as']}` (lock settings differing: {differ}); "
                     f"best median `{a['best']}`, auto {a['gap_vs_best'] * 100:+.1f} % against it; "
                     f"ranges apart: {a['best_distinguishable']}")
    lines.append(f"run median / plan median by slot: {res['by_slot']}; by round: {res['by_round']}; "
                 f"runs with no neighbour: {res['alone']}")
    for p in res["plans"].values():
        for f in p["failed"]:
            lines.append(f"failed: {f['tag']} (slot {f['slot']}): {f['failure']}")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> str:
    """Each plan's run medians (dots, by round) and the median of them (bar), 2-GPU plans first; matplotlib is
    optional (the tables do not need it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "slots_report: matplotlib missing, no plot"
    plans = sorted((p for p in res["plans"].values() if p["median_ms"]), key=lambda p: (p["gpus"], p["median_ms"]))
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(plans) + 1.5))
    for i, p in enumerate(plans):
        ax.barh(i, p["median_ms"], color="#9ecae1" if p["gpus"] == 2 else "#fdae6b")
        for r in p["runs"]:
            ax.plot(r["median_ms"], i, "o", color="black", ms=4)
            ax.annotate(str(r["round"]), (r["median_ms"], i), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_yticks(range(len(plans)), [f"{p['plan']} ({p['gpus']} GPUs)" for p in plans], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("step time, ms (bar: median of run medians; dots: run medians, labelled by round)")
    ax.set_title("issue22_slots grid: " + (f"auto = {res['auto']['as']}" if "auto" in res else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"slots_report: wrote {path}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--auto")
    ap.add_argument("--skip-first", type=int, default=5)
    args = ap.parse_args(argv)
    res = summarise(args.root, args.auto, args.skip_first)
    (args.root / "grid.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    text = markdown(res)
    (args.root / "grid.md").write_text(text)
    print(text)
    print(plot(res, args.root / "grid.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
