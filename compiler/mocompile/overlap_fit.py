"""A cluster's ``overlap_host_factor``, fitted from an EP-overlap on/off pair ``mocompile tune`` measured there.

Why: the step-time model's ``overlap_host_factor`` (the host time of Megatron-Core's overlapped schedule,
``pipeline_parallel/combined_1f1b.py``, relative to the plain one) is one calibrated number for every host, but
measured on the project's lent hosts EP overlap cost +14 % of a step on one and +21-25 % on another. Two plans of
one race that differ only in ``moe.overlap`` say what the overlapped schedule costs on these nodes: the factor at
which the model predicts their measured ratio is written into the profile, where the planner reads it instead of
the constant (``cluster.apply``). It is fitted only where the two plans' ranges of run medians lie apart: inside the
runs' own spread the measurement cannot tell the overlap's cost from noise, and the calibrated constant stays.
"""

from __future__ import annotations

import io
import json
import os
import statistics
from collections.abc import Callable
from typing import Any

from mocompile import measure
from mocompile.cluster import OVERLAP_HOST_FACTOR
from mocompile.errors import InputError, UsageError
from mocompile.textsafe import visible

TRIAL = "trial-overlap-cluster.yaml"
PROFILE_KEYS = ("schema", "name", "host_factor", "kernels", "probe", "host_memory_gib")  # what a prediction reads


def run_ms(entry: dict[str, Any]) -> list[float]:
    """The run medians ``mocompile tune`` recorded for a plan (``run_ms``; older entries have none)."""
    runs = entry.get("run_ms")
    if not isinstance(runs, list):
        return []
    return [float(x) for x in runs if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0]


def pairs(entries: list[Any], recipe: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(off, on): entries of ``recipe`` whose pins differ only in ``moe.overlap``, each with at least two run
    medians; the latest entry of a plan wins (a profile collects every race)."""
    def key(e: dict[str, Any]) -> str:
        pins = {k: v for k, v in e["pins"].items() if k != "moe.overlap"}
        return json.dumps(pins, sort_keys=True, default=str)

    usable = [e for e in entries if isinstance(e, dict) and e.get("recipe") == recipe and isinstance(e.get("pins"), dict)
              and isinstance(e["pins"].get("moe.overlap"), bool) and len(run_ms(e)) >= 2]
    off = {key(e): e for e in usable if e["pins"]["moe.overlap"] is False}
    on = {key(e): e for e in usable if e["pins"]["moe.overlap"] is True}
    return [(off[k], on[k]) for k in on if k in off]


def apart(a: list[float], b: list[float]) -> bool:
    """Whether two plans' ranges of run medians do not overlap (the rule tune's report and the GPU grids rank by)."""
    return max(a) < min(b) or max(b) < min(a)


def solve(ratio: float, predict_ratio: Callable[[float], float]) -> tuple[float, str]:
    """The factor at which ``predict_ratio`` (on/off, rising with the factor) equals the measured ``ratio``, and a
    note when the ratio lies beyond what an allowed factor predicts (the bound is returned then)."""
    factor, bound = measure.solve_rising(ratio, predict_ratio, OVERLAP_HOST_FACTOR, steps=30)
    if bound:
        return factor, (f"the measured ratio x{ratio:.3f} is at or {'below' if bound == 'lowest' else 'above'} "
                        f"the model's at the {bound} factor {factor:g}")
    return factor, ""


def _load(path: str) -> dict[str, Any]:
    from ruamel.yaml import YAML

    with open(path, encoding="utf-8") as fh:
        data = YAML(typ="safe", pure=True).load(fh)
    return data if isinstance(data, dict) else {}


def step_predictor(recipe: str, sets: list[str], profile: dict[str, Any], work: str) -> Callable[[dict[str, Any], float], float]:
    """Predicted step (s) of ``recipe`` with a plan's pins, on a copy of the profile with a trial factor."""
    from mocompile.pipeline import analyse
    from mocompile.tune import pin_sets

    os.makedirs(work, exist_ok=True)
    trial = os.path.join(work, TRIAL)
    base = {k: profile[k] for k in PROFILE_KEYS if k in profile}
    where = "hardware.cluster=" + os.path.relpath(trial, os.path.dirname(os.path.abspath(recipe)))

    def predict(pins: dict[str, Any], factor: float) -> float:
        # default=str: a hand-written profile may hold YAML dates (probe: {date: 2026-11-27}), which JSON has not
        measure.write_text_atomic(trial, json.dumps({**base, "overlap_host_factor": factor}, default=str) + "\n")
        try:
            res = analyse(recipe, list(sets) + pin_sets(pins) + [where])
        except InputError as exc:  # e.g. a pin value of the wrong type, from a hand-edited profile
            raise UsageError(f"{recipe} does not compile with the measured pins: "
                             + "; ".join(f"{d.rule}: {d.message}" for d in exc.diagnostics)) from None
        if res.errors or res.plan is None:
            raise UsageError(f"{recipe} does not compile with the measured pins: "
                             + "; ".join(f"{d.rule}: {d.message}" for d in res.errors))
        return measure.timed_step_s(res.plan.planner["chosen"])

    return predict


