#!/usr/bin/env python3
"""How close are mocompile's `auto` plans to the perf recipes NVIDIA ships? (prints tables; not a test)

    .venv/bin/python benchmarks/plan_quality.py       # agreement, disagreements, weak scaling, calibration
    .venv/bin/python benchmarks/plan_quality.py --no-calibration --out benchmarks/results/plan_quality.txt

(`bin/mocompile --version` creates .venv with mocompile's dependencies on a fresh machine.)

For every shipped MoE perf recipe of a catalogue model (compiler/mocompile/data/anchors.yaml, variants
excluded), an intent is written as a new user would: model, GPU, node count, `goal: throughput`, the
recipe's batch shape, precision and optimizer (training.optimizer: muon for Kimi-K2's recipes), forced
balancing (the recipes benchmark with it), nothing else.
Its auto plan is compared with the shipped one on four fields: layout (TP, PP, VPP, EP), dispatcher,
EP overlap, recompute granularity. Two planners are measured:
  - as shipped: the planner scores the matching anchor and keeps it unless its model predicts a plan
    faster by more than the trust margin, widened with the square root of the number of knobs the plan
    changes (search.required_ratio);
  - model only: the anchor of the same model, GPU and precision is withheld from the search, so the
    step-time model alone has to find the shipped plan (the honest measure of the model).
Weak scaling: the same intent at 2x GPUs and 2x global batch keeps layout and dispatcher?
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from collections import defaultdict
from contextlib import redirect_stdout
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "compiler"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from anchor_intents import consistent, context_for, intent_text, shipped_rows  # noqa: E402  (first: checks the dependencies)
from mocompile.errors import InputError  # noqa: E402
from mocompile.pipeline import analyse  # noqa: E402
from mocompile.resolve import reference, search  # noqa: E402

GROUP = {"bf16": "BF16", "fp8-cs": "FP8", "fp8-ds": "FP8", "fp8-blockwise": "FP8", "mxfp8": "FP8", "nvfp4": "NVFP4"}
FIELDS = ("layout", "dispatcher", "overlap", "recompute")


def shipped(a: dict[str, Any]) -> dict[str, Any]:
    rc = a["recompute"]
    return {"layout": (a["tp"], a["pp"], a["vpp"], a["ep"]), "dispatcher": a["dispatcher"], "overlap": a["overlap"],
            "recompute": "none" if rc == "none" else "full" if rc == "full" else "selective"}


def planned(text: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "pq.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            with redirect_stdout(io.StringIO()):
                r = analyse(path)
        except InputError as exc:
            return None, None, "input error: " + "; ".join(x.message for x in exc.diagnostics)
    p = r.plan
    assert p is not None
    disp = p["moe_flex_dispatcher_backend"] if p["moe_token_dispatcher_type"] == "flex" else p["moe_token_dispatcher_type"]
    got = {"layout": (p["tensor_model_parallel_size"], p["pipeline_model_parallel_size"],
                      p["virtual_pipeline_model_parallel_size"] or 1, p["expert_model_parallel_size"]),
           "dispatcher": disp, "overlap": bool(p["overlap_moe_expert_parallel_comm"]),
           "recompute": p["recompute_granularity"] or "none"}
    errors = ", ".join(d.rule for d in r.errors)
    return got, p.planner, errors


class withheld:
    """Context manager: the search sees none of ``recipes`` (``reference.WITHHELD``)."""

    def __init__(self, recipes: set[str]):
        self.recipes = recipes

    def __enter__(self) -> None:
        reference.WITHHELD.update(self.recipes)

    def __exit__(self, *exc: Any) -> None:
        reference.WITHHELD.difference_update(self.recipes)


def withheld_for(a: dict[str, Any], mode: str) -> set[str]:
    """The recipes a mode hides from the planner for recipe ``a``'s intent."""
    every = search.anchors()
    if mode == "shipped":
        return set()
    if mode == "model":  # every recipe of this model, GPU and precision (any GPU count, variants too)
        return {b["recipe"] for b in every if (b["model"], b["gpu"], b["precision"]) == (a["model"], a["gpu"], a["precision"])}
    if mode == "family":  # every recipe of the model family (Bridge's perf_recipes module)
        return {b["recipe"] for b in every if b["module"] == a["module"]}
    return {b["recipe"] for b in every}  # "none": the model and the documented defaults alone


