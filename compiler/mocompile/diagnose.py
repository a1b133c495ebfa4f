"""`mocompile diagnose RUN`: where a generated run's step went, the wall it hit, and what to change.

Megatron-Bridge's MoE tuning guidance is a loop: make it fit, choose parallelism, then profile the
dominant bottleneck (host overhead, communication, compute, memory) and retune. This reads what a
generated run leaves behind:

- the step metrics (``MOCOMPILE_METRICS``: one JSON line per step, rank 0: ``step_ms``, ``loss``,
  peak memory);
- the PyTorch profiler traces the intent's ``profile:`` key makes Bridge write (``rank-<R>.json.gz``),
  read by :mod:`mocompile.trace`;
- the run's ``mocompile.lock.json`` (the plan, its predicted step and the GPU's memory);

and reports the step's breakdown (compute, exposed communication, host idle, the rest; memory
headroom), names the dominant wall, and ranks intent changes from the guidance's table for that wall
by the step-time model's predicted gain (each compiled like ``--set``; changes that break a rule or
do not fit are listed with why). Without a trace the breakdown is the model's (from the lock), said so.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mocompile import measure
from mocompile.errors import InputError
from mocompile.ir import Diagnostic, Position

WARMUP_STEPS = 3  # the first steps compile kernels and allocate: not the steady state


@dataclass
class Run:
    """What a run folder holds."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    traces: list[str] = field(default_factory=list)
    lock: dict[str, Any] | None = None
    lock_path: str | None = None


def _bad(message: str, path: str, hint: str = "") -> InputError:
    return InputError([Diagnostic("INPUT", "error", message, Position(path), hint)])


def find(paths: list[str], lock: str | None = None) -> Run:
    """Collect metrics lines, traces and the lock from files and folders (folders searched recursively)."""
    run = Run()
    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            for d, _, names in os.walk(p):
                files += [os.path.join(d, n) for n in sorted(names)]
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise _bad(f"no such file or folder: {p}", p, "give the run's output folder, or its files")
    for f in sorted(files):
        name = os.path.basename(f)
        if name == "mocompile.lock.json" and lock is None:
            lock = f
        elif name.endswith(".jsonl"):
            run.metrics += _metrics(f)
        elif name.endswith((".json", ".json.gz")) and _is_trace(f):
            run.traces.append(f)
    if lock:
        try:
            with open(lock, encoding="utf-8") as fh:
                run.lock = json.load(fh)
        except (OSError, ValueError) as exc:
            raise _bad(f"cannot read the lock: {exc}", lock) from None
        run.lock_path = lock
    if not run.metrics and not run.traces:
        raise _bad("found no step metrics (*.jsonl) and no profiler trace (*.json[.gz]) here", paths[0],
                   "run the generated launcher with MOCOMPILE_METRICS=<file>, and a `profile:` key for traces")
    return run


def _metrics(path: str) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise _bad(f"line {n} is not JSON", path) from None
            if isinstance(row, dict) and isinstance(row.get("step_ms"), (int, float)):
                rows.append(row)
    return rows


def _is_trace(path: str) -> bool:
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            # PyTorch writes schemaVersion and deviceProperties first, then distributedInfo (one entry per
            # process group: tens of KiB under Megatron) before traceEvents
            head = fh.read(4096)
            return '"traceEvents"' in head or ('"schemaVersion"' in head and '"deviceProperties"' in head)
    except (OSError, UnicodeDecodeError, EOFError):
        return False


def profiled_iterations(lock: dict[str, Any] | None) -> set[int]:
    """The iterations the profiler recorded (Bridge's ``profile_step_start`` up to, not including,
    ``profile_step_end``): the profiler slows them, so they are not the run's step time."""
    settings = (lock or {}).get("settings") or {}

    def value(name: str) -> Any:
        d = settings.get(name)
        return d.get("value") if isinstance(d, dict) else None

    start, end = value("profile_step_start"), value("profile_step_end")
    if not value("use_pytorch_profiler") or not isinstance(start, int) \
            or not isinstance(end, int) or isinstance(start, bool) or isinstance(end, bool):
        return set()
    return set(range(start, end))


