"""Issue 20's grid against the step-time model, on this machine's CPU: every plan the grid ran is compiled
again here with the probed cluster profile, and its predicted step is set against the measured median of its
runs (issue20_grid.py's state, plus the runs ``mocompile tune`` made of the same plans). Prints a Markdown table,
the share within ``--within`` and Spearman's rank correlation (grid_report.spearman).

    .venv/bin/python benchmarks/gpu/issue20_report.py benchmarks/results/issue20-h200x4-2026-11-27 \
        --profile clusters/probed-h200x4.yaml
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "compiler"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_report import spearman  # noqa: E402  (ties ranked by their mean, as the grid reports do)


def predicted_s(recipe: str, sets: list[str]) -> tuple[float, str, int]:
    from mocompile.pipeline import analyse

    res = analyse(str(ROOT / recipe), sets)
    if res.errors or res.plan is None:
        raise SystemExit(f"{recipe} {sets}: " + "; ".join(d.message for d in res.errors))
    s = res.plan.settings
    return float(s["step_time_estimate_s"].value), res.plan.planner["chosen"]["plan"], int(s["micro_batch_size"].value)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--within", type=float, default=0.15)
    a = ap.parse_args()
    state = json.loads((a.results / "grid-state.json").read_text())
    cluster = f"hardware.cluster=../../{a.profile}"
    rows = []
    for pid, q in state["plans"].items():
        pred, plan, mbs = predicted_s(q["recipe"], [cluster, *q["sets"]])
        runs = [r["median_ms"] for r in state["runs"].get(pid, []) if r.get("median_ms")]
        rows.append({"id": pid, "plan": plan, "mbs": mbs, "pred_ms": pred * 1000, "runs": runs,
                     "machines": sorted({r["machine"] for r in state["runs"].get(pid, [])})})
    tune_path = a.results / "tune.json"
    if tune_path.exists():  # tune's runs: the same plan adds a run, another plan is a row of its own
        tune = json.loads(tune_path.read_text())
        for p in tune["plans"]:
            hit = [r for r in rows if f"{r['plan']}, MBS {r['mbs']}" == p["plan"]]
            if hit:
                hit[0]["runs"] += [x for x in p["runs"] if x]
                hit[0]["tune"] = True
            else:
                rows.append({"id": "tune " + p["id"], "plan": p["plan"].rsplit(", MBS ", 1)[0],
                             "mbs": int(p["plan"].rsplit(", MBS ", 1)[1]), "pred_ms": p["predicted_ms"],
                             "runs": [x for x in p["runs"] if x], "machines": [], "tune": True})
    rows = [r for r in rows if r["runs"]]
    print("| plan | MBS | predicted ms | runs (ms) | median | error |")
    print("|---|---|---|---|---|---|")
    ok = 0
    for r in rows:
        r["median"] = statistics.median(r["runs"])
        r["err"] = r["pred_ms"] / r["median"] - 1
        ok += abs(r["err"]) <= a.within
        print(f"| {r['id']}: {r['plan']} | {r['mbs']} | {r['pred_ms']:.0f} | "
              f"{', '.join(f'{x:.1f}' for x in r['runs'])}{' (incl. tune)' if r.get('tune') else ''} | "
              f"{r['median']:.1f} | {r['err']:+.1%} |")
    rho = spearman([r["pred_ms"] for r in rows], [r["median"] for r in rows])
    print(f"\n{ok} of {len(rows)} plans predicted within {a.within:.0%} of their measured median; "
          f"Spearman {rho:.3f} over {len(rows)} plans")
    machines = sorted({m for r in rows for m in r["machines"]})
    print(f"grid machines: {', '.join(machines)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
