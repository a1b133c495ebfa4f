"""A slots grid (issue22_slots.py, slots_report.py's grid.json) against the step-time model with a cluster profile.

Every plan the grid ran is compiled again here, from the recipe its lock names and the pins its lock records, with
the given cluster profile, and its predicted step is set against the median of its run medians. Prints a Markdown
table, the share within ``--within`` and Spearman's rank correlation (grid_report.spearman, as issue20_report.py).

A profile written before DeepEP could be installed lists ``deep_ep``/``hybrid_ep`` as missing, and CLU001 then
refuses the flex plans; ``--present deep_ep,hybrid_ep`` compiles against a temporary copy without them (say so
where the figures are used: the grid's own flex runs are the evidence that the modules were there).

    .venv/bin/python benchmarks/gpu/issue22_predict.py benchmarks/results/issue22-grid6-ep2-2026-11-28/time \
        --profile clusters/lent-h200x2.yaml --present deep_ep,hybrid_ep
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from issue20_report import predicted_s, spearman  # noqa: E402  (one compile path and one rank statistic)
from mocompile import steptime  # noqa: E402  (issue20_report put compiler/ on the path)


def profile_copy(profile: Path, present: set[str], into: Path) -> Path:
    """The profile with the ``present`` modules struck from its ``missing:`` line (a one-line flow list, as
    ``mocompile probe`` writes it)."""
    text = profile.read_text()

    def keep(match: re.Match[str]) -> str:
        names = [n.strip().strip("\"'") for n in match.group(2).split(",") if n.strip()]
        return match.group(1) + "[" + ", ".join(f'"{n}"' for n in names if n not in present) + "]"

    out = into / profile.name
    out.write_text(re.sub(r"^(\s*missing:\s*)\[([^\]]*)\]", keep, text, count=1, flags=re.M))
    return out


def predictions(grid: dict[str, Any], root: Path, prefix: str, prof: Path, into: Path) -> list[dict[str, Any]]:
    """Each plan of the grid compiled again (its lock's recipe and pins) with the profile ``prof``."""
    rows = []
    for plan, q in grid["plans"].items():
        lock = json.loads((root / f"lock-{prefix}{plan}.json").read_text())
        recipe = into / f"{plan}.yaml"
        shutil.copyfile(ROOT / lock["_generated"]["source"], recipe)
        pins = lock["estimate"]["chosen"]["pins"]
        sets = [f"hardware.cluster={prof.name}", "profile=null", *(f"{k}={json.dumps(v)}" for k, v in pins.items())]
        pred, shape, mbs = predicted_s(str(recipe), sets)
        runs = [r["median_ms"] for r in q["runs"] if r.get("median_ms")]
        rows.append({"plan": plan, "shape": shape, "mbs": mbs, "pred_ms": pred * 1000, "runs": runs, "pins": pins,
                     "recipe": recipe})
    return rows


def table(rows: list[dict[str, Any]], within: float, said: str) -> None:
    print("| plan | settings | predicted ms | run medians (ms) | median | error |")
    print("|---|---|---|---|---|---|")
    ok = 0
    for r in rows:
        r["median"] = statistics.median(r["runs"])
        r["err"] = r["pred_ms"] / r["median"] - 1
        ok += abs(r["err"]) <= within
        print(f"| {r['plan']} | {r['shape']}, MBS {r['mbs']} | {r['pred_ms']:.0f} | "
              f"{', '.join(f'{x:.0f}' for x in r['runs'])} | {r['median']:.0f} | {r['err']:+.1%} |")
    rho = spearman([r["pred_ms"] for r in rows], [r["median"] for r in rows])
    print(f"\n{ok} of {len(rows)} plans predicted within {within:.0%} of their measured median; "
          + (f"Spearman {rho:.3f}" if rho is not None else "no Spearman (fewer than 2 plans)")
          + f" over {len(rows)} plans ({said})")


def fit_overlap(rows: list[dict[str, Any]], prof: Path, into: Path) -> dict[str, Any]:
    """What `mocompile tune` would do with these runs: record them in the profile copy (run medians and pins, as
    ``tune.record`` does), fit ``overlap_host_factor`` from the on/off pairs measured apart, write it there."""
    from mocompile import overlap_fit
    from ruamel.yaml import YAML

    yaml = YAML()
    data = yaml.load(prof.read_text())
    data["measured"] = [{"recipe": "grid", "plan": r["shape"], "median_ms": round(statistics.median(r["runs"]), 1),
                         "runs": len(r["runs"]), "run_ms": [round(x, 1) for x in r["runs"]], "pins": r["pins"]}
                        for r in rows]
    with prof.open("w") as fh:
        yaml.dump(data, fh)
    got = overlap_fit.fit(str(prof), str(rows[0]["recipe"]), "grid", [f"hardware.cluster={prof.name}", "profile=null"],
                          str(into / "work"))
    if got["value"] is not None:
        overlap_fit.write(str(prof), got)
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("grid", type=Path, help="a folder with slots_report.py's grid.json and the runs' lock-<prefix><plan>.json")
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--present", default="", help="comma-separated modules the profile lists missing that the grid used")
    ap.add_argument("--prefix", default="i22-")
    ap.add_argument("--within", type=float, default=0.15)
    ap.add_argument("--fit-overlap", action="store_true",
                    help="then fit the profile's overlap_host_factor from the grid's overlap on/off pairs, as "
                         "`mocompile tune` does (mocompile.overlap_fit), and predict again with it")
    a = ap.parse_args()
    grid = json.loads((a.grid / "grid.json").read_text())
    present = {x for x in a.present.split(",") if x}
    said = f"profile {a.profile}" + (f", with {', '.join(sorted(present))} taken as present" if present else "")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        prof = profile_copy(ROOT / a.profile if not a.profile.is_absolute() else a.profile, present, t)
        rows = predictions(grid, a.grid, a.prefix, prof, t)
        table(rows, a.within, said)
        if a.fit_overlap:
            got = fit_overlap(rows, prof, t)
            print()
            for pair in got["pairs"]:
                print(f"- {pair['on']} over {pair['off']}: measured x{pair['measured_ratio']:.3f} "
                      f"(off {pair['off_ms'][0]:.0f}-{pair['off_ms'][1]:.0f} ms, on {pair['on_ms'][0]:.0f}-"
                      f"{pair['on_ms'][1]:.0f} ms): " + (f"factor {pair['factor']}" if pair["factor"] is not None
                                                          else pair["why"]))
            if got["value"] is None:
                print(f"\noverlap_host_factor not fitted: {got['why']}")
                return 0
            print(f"\noverlap_host_factor fitted: {got['value']} (calibrated constant "
                  f"{steptime.constants()['overlap_host_factor']}); predicted again with it:\n")
            table(predictions(grid, a.grid, a.prefix, prof, t), a.within, said + f", overlap_host_factor {got['value']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