def fit(profile_file: str, recipe: str, recipe_name: str, sets: list[str], work: str) -> dict[str, Any]:
    """Fit the factor from every measured on/off pair of ``recipe_name`` in the profile. Returns ``value`` (the
    median of the pairs' factors; None: nothing to fit, ``why`` says so) and, per pair, the measured ratio and its
    factor or why it has none."""
    profile = _load(profile_file)
    found = pairs(profile.get("measured") or [], recipe_name)
    if not found:
        return {"value": None, "pairs": [],
                "why": "no plan was measured with EP overlap both on and off (same other knobs, 2+ runs each)"}
    predict = step_predictor(recipe, sets, profile, work)
    rows = []
    for off, on in found:
        a, b = run_ms(off), run_ms(on)
        ratio = statistics.median(b) / statistics.median(a)
        row: dict[str, Any] = {"off": off.get("plan"), "on": on.get("plan"), "measured_ratio": round(ratio, 3),
                               "off_ms": [min(a), max(a)], "on_ms": [min(b), max(b)], "factor": None}
        if not apart(a, b):
            row["why"] = "the ranges of run medians overlap: the overlap's cost is inside the runs' noise"
            rows.append(row)
            continue
        try:
            t_off = predict(off["pins"], OVERLAP_HOST_FACTOR[0])  # overlap off does not read the factor

            def ratio_at(f: float, pins: dict[str, Any] = on["pins"], t_off: float = t_off) -> float:
                return predict(pins, f) / t_off

            row["factor"], row["note"] = solve(ratio, ratio_at)
        except UsageError as exc:  # a hand-edited entry whose pins no longer compile: that pair only
            row["why"] = str(exc)
        rows.append(row)
    fitted = [r["factor"] for r in rows if r["factor"] is not None]
    if not fitted:
        return {"value": None, "pairs": rows, "why": "no on/off pair was both measured apart and compiling with its pins"}
    return {"value": round(statistics.median(fitted), 3), "pairs": rows, "why": ""}


def write(profile_file: str, result: dict[str, Any]) -> None:
    """Set ``overlap_host_factor`` in the profile (a round-trip edit: comments kept; written atomically), with a
    comment naming the pair(s) it came from."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    with open(profile_file, encoding="utf-8") as fh:
        data = yaml.load(fh)
    data["overlap_host_factor"] = result["value"]
    used = [r for r in result["pairs"] if r["factor"] is not None]
    # the plan names come back from the profile (anyone's commit): one escaped line, nothing that ends the comment
    data.yaml_add_eol_comment("fitted by mocompile tune: " + "; ".join(
        f"overlap on/off measured x{r['measured_ratio']:.3f} ({visible(r['on'])[:120]})" for r in used),
        "overlap_host_factor")
    buf = io.StringIO()
    yaml.dump(data, buf)
    measure.write_text_atomic(profile_file, buf.getvalue())