MODES = {"shipped": "as shipped (anchors scored)",
         "model": "model only (the recipes of this model, GPU and precision withheld; nearest recipes and defaults serve)",
         "family": "leave one family out (every recipe of the model's family withheld)",
         "none": "no recipes at all (the model and the documented defaults alone)"}


def agreement(rows: list[dict[str, Any]], mode: str) -> tuple[list[str], list[dict[str, Any]]]:
    stats: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    disagreements = []
    regrets = []
    served: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])  # (reference, kept|left): n, layout, all
    for a in rows:
        with withheld(withheld_for(a, mode)):
            got, planner, errors = planned(intent_text(a, optimizer=True))
        want = shipped(a)
        ship = None  # withheld modes: the shipped plan scored once, for the regret and the disagreement line
        if mode != "shipped" and got is not None:
            if got != want:
                with redirect_stdout(io.StringIO()):
                    ship = shipped_score(a)
            regrets.append(shipped_regret(got, want, planner, ship))
        groups = [GROUP[a["precision"]]] + ([GROUP[a["precision"]] + " (Adam)"] if a.get("optimizer") == "adam" else [])
        for g in groups:
            stats[g]["n"] += 1
        if got is None:
            disagreements.append({"recipe": a["recipe"], "why": errors})
            continue
        same = {f: got[f] == want[f] for f in FIELDS}
        decision = (planner or {}).get("decision") or {}
        tally = served[(decision.get("kind") or "none", "-" if not decision else "kept" if decision["kept"] else "left")]
        tally[0] += 1
        tally[1] += same["layout"]
        tally[2] += all(same.values())
        for g in groups:
            for f in FIELDS:
                stats[g][f] += same[f]
            stats[g]["all"] += all(same.values())
        if not all(same.values()):
            anchor = (planner or {}).get("anchor") or {}
            if ship is not None:  # the reference is no shipped recipe here: the shipped plan itself, scored
                anchor = {"step_time_s": ship[0].step, "fits": ship[0].fits, "broken": ship[1]}
            disagreements.append({"recipe": a["recipe"], "fields": [f for f in FIELDS if not same[f]],
                                  "mocompile": got, "shipped": want,
                                  "pred_mocompile_s": (planner or {}).get("chosen", {}).get("step_time_s"),
                                  "pred_shipped_s": anchor.get("step_time_s"),
                                  "shipped_state": ("breaks " + ",".join(anchor["broken"]) if anchor.get("broken")
                                                    else "does not fit" if anchor and not anchor.get("fits") else ""),
                                  "errors": errors})
    lines = [f"{'group':<13} {'n':>3} " + " ".join(f"{f:>11}" for f in FIELDS + ("all four",))]
    for g in ("BF16", "FP8", "NVFP4", "BF16 (Adam)", "FP8 (Adam)", "NVFP4 (Adam)"):
        s = stats.get(g)
        if not s:
            continue
        n = s["n"]
        lines.append(f"{g:<13} {n:>3} " + " ".join(f"{s[f]:>4}/{n:<3}{s[f] / n:>4.0%}" for f in FIELDS + ("all",)))
    lines.append("(Adam) = the Adam recipes only; Kimi-K2's recipes train with Muon: their intents say "
                 "training.optimizer: muon, which the Muon anchors serve (Adam anchors serve Adam intents)")
    lines.append("what each plan rests on (the decision's reference, kept or left for a predicted gain beyond its band):")
    for (kind, how), (n, lay, four) in sorted(served.items(), key=lambda kv: (-kv[1][0], kv[0])):
        lines.append(f"  {kind:<9} {how:<5} {n:>4} plans   layout agrees {lay:>3} ({lay / n:4.0%})   all four {four:>3} "
                     f"({four / n:4.0%})")
    kept = sorted(r for r in regrets if r is not None)
    if kept:
        lines.append(f"predicted regret of the shipped plan under the model (its predicted step over the chosen "
                     f"plan's, {len(kept)} recipes): median {kept[len(kept) // 2]:+.1%}, worst {kept[-1]:+.1%}")
    return lines, disagreements


def shipped_score(a: dict[str, Any]) -> tuple[Any, list[str]]:
    """The shipped plan scored by the planner's own Scorer on the recipe's intent, and the rules it breaks."""
    ctx = context_for(intent_text(a, optimizer=True))
    sc = search.Scorer(ctx)
    ship = sc.score(search.anchor_candidate(ctx, a, pins=False))
    return ship, sc.check(ship)


