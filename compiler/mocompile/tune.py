"""`mocompile tune RECIPE`: measure the plans the step-time model cannot tell apart, keep the fastest.

The planner ranks plans by predicted step time, and its own measured error says how far apart two
predictions must be before the ranking means anything (the trust margin, written by
``benchmarks/calibrate.py``). ``tune`` takes every scored plan predicted within that band of the
fastest (at most ``--max-plans``), compiles each with its knobs pinned, runs each through its
generated torchrun launcher for a few dozen iterations (MOCOMPILE_METRICS), and drops the slow ones
early by successive halving: every plan runs once, the faster half runs again, and so on until two
are left with ``--repeats`` runs each. The fastest median wins.

The state (plans, every run's median) is saved after each run: interrupted, ``tune`` resumes where it
stopped (a changed recipe, profile or option starts afresh). The measurements go into the cluster
profile the recipe names (``measured:``), and the recipe is edited only with ``--write``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import statistics
from typing import Any

from mocompile import measure, overlap_fit
from mocompile.errors import UsageError
from mocompile.rules.checks import package_missing

ITERATIONS = 20
MAX_PLANS = 4
REPEATS = 3


# ---------------------------------------------------------------- the schedule (pure: tested on its own)
def score(runs: list[float | None]) -> float | None:
    """A plan's measured step: the median of its runs' medians; None once any run failed."""
    done = [r for r in runs if r is not None]
    if not runs or len(done) != len(runs):
        return None
    return statistics.median(done)


def survivors(order: list[str], runs: dict[str, list[float | None]], rung: int) -> list[str]:
    """Who is still in the race at ``rung``: rung 0 is everyone; each later rung keeps the faster half
    (rounded up) of the previous rung's plans, by their measured step after that rung. A plan whose run
    failed (out of memory, a dispatcher that does not import there) is out at once."""
    alive = list(order)
    for r in range(rung):
        done = [p for p in alive if len(runs.get(p, [])) > r and score(runs[p][: r + 1]) is not None]
        done.sort(key=lambda p: (score(runs[p][: r + 1]), order.index(p)))
        alive = done[: max(2, math.ceil(len(alive) / 2))]  # never fewer than two: the last pair is measured out
    return alive


def next_run(order: list[str], runs: dict[str, list[float | None]], repeats: int = REPEATS) -> str | None:
    """The plan to run next, or None when tuning is done: the plans of the current rung each need
    ``rung + 1`` runs; the race ends when at most two plans are left that have not failed and each
    has ``repeats`` runs (or every plan failed)."""
    rung = 0
    while True:
        alive = survivors(order, runs, rung)
        short = [p for p in alive if len(runs.get(p, [])) < rung + 1]
        if short:
            return short[0]
        ok = [p for p in alive if score(runs[p]) is not None]
        if not ok or (len(ok) <= 2 and all(len(runs[p]) >= repeats for p in ok)):
            return None
        rung += 1


def winner(order: list[str], runs: dict[str, list[float | None]]) -> str | None:
    """The measured fastest among the plans with the most runs (the finalists)."""
    measured = [p for p in order if score(runs.get(p, [])) is not None]
    if not measured:
        return None
    most = max(len(runs[p]) for p in measured)
    finalists = [p for p in measured if len(runs[p]) == most]
    return min(finalists, key=lambda p: (score(runs[p]), order.index(p)))


# ---------------------------------------------------------------- the candidates
def candidates(recipe: str, sets: list[str], band: float | None, max_plans: int) -> tuple[list[dict[str, Any]], float]:
    """The plans within ``band`` (default: the model's trust margin) of the fastest predicted, the chosen
    plan first, at most ``max_plans``; and the band used. A plan whose dispatcher the cluster profile's
    probe found missing there (deep_ep, HybridEP) is not worth a run."""
    from mocompile.pipeline import analyse

    res = analyse(recipe, sets)
    if res.errors or res.plan is None or not res.plan.planner:
        problems = "; ".join(f"{d.rule}: {d.message}" for d in res.errors) or "no plan"
        raise UsageError(f"{recipe} does not compile: {problems}")
    p = res.plan.planner
    missing = res.plan["cluster_missing"]
    if band is None:
        margin = p.get("trust_margin")
        band = float(margin) if margin is not None else 0.16
    pool = [p["chosen"]] + [x for x in (p.get("reference"), p.get("best")) if x] + list(p.get("runners_up") or [])
    pool += list(p.get("micro_batch") or [])  # micro_batch_size auto: the best plan at each other size
    fastest = min(x["step_time_s"] for x in pool)
    # every plan of the intent pays the same scheduled collection, which the measured steps leave out
    gc_pause = p["chosen"]["step_time_s"] - measure.timed_step_s(p["chosen"])
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for x in pool:
        if "pins" not in x or x["step_time_s"] > fastest * (1 + band):
            continue
        mbs = x["pins"].get("training.micro_batch_size")
        label = x["plan"] + (f", MBS {mbs}" if mbs is not None else "")
        if label in seen:
            continue
        if package_missing(x["pins"].get("moe.dispatcher"), missing):  # does not import there: a run would fail
            continue
        seen.add(label)
        out.append({"plan": label, "pins": x["pins"], "predicted_s": round(x["step_time_s"] - gc_pause, 3),
                    "chosen": not out})
    head, rest = out[:1], sorted(out[1:], key=lambda x: x["predicted_s"])
    return (head + rest)[:max_plans], band


def overlap_pair(recipe: str, sets: list[str]) -> list[dict[str, Any]]:
    """The model's plan and its twin with ``moe.overlap`` flipped (``tune --overlap``): an A/B of EP overlap on this
    cluster, whatever the band, so that both plans reach ``--repeats`` runs and the pair can be fitted
    (mocompile.overlap_fit). A twin the rules refuse (EP 1, a schedule overlap cannot run in) is said, not raced."""
    from mocompile.pipeline import analyse

    res = analyse(recipe, sets)
    if res.errors or res.plan is None or not res.plan.planner:
        problems = "; ".join(f"{d.rule}: {d.message}" for d in res.errors) or "no plan"
        raise UsageError(f"{recipe} does not compile: {problems}")
    chosen = res.plan.planner["chosen"]
    twin_pins = {**chosen["pins"], "moe.overlap": not chosen["pins"].get("moe.overlap", False)}
    twin = analyse(recipe, sets + pin_sets(twin_pins))
    if twin.errors or twin.plan is None:
        raise UsageError(f"the model's plan ({chosen['plan']}) cannot run with EP overlap "
                         f"{'on' if twin_pins['moe.overlap'] else 'off'}: "
                         + "; ".join(f"{d.rule}: {d.message}" for d in twin.errors))
    other = twin.plan.planner["chosen"]
    return [{"plan": chosen["plan"], "pins": chosen["pins"], "predicted_s": measure.timed_step_s(chosen), "chosen": True},
            {"plan": other["plan"], "pins": twin_pins, "predicted_s": measure.timed_step_s(other), "chosen": False}]


def _set_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, list):
        return "[" + ", ".join(str(i) for i in v) + "]"
    return str(v)


def pin_sets(pins: dict[str, Any]) -> list[str]:
    """``--set`` expressions that pin a plan's knobs (values checked by the schema like any --set)."""
    return [f"{k}={_set_value(v)}" for k, v in pins.items()]


# ---------------------------------------------------------------- running
def _fingerprint(recipe: str, sets: list[str], options: dict[str, Any]) -> str:
    """What a saved state is valid for: the recipe's text, the options, and what the cluster profile tells the
    planner (host factor, overlap factor, missing packages). Not the profile's ``measured:`` list, which tune itself extends."""
    from mocompile.errors import InputError
    from mocompile.pipeline import analyse

    h = hashlib.sha256()
    with open(recipe, "rb") as fh:
        h.update(fh.read())
    try:
        res = analyse(recipe, sets)
        cluster = dict((res.plan.hardware.get("cluster") if res.plan else None) or {})
    except InputError:
        cluster = {}  # candidates() reports the recipe's problem
    cluster.pop("measured", None)
    cluster.pop("sha256", None)
    h.update(json.dumps([sets, options, cluster], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def tune(recipe: str, sets: list[str] | None = None, band: float | None = None, max_plans: int = MAX_PLANS,
         iterations: int = ITERATIONS, repeats: int = REPEATS, work: str | None = None,
         launcher: measure.Launcher = measure.run_launcher, quiet: bool = False,
         timeout: float = 900.0, needs_target: str = "torchrun", overlap_ab: bool = False) -> dict[str, Any]:
    """Measure the close plans of ``recipe``; returns the report (state kept in ``work`` for resuming)."""
    from mocompile.emit.writer import write_outputs
    from mocompile.pipeline import compile_recipe
    from mocompile.project import find_root

    sets = list(sets or [])
    if max_plans < 1 or repeats < 1 or iterations <= measure.WARMUP_STEPS + 2:
        raise UsageError(f"--max-plans and --repeats must be >= 1 and --iterations > {measure.WARMUP_STEPS + 2}")
    if not os.path.isfile(recipe):
        raise UsageError(f"no such recipe: {recipe}")
    root = find_root(os.path.dirname(os.path.abspath(recipe))) or os.getcwd()
    base = os.path.splitext(os.path.basename(recipe))[0]
    work = os.path.abspath(work or os.path.join(root, ".mocompile", "tune", base))
    if os.path.commonpath([root, work]) != root:
        raise UsageError(f"--work {work} lies outside the project {root}")
    os.makedirs(os.path.join(work, "runs"), exist_ok=True)
    state_path = os.path.join(work, "state.json")
    fp = _fingerprint(recipe, sets, {"band": band, "max_plans": max_plans, "iterations": iterations,
                                     "repeats": repeats, "overlap": overlap_ab})
    state: dict[str, Any] | None = None
    if os.path.isfile(state_path):
        try:
            with open(state_path, encoding="utf-8") as fh:
                state = json.load(fh)
        except ValueError:
            state = None
        if not isinstance(state, dict) or state.get("fingerprint") != fp:
            state = None  # another recipe, profile or option: start afresh
    resumed = state is not None
    if state is None:
        if overlap_ab:
            plans, used_band = overlap_pair(recipe, sets), band
        else:
            plans, used_band = candidates(recipe, sets, band, max_plans)
        state = {"fingerprint": fp, "recipe": recipe, "work": work, "band": used_band, "overlap": overlap_ab,
                 "iterations": iterations,
                 "candidates": {f"c{i + 1}": c for i, c in enumerate(plans)}, "runs": {}}
        measure.write_json_atomic(state_path, state)
    order = list(state["candidates"])
    runs: dict[str, list[float | None]] = state["runs"]
    gen = os.path.join(work, "generated")
    bar = measure.Progress(_planned_runs(len(order), repeats), "tune", quiet)
    bar.done = sum(len(v) for v in runs.values())
    while (cid := next_run(order, runs, repeats)) is not None:
        cand = state["candidates"][cid]
        name = f"{_safe(base)}-tune-{cid}"
        extra = pin_sets(cand["pins"]) + [f"name={name}", f"training.train_iters={iterations}"]
        res = compile_recipe(recipe, sets + extra, ["profile"], os.path.relpath(gen, root))
        n = len(runs.get(cid, [])) + 1
        if res.errors or not res.files or res.plan is None:
            runs.setdefault(cid, []).append(None)
            cand.setdefault("errors", []).append("; ".join(f"{d.rule}: {d.message}" for d in res.errors))
        else:
            if needs_target not in res.plan.intent["launch"]["targets"]:
                raise UsageError(f"{recipe}: launch.targets has no {needs_target}, which --launcher {needs_target} runs "
                                 f"(add it: launch: {{targets: [torchrun, {needs_target}]}})")
            problem = write_outputs(gen, name, res.files, force=True)
            if problem:
                raise UsageError(problem)
            bar.step(f"{cid} run {n}: {cand['plan']}")
            out = measure.measure(os.path.join(gen, name), os.path.join(work, "runs"), f"{cid}-{n}",
                                  timeout=timeout, launcher=launcher)
            runs.setdefault(cid, []).append(round(out.median_ms, 2) if out.median_ms else None)
            if out.median_ms is None:
                cand.setdefault("errors", []).append(f"run {n} exited {out.rc} without step times: {out.log}")
        measure.write_json_atomic(state_path, state)
        bar.advance(f"{cid} run {n}: " + (f"{runs[cid][-1]:.0f} ms" if runs[cid][-1] else "failed"))
    bar.close()
    return report(state, resumed)


def _planned_runs(n: int, repeats: int) -> int:
    """How many runs the race takes when no run fails (the progress bar's length)."""
    order = [f"c{i}" for i in range(n)]
    runs: dict[str, list[float | None]] = {}
    while (p := next_run(order, runs, repeats)) is not None:
        runs.setdefault(p, []).append(1.0)
    return sum(len(v) for v in runs.values())


def _safe(s: str) -> str:
    out = "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "-" for c in s)[:40]
    return out or "recipe"


def report(state: dict[str, Any], resumed: bool = False) -> dict[str, Any]:
    order = list(state["candidates"])
    runs = state["runs"]
    best = winner(order, runs)
    chosen = next((c for c in order if state["candidates"][c].get("chosen")), order[0] if order else None)
    rows = []
    for cid in order:
        c = state["candidates"][cid]
        r = runs.get(cid, [])
        ok = [x for x in r if x is not None]
        rows.append({"id": cid, "plan": c["plan"], "predicted_ms": round(c["predicted_s"] * 1000, 1),
                     "runs": r, "measured_ms": score(r), "spread": round(measure.spread(ok), 3),
                     "chosen_by_model": bool(c.get("chosen")), "winner": cid == best, "errors": c.get("errors", [])})
    gain = None
    if best and chosen and score(runs.get(chosen, [])) and best != chosen:
        gain = round(1 - score(runs[best]) / score(runs[chosen]), 4)  # type: ignore[operator]
    return {"recipe": state["recipe"], "band": state["band"], "overlap": bool(state.get("overlap")),
            "work": state.get("work"),
            "winner_pins": state["candidates"][best]["pins"] if best else None, "iterations": state["iterations"],
            "resumed": resumed,
            "plans": rows, "winner": best, "winner_plan": state["candidates"][best]["plan"] if best else None,
            "set_line": " ".join(f"--set {shlex.quote(s)}" for s in pin_sets(state["candidates"][best]["pins"]))
            if best else None,
            "gain_over_model_choice": gain}


# ---------------------------------------------------------------- writing results
def record(report_: dict[str, Any], state: dict[str, Any], profile: str, recipe_name: str) -> int:
    """Append the measurements to the cluster profile's ``measured:`` list (a round-trip edit: comments
    kept; written atomically). Returns how many entries were added."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a line the user wrote
    # the lines already there come back as they were and only the new entries are added: lists indented the way
    # this file indents them (``probe.profile_yaml``'s layout, four in and the dash two in, when it has none yet),
    # ``null`` spelled out where the file spells it (as the probe writes it)
    from ruamel.yaml.util import load_yaml_guess_indent

    with open(profile, encoding="utf-8") as fh:
        text = fh.read()
    _, seq_indent, dash_offset = load_yaml_guess_indent(text)
    yaml.indent(mapping=2, sequence=seq_indent or 4, offset=2 if dash_offset is None else dash_offset)
    if re.search(r":[ \t]+null[ \t]*(#.*)?$", text, re.MULTILINE):
        from ruamel.yaml.representer import RoundTripRepresenter

        class SpelledNull(RoundTripRepresenter):  # add_representer is per class: a subclass keeps it to this dump
            pass

        SpelledNull.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
        yaml.Representer = SpelledNull
    data = yaml.load(text)
    measured = data.get("measured")
    if measured is None:
        measured = data["measured"] = []
    added = 0
    for row in report_["plans"]:
        if row["measured_ms"] is None:
            continue
        measured.append({"recipe": recipe_name, "plan": row["plan"], "median_ms": round(row["measured_ms"], 1),
                         "runs": len(row["runs"]), "run_ms": [round(x, 1) for x in row["runs"] if x is not None],
                         "spread": row["spread"], "iterations": state["iterations"],
                         "predicted_ms": row["predicted_ms"], "pins": dict(state["candidates"][row["id"]]["pins"])})
        added += 1
    import io

    buf = io.StringIO()
    yaml.dump(data, buf)
    measure.write_text_atomic(profile, buf.getvalue())
    return added


def write_recipe(recipe: str, pins: dict[str, Any]) -> None:
    """Pin the winner's knobs in the recipe itself (``--write``): a round-trip edit keeping comments,
    written atomically (the old file is replaced whole or not at all)."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a line the user wrote
    with open(recipe, encoding="utf-8") as fh:
        data = yaml.load(fh)
    for dotted, value in pins.items():
        node = data
        *path, last = dotted.split(".")
        for key in path:
            if node.get(key) is None:
                node[key] = {}
            node = node[key]
        node[last] = value
    buf = io.StringIO()
    yaml.dump(data, buf)
    measure.write_text_atomic(recipe, buf.getvalue())


def finish(rep: dict[str, Any], recipe: str, sets: list[str], write: bool) -> None:
    """Record the measurements in the recipe's cluster profile (if it names one) and, with ``write``,
    pin the measured fastest plan in the recipe. Adds what was done to ``rep``."""
    from mocompile.pipeline import analyse

    rep["profile"], rep["profile_entries_added"], rep["wrote_recipe"], rep["overlap_fit"] = None, 0, None, None
    res = analyse(recipe, sets)
    profile = getattr(res.doc, "cluster", None) if res.doc is not None else None
    if profile and res.plan is not None:
        with open(os.path.join(rep["work"], "state.json"), encoding="utf-8") as fh:
            state = json.load(fh)
        rep["profile"] = profile["file"]
        rep["profile_entries_added"] = record(rep, state, profile["file"], res.plan.name)
        # an overlap on/off pair measured apart sets this cluster's overlap_host_factor (mocompile.overlap_fit)
        rep["overlap_fit"] = overlap_fit.fit(profile["file"], recipe, res.plan.name, sets, rep["work"])
        if rep["overlap_fit"]["value"] is not None:
            overlap_fit.write(profile["file"], rep["overlap_fit"])
    if write and rep["winner_pins"]:
        write_recipe(recipe, rep["winner_pins"])
        rep["wrote_recipe"] = recipe


def text(rep: dict[str, Any]) -> str:
    from mocompile.textsafe import visible

    what = ("the model's plan against itself with EP overlap flipped" if rep.get("overlap") or rep["band"] is None
            else f"plans predicted within {rep['band']:.0%} of the fastest")
    lines = [f"tuned {visible(rep['recipe'])}: {what}, {rep['iterations']} iterations a run"
             + (" (resumed)" if rep["resumed"] else "")]
    for r in rep["plans"]:
        runs = ", ".join("failed" if x is None else f"{x:.0f}" for x in r["runs"]) or "not run"
        meas = f"{r['measured_ms']:.0f} ms (spread {r['spread']:.0%})" if r["measured_ms"] else "-"
        tag = " <- measured fastest" if r["winner"] else ""
        tag += " [model's choice]" if r["chosen_by_model"] else ""
        lines.append(f"  {r['id']} {visible(r['plan'])}: predicted {r['predicted_ms']:.0f} ms, measured {meas}; "
                     f"runs {runs}{tag}")
        for e in r["errors"]:
            lines.append(f"      {visible(e)}")
    if rep["winner"]:
        if rep["gain_over_model_choice"] is not None:
            lines.append(f"measured {rep['gain_over_model_choice']:+.1%} against the model's choice")
        lines.append(f"pin it: mocompile {visible(rep['recipe'])} {visible(rep['set_line'])}   (or rerun with --write)")
    else:
        lines.append("no plan produced step times: nothing to pin (see the run logs)")
    if rep.get("profile"):
        lines.append(f"recorded {rep['profile_entries_added']} measurement(s) in {visible(rep['profile'])}")
        fit = rep.get("overlap_fit") or {}
        for pair in fit.get("pairs", []):
            lines.append(f"  EP overlap on/off measured x{pair['measured_ratio']:.3f} ({visible(pair['on'])}): "
                         + (f"overlap_host_factor {pair['factor']}" + (f" ({visible(pair['note'])})" if pair.get("note") else "")
                            if pair["factor"] is not None else visible(pair.get("why", ""))))
        if fit.get("value") is not None:
            lines.append(f"set overlap_host_factor {fit['value']} in {visible(rep['profile'])} (the planner uses it in "
                         "place of the calibrated constant; recipes naming this profile compile anew)")
        elif fit.get("pairs"):  # a race without an on/off pair says nothing about overlap
            lines.append(f"overlap_host_factor not set: {visible(fit.get('why', ''))}")
    elif "profile" in rep:
        lines.append("the recipe names no cluster profile (hardware.cluster): the measurements stay in "
                     f"{visible(rep['work'])}")
    if rep.get("wrote_recipe"):
        lines.append(f"pinned the measured fastest plan in {visible(rep['wrote_recipe'])}")
    return "\n".join(lines)