def breakdown(run: Run) -> dict[str, Any]:
    """The step's parts in ms (median over steps and traced ranks) and where they came from."""
    out: dict[str, Any] = {}
    from mocompile.measure import steady_rows

    steady = steady_rows(run.metrics, WARMUP_STEPS, profiled_iterations(run.lock)) or run.metrics
    if steady:
        times = sorted(float(r["step_ms"]) for r in steady)
        out["measured_step_ms"] = round(statistics.median(times), 1)
        out["measured_spread"] = round((times[-1] - times[0]) / statistics.median(times), 3) if len(times) > 1 else 0.0
        out["steps"] = len(times)
        read = [r.get("max_memory_reserved") or r.get("max_memory_allocated") for r in steady]
        peaks = [float(p) for p in read if isinstance(p, (int, float))]
        if peaks:
            out["peak_memory_gib"] = round(max(peaks) / 2 ** 30, 2)
    if run.traces:
        from mocompile.trace import load, summarize

        meds: list[dict[str, float]] = []
        for t in run.traces:
            try:
                med = summarize(load(Path(t))).get("median")
            except (OSError, ValueError, EOFError) as exc:
                raise _bad(f"cannot read the trace: {exc}", t) from None
            if med:
                meds.append(med)
        if meds:
            keys = meds[0].keys()
            trace = {k: round(statistics.median(m[k] for m in meds), 3) for k in keys}
            out["trace_ms"] = trace
            out["source"] = f"profiler trace ({len(meds)} rank(s))"
    if "trace_ms" not in out and run.lock:
        terms = (run.lock.get("estimate") or {}).get("chosen", {}).get("terms_s") or {}
        out["model_ms"] = {k: round(v * 1000, 1) for k, v in terms.items()}
        out["source"] = "the step-time model (no trace: add a `profile:` key to measure the split)"
    if run.lock:
        gpu = (run.lock.get("memory") or {}).get("gpu_memory_gib")
        if gpu and "peak_memory_gib" in out:
            out["memory_headroom"] = round(1 - out["peak_memory_gib"] / gpu, 3)
        chosen = (run.lock.get("estimate") or {}).get("chosen", {})
        if chosen.get("step_time_s"):  # as the step probe times it: no scheduled collection
            out["predicted_step_ms"] = round(measure.timed_step_s(chosen) * 1000, 1)
    return out


UNEXPLAINED = 1.25  # a measured step this far above the prediction is not the model's error: the host differs


def _fit_host(run: Run, parts: dict[str, Any], recipe: str | None, sets: list[str]) -> list[str]:
    """Without a cluster profile, a run far slower than predicted says this host is not the DGX host the
    model assumes. Fit ``host_factor`` to the measured step for the run's own plan (as ``mocompile probe``
    does for its probe plan) and return the ``--set`` lines (the plan's pins and the fitted profile) the
    changes are ranked with; without a trace the breakdown is re-derived from the model at that factor."""
    lock = run.lock or {}
    chosen = (lock.get("estimate") or {}).get("chosen") or {}
    measured, predicted = parts.get("measured_step_ms"), parts.get("predicted_step_ms")
    if (lock.get("hardware") or {}).get("cluster") or not chosen.get("pins") \
            or not measured or not predicted or measured < predicted * UNEXPLAINED or not recipe \
            or not os.path.isfile(recipe):
        return []
    from mocompile import probe
    from mocompile.pipeline import analyse
    from mocompile.project import find_root
    from mocompile.tune import pin_sets

    pins = pin_sets(chosen["pins"])
    work = os.path.join(find_root(os.path.dirname(os.path.abspath(recipe))) or os.getcwd(), ".mocompile", "diagnose")
    factor, note = probe.fit_host_factor(measured / 1000.0, probe.predictor(work, recipe, sets + pins))
    extra = pins + [probe.trial_set(work, recipe, factor)]
    res = analyse(recipe, sets + extra)
    if res.errors or res.plan is None:
        return []
    parts["host_factor_fitted"] = factor
    if "trace_ms" in parts:  # the trace measured the split; the fitted factor only ranks the changes
        return extra
    terms = res.plan.planner["chosen"]["terms_s"]
    parts["model_ms"] = {k: round(v * 1000, 1) for k, v in terms.items()}
    parts["source"] = (f"the step-time model at host_factor {factor} (fitted: the measured step is "
                       f"{measured / predicted:.1f}x the DGX-host prediction; no trace" + (f"; {note}" if note else "")
                       + "): run `mocompile probe` for a cluster profile, or add a `profile:` key to measure the split")
    return extra