def shipped_regret(got: dict[str, Any], want: dict[str, Any], planner: dict[str, Any] | None,
                   ship: tuple[Any, list[str]] | None) -> float | None:
    """How much slower the model predicts the shipped plan (``ship``, from ``shipped_score``) than the plan it
    chose (0 where all four agree), both scored by the same Scorer on the recipe's intent."""
    if got == want:
        return 0.0
    chosen = (planner or {}).get("chosen", {}).get("step_time_s")
    return None if not chosen or ship is None else ship[0].step / chosen - 1


def weak_scaling(rows: list[dict[str, Any]], mode: str = "shipped") -> list[str]:
    kept, total, changed = 0, 0, []
    for a in rows:
        with withheld(withheld_for(a, mode)):
            g1, _, _ = planned(intent_text(a, optimizer=True))
            g2, _, _ = planned(intent_text(a, 2, optimizer=True))
        if g1 is None or g2 is None:
            continue
        total += 1
        same = g1["layout"] == g2["layout"] and g1["dispatcher"] == g2["dispatcher"]
        kept += same
        if not same:
            changed.append(f"  {a['recipe']}: {g1['layout']} {g1['dispatcher']} -> {g2['layout']} {g2['dispatcher']}")
    return [f"weak scaling (2x GPUs, 2x GBS) keeps layout and dispatcher: {kept}/{total} ({kept / max(1, total):.0%})"] \
        + changed


def fmt_dis(d: dict[str, Any]) -> str:
    if "fields" not in d:
        return f"  {d['recipe']}: {d['why']}"
    m, s = d["mocompile"], d["shipped"]
    pm, ps = d["pred_mocompile_s"], d["pred_shipped_s"]
    verdict = ""
    if pm is not None and ps is not None:
        verdict = f"predicted {pm:.2f} s vs shipped {ps:.2f} s ({pm / ps - 1:+.1%})"
    if d["shipped_state"]:
        verdict += f"; shipped plan {d['shipped_state']} here"
    return (f"  {d['recipe']} [{', '.join(d['fields'])}]\n"
            f"      mocompile TP/PP/VPP/EP {m['layout']} {m['dispatcher']} overlap={m['overlap']} rc={m['recompute']}\n"
            f"      shipped   TP/PP/VPP/EP {s['layout']} {s['dispatcher']} overlap={s['overlap']} rc={s['recompute']}\n"
            f"      {verdict}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--no-calibration", action="store_true")
    args = ap.parse_args()
    every = shipped_rows()
    rows = [a for a in every if consistent(a)]
    out: list[str] = [f"mocompile plan quality: {len(rows)} shipped MoE perf recipes of catalogue models "
                      "(Megatron-Bridge 067f987d, variants excluded)"]
    out += [f"  left out, layout cannot run on the recipe's own GPU count: {a['recipe']} "
            f"(TP{a['tp']} PP{a['pp']} EP{a['ep']} on {a['gpus']} GPUs)" for a in every if not consistent(a)] + [""]
    for mode, label in MODES.items():
        lines, dis = agreement(rows, mode)
        out += [f"== agreement, {label}"] + lines + [""]
        slower = [d for d in dis if d.get("pred_mocompile_s") and d.get("pred_shipped_s")
                  and d["pred_mocompile_s"] > d["pred_shipped_s"] and not d["shipped_state"]]
        out.append(f"disagreements: {len(dis)}; where mocompile's plan is predicted slower than the shipped one "
                   f"(and the shipped one is legal and fits): {len(slower)}")
        out += [fmt_dis(d) for d in dis] + [""]
    out += ["== weak scaling"] + weak_scaling(rows) + [""]
    out += ["== weak scaling, model only"] + weak_scaling(rows, "model") + [""]
    if not args.no_calibration:
        import calibrate
        c = calibrate.steptime.constants()
        names = [n for n, v in calibrate.load_yaml(calibrate.steptime.DATA)["constants"].items() if v.get("fitted")]
        # the ranking term calibrate.py's own run fits with, so that the leave-one-out refits here are the same
        calibrate.HOODS.extend(calibrate.anchor_neighbourhoods())
        calibrate.MUON_HOODS.extend(calibrate.anchor_neighbourhoods("muon"))
        out += ["== calibration (committed constants)", calibrate.report(calibrate.load_rows(), c, names)]
    text = "\n".join(out)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