WALLS = ("host", "communication", "compute", "memory")


def wall(parts: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """The dominant wall and every wall's share of the step. Memory is the wall when less than 5 % of the
    GPU's memory is left (the next change must make room before it can make time)."""
    shares: dict[str, float] = {}
    t = parts.get("trace_ms")
    if t and t.get("wall_ms"):
        w = t["wall_ms"]
        shares = {"host": t["idle_ms"] / w, "communication": t["comm_exposed_ms"] / w,
                  "compute": t["compute_ms"] / w}
    elif parts.get("model_ms"):
        m = parts["model_ms"]
        total = sum(v for k, v in m.items() if k != "a2a_total") or 1.0
        shares = {"host": m.get("host_bound", 0.0) / total,
                  "communication": (m.get("a2a_exposed", 0.0) + m.get("tp_cp", 0.0) + m.get("pp_p2p", 0.0)
                                    + m.get("dp_exposed", 0.0) + m.get("param_gather", 0.0)) / total,
                  "compute": (m.get("compute", 0.0) + m.get("recompute", 0.0)) / total}
    shares = {k: round(v, 3) for k, v in shares.items()}
    if parts.get("memory_headroom") is not None and parts["memory_headroom"] < 0.05:
        return "memory", shares
    return (max(shares, key=lambda k: shares[k]) if shares else "compute"), shares


def proposals(wall_name: str, lock: dict[str, Any]) -> list[tuple[str, str]]:
    """(``--set`` expression, why) from the guidance's table for a wall, given the plan in the lock."""
    s = {k: v.get("value") for k, v in (lock.get("settings") or {}).items()}
    out: list[tuple[str, str]] = []
    if wall_name == "host":
        if s.get("cuda_graph_impl") in (None, "none"):
            out.append(("cuda_graphs.impl=transformer_engine", "CUDA graphs replay the launches the host cannot keep up with"))
        mbs = s.get("micro_batch_size")
        if isinstance(mbs, int):
            out.append((f"training.micro_batch_size={mbs * 2}", "a larger micro-batch launches the same kernels for more tokens"))
        if s.get("moe_token_dispatcher_type") != "alltoall":
            out.append(("moe.dispatcher=alltoall", "fewer, larger launches than a flex dispatcher on a launch-bound step"))
        if s.get("overlap_moe_expert_parallel_comm"):
            out.append(("moe.overlap=false", "the overlapped schedule adds host work per layer (`mocompile tune "
                                             "--overlap` measures how much on this cluster)"))
    elif wall_name == "communication":
        for d in ("deepep", "hybridep", "alltoall"):
            if d != (s.get("moe_flex_dispatcher_backend") if s.get("moe_token_dispatcher_type") == "flex"
                     else s.get("moe_token_dispatcher_type")):
                out.append((f"moe.dispatcher={d}", "another token dispatcher"))
        if not s.get("overlap_moe_expert_parallel_comm"):
            out.append(("moe.overlap=true", "hide the EP all-to-all behind the other micro-batch's compute "
                                            "(`mocompile tune --overlap` measures it on this cluster)"))
        ep = s.get("expert_model_parallel_size")
        if isinstance(ep, int) and ep > 1:
            out.append((f"parallelism.ep={ep // 2}", "a smaller EP group keeps more all-to-all inside NVLink"))
    elif wall_name == "memory":
        if s.get("recompute_granularity") != "full":
            out.append(("recompute.granularity=full", "recompute frees the activations"))
        mbs = s.get("micro_batch_size")
        if isinstance(mbs, int) and mbs > 1:
            out.append((f"training.micro_batch_size={mbs // 2}", "half the activations per micro-batch"))
    else:  # compute
        if s.get("precision") == "bf16":
            out.append(("training.precision=fp8-cs", "FP8 GEMMs (current scaling) where TE and the GPU allow"))
        if s.get("recompute_granularity"):
            out.append(("recompute.granularity=none", "recompute repeats forward work"))
    return out


def rank(recipe: str | None, changes: list[tuple[str, str]], base_sets: list[str]) -> list[dict[str, Any]]:
    """Each change compiled with the model: predicted step and gain against the run's own plan."""
    rows: list[dict[str, Any]] = [{"set": c, "why": why} for c, why in changes]
    if not recipe or not os.path.isfile(recipe):
        for r in rows:
            r["predicted"] = None
            r["note"] = "recipe not found here: no prediction"
        return rows
    from mocompile.pipeline import analyse

    base = analyse(recipe, base_sets).plan
    base_step = base.planner["chosen"]["step_time_s"] if base is not None and base.planner else None
    for r in rows:
        try:
            res = analyse(recipe, base_sets + [r["set"]])
        except InputError as exc:
            r["predicted"], r["note"] = None, "; ".join(d.message for d in exc.diagnostics)
            continue
        if res.errors:
            r["predicted"], r["note"] = None, "breaks " + ", ".join(sorted({d.rule for d in res.errors}))
            continue
        assert res.plan is not None  # analyse returns a plan whenever the input read
        step = res.plan.planner["chosen"]["step_time_s"]
        r["predicted_step_s"] = step
        r["predicted_gain"] = round(1 - step / base_step, 4) if base_step else None
    def gain(row: dict[str, Any]) -> float:
        g = row.get("predicted_gain")
        return float(g) if g is not None else -9.0

    rows.sort(key=lambda row: -gain(row))
    return rows


def diagnose(paths: list[str], lock: str | None = None, recipe: str | None = None,
             sets: list[str] | None = None) -> dict[str, Any]:
    """The whole report as data (text and JSON print from it)."""
    run = find(paths, lock)
    parts = breakdown(run)
    src = ((run.lock or {}).get("_generated") or {}).get("source")
    recipe = recipe or src
    base_sets = list(sets or [])
    fitted = _fit_host(run, parts, recipe, base_sets)
    if fitted:
        base_sets += fitted
    name, shares = wall(parts)
    changes = proposals(name, run.lock or {}) if run.lock else []
    ranked = rank(recipe, changes, base_sets)
    best = next((r for r in ranked if (r.get("predicted_gain") or 0) > 0), None)
    return {"breakdown": parts, "wall": name, "shares": shares, "recipe": recipe, "proposals": ranked,
            "set_line": f"--set {best['set']}" if best else None,
            "lock": run.lock_path, "traces": run.traces, "metrics_lines": len(run.metrics)}


def text(report: dict[str, Any]) -> str:
    from mocompile.textsafe import visible

    b = report["breakdown"]
    lines = []
    if "measured_step_ms" in b:
        lines.append(f"measured step: {b['measured_step_ms']:.0f} ms (median of {b['steps']} steps after warm-up, "
                     f"spread {b['measured_spread']:.0%})" + (f"; predicted {b['predicted_step_ms']:.0f} ms"
                                                               if "predicted_step_ms" in b else ""))
    if "trace_ms" in b:
        t = b["trace_ms"]
        lines.append(f"breakdown ({b['source']}): wall {t['wall_ms']:.0f} ms = compute {t['compute_ms']:.0f} + exposed "
                     f"communication {t['comm_exposed_ms']:.0f} + host idle {t['idle_ms']:.0f} + other "
                     f"{t['busy_ms'] - t['compute_ms'] - t['comm_exposed_ms']:.0f} ms")
    elif "model_ms" in b:
        lines.append(f"breakdown from {b['source']}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in b["model_ms"].items()))
    if "peak_memory_gib" in b:
        lines.append(f"peak memory {b['peak_memory_gib']:.1f} GiB" + (f" ({b['memory_headroom']:.0%} of the GPU left)"
                                                                    if "memory_headroom" in b else ""))
    if "host_factor_fitted" in b:
        lines.append(f"changes ranked at host_factor {b['host_factor_fitted']} (fitted to the measured step for this "
                     "plan; the lock assumed a DGX-class host): `mocompile probe` writes a profile for this cluster")
    shares = ", ".join(f"{k} {v:.0%}" for k, v in report["shares"].items())
    lines.append(f"dominant wall: {report['wall']} ({shares})")
    for r in report["proposals"]:
        gain = r.get("predicted_gain")
        what = f"predicted {gain:+.1%}" if gain is not None else visible(r.get("note", ""))
        lines.append(f"  --set {visible(r['set']):<40} {what}: {r['why']}")
    if report["set_line"]:
        lines.append(f"try: mocompile {visible(report['recipe'])} {visible(report['set_line'])}")
    elif report["proposals"]:
        lines.append("no change is predicted to help: the model sees this plan at its best for the wall")
    return "\n".join(lines)


__all__ = ["Run", "breakdown", "diagnose", "find", "proposals", "rank", "text", "wall"]
