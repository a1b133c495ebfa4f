"""`mocompile probe`: measure the user's own nodes and write a cluster profile.

The step-time model's constants come from NVIDIA's published DGX runs. On another cluster the
host launches kernels at another speed (the project's lent 4x H100 VMs: about 5x slower), so its
absolute step times, and which plans are host-bound, differ. ``probe``:

1. asks the target's Python what imports there (torch and its GPU, Transformer Engine, DeepEP,
   HybridEP); whatever does not import is recorded as missing, never guessed;
2. compiles a small host-bound MoE intent for the target (one node of its GPUs, every knob pinned) and
   runs its generated torchrun launcher a few times with MOCOMPILE_METRICS;
3. fits ``host_factor``: the value at which the step-time model predicts the measured median for
   that very plan (the model is monotone in it; bisection on a log scale);
4. runs the same launcher once more with ``MOCOMPILE_PROBE_KERNELS``: ``train.py`` then measures BF16
   GEMMs at the plan's shapes, the host's launch time of a tiny kernel and NCCL all-to-all inside the
   node, instead of training (``mocompile.kernels`` says what the model takes from them);
5. writes the profile (``clusters/<name>.yaml``) atomically: ``host_factor``, what imported, the probe
   runs with their spread, the kernel measurements with the scales the model applies, and which of
   the model's inputs it did NOT measure (all-to-all across nodes on one node, the flex dispatchers'
   own kernels: the DGX defaults stay for them).

``--from-runs DIR`` fits from a probe's recorded metrics instead of running (the CPU tests use it).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import statistics
import subprocess
from collections.abc import Callable
from typing import Any

from mocompile import kernels, measure
from mocompile.cluster import HOST_FACTOR
from mocompile.errors import UsageError

PROBE_NAME = "mocompile-probe"
ITERATIONS = 25
NOT_MEASURED_ALWAYS = ("deepep_hybridep_all_to_all",)  # the flex kernels: the model's defaults stay

# What the target's Python reports; run there (never imported here: mocompile needs no torch).
ENV_SCRIPT = r"""
import json, importlib
out = {}
def version(mod):
    try:
        m = importlib.import_module(mod)
        return str(getattr(m, "__version__", "unknown"))
    except Exception as exc:
        return None
out["torch"] = version("torch")
if out["torch"]:
    import torch
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    out["device_name"] = torch.cuda.get_device_name(0) if out["device_count"] else None
out["transformer_engine"] = version("transformer_engine")
out["deep_ep"] = version("deep_ep")
try:
    import deep_ep
    out["hybrid_ep"] = bool(hasattr(deep_ep, "HybridEPBuffer"))
except Exception:
    out["hybrid_ep"] = False
out["apex"] = version("fused_weight_gradient_mlp_cuda") and "installed"
out["megatron_core"] = version("megatron.core")
out["megatron_bridge"] = version("megatron.bridge")
print("MOCOMPILE_PROBE_ENV " + json.dumps(out))
"""


def environment(python: str = "python3", timeout: float = 300.0) -> dict[str, Any]:
    """What imports in the target's Python (a child process), with ``missing`` listing what does not."""
    try:
        proc = subprocess.run([python, "-c", ENV_SCRIPT], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{python}: {exc}", "missing": ["python"]}
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MOCOMPILE_PROBE_ENV ")), None)
    if line is None:
        return {"error": (proc.stderr or proc.stdout)[-400:], "missing": ["python"]}
    env = json.loads(line.split(" ", 1)[1])
    env["missing"] = [k for k in ("torch", "transformer_engine", "deep_ep", "apex", "megatron_core", "megatron_bridge")
                      if not env.get(k)] + ([] if env.get("hybrid_ep") else ["hybrid_ep"]) + \
        ([] if env.get("device_count") else ["gpu"])
    return env


def intent(gpu: str, gpus_per_node: int, te: str | None, iterations: int = ITERATIONS,
           apex: bool = False, targets: tuple[str, ...] = ("torchrun",)) -> dict[str, Any]:
    """The probe's intent: a small MoE model whose step the host, not the GPU, decides (many short kernels
    per layer, 64 experts), every knob pinned so that the plan does not move while the fit changes
    ``host_factor``. One micro-batch per rank and two per step, alltoall (imports everywhere)."""
    return {
        "schema": 1, "name": PROBE_NAME,
        "model": {"base": "tiny-moe", "num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 4096,
                  "num_attention_heads": 8, "num_query_groups": 4, "kv_channels": 128, "num_moe_experts": 64,
                  "moe_router_topk": 8, "moe_ffn_hidden_size": 512, "vocab_size": 32000},
        "hardware": {"gpu": gpu, "nodes": 1, "gpus_per_node": gpus_per_node},
        "goal": "throughput",
        "training": {"seq_length": 1024, "global_batch_size": 2 * gpus_per_node, "micro_batch_size": 1,
                     "precision": "bf16", "train_iters": iterations, "data": "mock", "seed": 1234},
        "parallelism": {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": gpus_per_node, "etp": 1},
        "moe": {"force_balance": True, "dispatcher": "alltoall", "overlap": False, "delay_wgrad": False},
        "recompute": {"granularity": "none"},
        "cuda_graphs": {"impl": "none"},
        # without Apex's fused weight-gradient kernel, gradient_accumulation_fusion must be off (preflight RUN011)
        "versions": {"transformer_engine": te or "none", **({} if apex else {"apex": "none"})},
        "launch": {"targets": list(targets)},
    }


def _profile_text(host_factor: float, kern: dict[str, Any] | None = None) -> str:
    scales = {k: (kern or {}).get(k) for k in ("gemm_scale", "a2a_scale", "a2a_latency_us")}
    return (f"schema: 1\nname: {PROBE_NAME}-trial\nhost_factor: {host_factor!r}\n"
            f"kernels: {json.dumps(scales)}\n")


def trial_set(work: str, recipe: str, host_factor: float, kern: dict[str, Any] | None = None) -> str:
    """Write a trial profile with ``host_factor`` (and the kernel probe's scales) in ``work`` (inside the
    project) and return the ``--set`` that makes ``recipe`` use it."""
    os.makedirs(work, exist_ok=True)
    trial = os.path.join(work, "trial-cluster.yaml")
    measure.write_text_atomic(trial, _profile_text(host_factor, kern))
    return f"hardware.cluster={os.path.relpath(trial, os.path.dirname(os.path.abspath(recipe)))}"


def predictor(work: str, recipe: str, sets: list[str] | None = None,
              kern: dict[str, Any] | None = None) -> Callable[[float], float]:
    """Predicted step (s) of ``recipe`` (with ``sets``: pin its plan) for a given ``host_factor`` (and the
    kernel probe's scales, which the fit holds fixed)."""
    from mocompile.pipeline import analyse

    def predict(h: float) -> float:
        res = analyse(recipe, list(sets or []) + [trial_set(work, recipe, h, kern)])
        if res.errors or res.plan is None:
            raise UsageError(f"{recipe} does not compile here: " +
                             "; ".join(f"{d.rule}: {d.message}" for d in res.errors))
        return measure.timed_step_s(res.plan.planner["chosen"])

    return predict


def fit_host_factor(measured_s: float, predict: Callable[[float], float]) -> tuple[float, str]:
    """The ``host_factor`` at which ``predict`` equals ``measured_s`` (bisection on log h), and a note when
    the measurement lies outside what any allowed factor predicts (the bound is returned then)."""
    factor, bound = measure.solve_rising(measured_s, predict, HOST_FACTOR)
    if bound:
        return factor, (f"measured {measured_s * 1e3:.0f} ms is at or {'below' if bound == 'lowest' else 'above'} "
                        f"the model's step at the {bound} host factor")
    return factor, ""


def kernel_section(result: dict[str, Any] | None, gpu: str, note: str = "") -> dict[str, Any]:
    """The profile's ``kernels`` entry from the kernel probe's JSON (None: it did not run): the raw
    measurements, their fits, and the two scales the step-time model applies (``mocompile.kernels``),
    each None with the reason where it cannot be derived, never guessed."""
    from mocompile.catalogue import gpus
    from mocompile.steptime import constants

    hw = gpus()[gpu]
    c = constants()
    if not result:
        return {"measured": False, "why": note or "the kernel probe wrote nothing", "gemm_scale": None,
                "a2a_scale": None, "a2a_latency_us": None}
    gemm = [{k: (round(float(g[k]), 1) if k in ("us", "tflops") else g[k]) for k in ("what", "m", "n", "k", "us", "tflops")
             if k in g} for g in result.get("gemm") or [] if isinstance(g, dict)]
    share = kernels.reference_share({"gemm": gemm}, float(hw["bf16_dense_tflops"]))
    a2a_points = (result.get("all_to_all") or {}).get("nccl_intra_node") or []
    world_points = (result.get("all_to_all") or {}).get("nccl_world") or []
    intra = kernels.fit_a2a(a2a_points, int(result.get("per_node") or 1))
    across = kernels.fit_a2a(world_points, int(result.get("world") or 1))
    same_arch = hw.get("arch") == kernels.REFERENCE_ARCH
    why: list[str] = []

    def scale(share: float | None, what: str, missing: str, reference: str) -> float | None:
        """share / its reference where both exist on the reference architecture, else None and why."""
        if share is None:
            why.append(missing)
        elif not same_arch:
            why.append(f"no reference {what} for {hw.get('arch')} GPUs: recorded, not applied")
        else:
            return round(kernels.clamp(share / c[reference]), 3)
        return None

    a2a_share = intra["gbps"] / float(hw["nvlink_gbps"]) if intra else None
    gemm_scale = scale(share, "GEMM", "the reference GEMM was not measured", "probe_reference_gemm_share")
    a2a_scale = scale(a2a_share, "all-to-all", "no all-to-all inside a node (one GPU per node, or too few points)",
                      "probe_reference_a2a_share")
    return {"measured": True, "device_name": result.get("device_name"), "torch": result.get("torch"),
            "nccl": result.get("nccl"), "gemm": gemm,
            "gemm_share": round(share, 4) if share is not None else None,
            "launch_us": round(float(result["launch_us"]), 2) if isinstance(result.get("launch_us"), (int, float)) else None,
            "all_to_all": {"nccl_intra_node": intra, "nccl_world": across},
            "a2a_share": round(a2a_share, 4) if a2a_share is not None else None,
            "gemm_scale": gemm_scale, "a2a_scale": a2a_scale,
            "a2a_latency_us": intra["latency_us"] if intra and a2a_scale is not None else None,
            "why": "; ".join(why)}


def run_kernels(gen_dir: str, work: str, launcher: measure.Launcher, timeout: float = 600.0) -> tuple[dict[str, Any] | None, str]:
    """The generated launcher once with MOCOMPILE_PROBE_KERNELS (``train.py`` measures instead of training);
    the JSON it wrote, or None and why."""
    out = os.path.join(work, "kernels.json")
    if os.path.exists(out):
        os.remove(out)
    log = os.path.join(work, "kernels.log")
    rc = launcher(os.path.join(gen_dir, "torchrun.sh"),
                  {"MOCOMPILE_PROBE_KERNELS": os.path.abspath(out), "MASTER_PORT": str(measure.free_port())},
                  log, timeout)
    return read_kernels(out, f"rc {rc}, see {log}")


def read_kernels(path: str, context: str = "") -> tuple[dict[str, Any] | None, str]:
    """A kernel probe's JSON, or None and why (missing, not JSON, not an object)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None, f"the kernel probe wrote no {os.path.basename(path)}" + (f" ({context})" if context else "")
    except ValueError as exc:
        return None, f"{path} is not JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"{path} holds no JSON object"
    return data, ""


def not_measured(kern: dict[str, Any]) -> list[str]:
    """The model's inputs this probe left at their defaults."""
    out = [] if kern.get("gemm_scale") is not None else ["gemm_efficiency"]
    if kern.get("a2a_scale") is None:
        out.append("all_to_all_inside_nodes")
    if not (kern.get("all_to_all") or {}).get("nccl_world"):
        out.append("all_to_all_across_nodes")
    return out + list(NOT_MEASURED_ALWAYS)


def profile_yaml(name: str, host_factor: float, env: dict[str, Any], runs: list[dict[str, Any]],
                 predicted_dgx_ms: float, note: str, gpu: str, gpus_per_node: int,
                 kern: dict[str, Any] | None = None, overlap: dict[str, Any] | None = None) -> str:
    """The profile file. Every string goes out JSON-quoted (a valid YAML scalar): the device name and
    versions come from the target machine."""
    q = json.dumps
    medians = [r["median_ms"] for r in runs if r.get("median_ms")]
    today = datetime.date.today().isoformat()
    source = (f"mocompile probe {today}: host_factor fitted to the median step of the probe plan ({len(medians)} "
              f"runs) on {gpus_per_node} x {gpu}" + (f"; {note}" if note else ""))
    lines = [
        "# Written by `mocompile probe`: what the step-time model needs to know about this cluster.",
        "schema: 1",
        f"name: {q(name)}",
        f"host_factor: {host_factor}",
        *([f"overlap_host_factor: {overlap['factor']}  # probe --overlap: the probe plan with EP overlap on "
           f"measured x{overlap['measured_ratio']:.3f} of it off"] if overlap and overlap.get("factor") else []),
        f"source: {q(source)}",
        "probe:",
        f"  date: {q(today)}",
        f"  gpu: {q(gpu)}",
        f"  gpus_per_node: {gpus_per_node}",
        f"  device_name: {q(env.get('device_name'))}",
        "  imports:",
    ]
    for k in ("torch", "transformer_engine", "deep_ep", "apex", "megatron_core", "megatron_bridge"):
        lines.append(f"    {k}: {q(env.get(k))}")
    lines.append(f"    hybrid_ep: {q(bool(env.get('hybrid_ep')))}")
    lines.append(f"  missing: {q(env.get('missing', []))}")
    kern = kern or kernel_section(None, gpu, "not run")
    lines.append(f"  not_measured: {q(not_measured(kern))}")
    lines.append(f"  plan: {q(PROBE_NAME)}")
    lines.append(f"  predicted_dgx_ms: {round(predicted_dgx_ms, 1)}")
    lines.append(f"  median_ms: {round(statistics.median(medians), 1) if medians else 'null'}")
    lines.append(f"  spread: {round(measure.spread(medians), 3)}")
    lines.append("  runs:")
    for r in runs:
        lines.append(f"    - {q(r)}")
    if overlap is not None:
        lines.append(f"  overlap: {q(overlap)}")
    lines.append("# The kernel probe (train.py under MOCOMPILE_PROBE_KERNELS): the model applies gemm_scale and a2a_scale")
    lines.append("# (ratios to the same measurement on a reference Hopper SXM GPU; null: not applied, `why` says why).")
    lines.append("kernels:")
    for k, v in kern.items():
        if k == "gemm":
            lines.append("  gemm:")
            lines.extend(f"    - {q(g)}" for g in v)
        else:
            lines.append(f"  {k}: {q(v)}")
    return "\n".join(lines) + "\n"


def probe(output: str, gpu: str, gpus_per_node: int, name: str | None = None, repeats: int = 3,
          iterations: int = ITERATIONS, python: str = "python3", work: str | None = None,
          from_runs: str | None = None, launcher: measure.Launcher = measure.run_launcher,
          quiet: bool = False, kernel_probe: bool = True,
          targets: tuple[str, ...] = ("torchrun",), overlap: bool = False) -> dict[str, Any]:
    """Run (or read) the probe, fit, write the profile; returns the report (text and JSON print it). With
    ``overlap`` the probe plan runs again with EP overlap on, and the pair fits ``overlap_host_factor``."""
    from mocompile.emit.writer import write_outputs
    from mocompile.pipeline import compile_recipe
    from mocompile.project import find_root

    if repeats < 1 or iterations <= measure.WARMUP_STEPS + 2:
        raise UsageError(f"--repeats must be >= 1 and --iterations > {measure.WARMUP_STEPS + 2} (warm-up steps "
                         "are not timed)")
    if from_runs is not None and not os.path.isdir(from_runs):
        raise UsageError(f"--from-runs {from_runs}: no such folder (it holds a probe's probe-<n>.jsonl files)")
    root = find_root(os.path.dirname(os.path.abspath(output))) or os.getcwd()
    work = os.path.abspath(work or os.path.join(root, ".mocompile", "probe"))
    if os.path.commonpath([root, work]) != root:
        raise UsageError(f"--work {work} lies outside the project {root}")
    os.makedirs(os.path.join(work, "runs"), exist_ok=True)
    env = environment(python) if from_runs is None else _recorded_env(from_runs)
    if from_runs is None and env.get("missing") and "python" in env["missing"]:
        raise UsageError(f"the target Python does not run: {env.get('error')}")
    recorded = {k: v for k, v in env.items() if k != "error"}
    if from_runs is None:  # beside the runs: --from-runs on this folder compiles the same probe plan again
        measure.write_text_atomic(os.path.join(work, "runs", "environment.json"), json.dumps(recorded, indent=1) + "\n")
    m = re.match(r"\d+\.\d+(\.\d+)?", str(env.get("transformer_engine") or ""))
    te = m.group(0) if m else None  # "2.12.0+cu13" -> "2.12.0": the intent's versions take numbers only
    recipe = os.path.join(work, "probe.yaml")
    measure.write_text_atomic(recipe, "# written by mocompile probe\n" +
                              json.dumps(intent(gpu, gpus_per_node, te, iterations, bool(env.get("apex")), targets),
                                                         indent=1) + "\n")
    gen = os.path.join(work, "generated")
    if from_runs is None:
        res = compile_recipe(recipe, [], [], os.path.relpath(gen, root))
        if res.errors or not res.files or res.plan is None:
            raise UsageError("the probe intent does not compile for this target: " +
                             "; ".join(f"{d.rule}: {d.message}" for d in res.errors))
        problem = write_outputs(gen, res.plan.name, res.files, force=True)
        if problem:
            raise UsageError(problem)
    runs = _repeat(os.path.join(gen, PROBE_NAME), work, "probe", "", repeats, from_runs, launcher, quiet,
                   f" ({iterations} iterations)")
    medians = [r["median_ms"] for r in runs if r["median_ms"]]
    if not medians:
        where = f"in {from_runs}" if from_runs is not None else f"(see {os.path.join(work, 'runs', 'probe-1.log')})"
        tail = "" if from_runs is not None else _tail(os.path.join(work, "runs", "probe-1.log"))
        raise UsageError(f"no probe run produced step times {where}; the profile was not written"
                         + (f"; its last lines:\n{tail}" if tail else ""))
    if from_runs is not None:
        result, why = read_kernels(os.path.join(from_runs, "kernels.json"))
    elif kernel_probe:
        bar = measure.Progress(1, "probe", quiet)
        bar.step("kernels: GEMMs at the plan's shapes, launch time, all-to-all")
        result, why = run_kernels(os.path.join(gen, PROBE_NAME), os.path.join(work, "runs"), launcher)
        bar.advance("kernels: " + ("measured" if result else why))
        bar.close()
    else:
        result, why = None, "--no-kernels"
    kern = kernel_section(result, gpu, why)
    predict = predictor(work, recipe, kern=kern)
    measured_s = statistics.median(medians) / 1000.0
    factor, note = fit_host_factor(measured_s, predict)
    dgx = predictor(work, recipe)(1.0) * 1000.0  # a DGX-class host with the reference kernels
    ov = overlap_probe(recipe, work, gen, root, repeats, medians, factor, kern, from_runs, launcher, quiet) \
        if overlap else None
    text = profile_yaml(name or os.path.splitext(os.path.basename(output))[0], factor, env, runs, dgx, note,
                        gpu, gpus_per_node, kern, ov)
    os.makedirs(os.path.dirname(os.path.abspath(output)) or ".", exist_ok=True)
    measure.write_text_atomic(output, text)
    return {"profile": output, "host_factor": factor, "note": note, "measured_ms": round(measured_s * 1e3, 1),
            "spread": round(measure.spread(medians), 3), "predicted_dgx_ms": round(dgx, 1), "runs": runs,
            "environment": recorded, "kernels": kern,
            "not_measured": not_measured(kern), "overlap": ov}


def overlap_probe(recipe: str, work: str, gen: str, root: str, repeats: int, plain_ms: list[float], factor: float,
                  kern: dict[str, Any], from_runs: str | None, launcher: measure.Launcher,
                  quiet: bool) -> dict[str, Any]:
    """The probe plan again with EP overlap on (``probe --overlap``): ``repeats`` runs (or ``probe-overlap-N.jsonl``
    from ``--from-runs``), and, where their run medians lie apart from the plain runs', the ``overlap_host_factor``
    at which the model (at the fitted ``host_factor``) predicts the measured ratio (mocompile.overlap_fit)."""
    from mocompile import overlap_fit
    from mocompile.emit.writer import write_outputs
    from mocompile.pipeline import compile_recipe

    name = f"{PROBE_NAME}-overlap"
    if from_runs is None:
        res = compile_recipe(recipe, ["moe.overlap=true", f"name={name}"], [], os.path.relpath(gen, root))
        if res.errors or not res.files or res.plan is None:
            return {"runs": [], "factor": None, "why": "the probe plan cannot run with EP overlap: " +
                    "; ".join(f"{d.rule}: {d.message}" for d in res.errors)}
        problem = write_outputs(gen, name, res.files, force=True)
        if problem:
            raise UsageError(problem)
    runs = [{"run": r["run"], "median_ms": r["median_ms"]}
            for r in _repeat(os.path.join(gen, name), work, "probe-overlap", "overlap ", repeats, from_runs, launcher,
                             quiet, "")]
    on = [r["median_ms"] for r in runs if r["median_ms"]]
    out: dict[str, Any] = {"runs": runs, "factor": None}
    if len(on) < 2 or len(plain_ms) < 2:
        out["why"] = "fewer than two runs of each plan: no range to compare (--repeats 2 or more)"
        return out
    out["measured_ratio"] = round(statistics.median(on) / statistics.median(plain_ms), 3)
    if not overlap_fit.apart(plain_ms, on):
        out["why"] = "the ranges of run medians overlap: the overlap's cost is inside the runs' noise"
        return out
    profile = {"schema": 1, "name": f"{PROBE_NAME}-trial", "host_factor": factor, "kernels": kern}
    predict = overlap_fit.step_predictor(recipe, [], profile, work)
    t_off = predict({"moe.overlap": False}, 1.0)
    out["factor"], out["note"] = overlap_fit.solve(out["measured_ratio"],
                                                   lambda f: predict({"moe.overlap": True}, f) / t_off)
    return out


def _repeat(gen_dir: str, work: str, prefix: str, label: str, repeats: int, from_runs: str | None,
            launcher: measure.Launcher, quiet: bool, detail: str) -> list[dict[str, Any]]:
    """``repeats`` runs of one generated plan, tagged ``<prefix>-N`` (or those runs' recorded metrics from
    ``--from-runs``): each run's rc, step count and median step, with a progress bar. One loop for the probe plan
    and its EP-overlap twin, so both are timed and read back the same way."""
    runs: list[dict[str, Any]] = []
    bar = measure.Progress(repeats, "probe", quiet)
    for i in range(repeats):
        tag = f"{prefix}-{i + 1}"
        if from_runs is not None:
            steps = measure.steady_ms(measure.read_metrics(os.path.join(from_runs, f"{tag}.jsonl")))
            rc = 0 if steps else 1
        else:
            bar.step(f"{label}run {i + 1} of {repeats}{detail}")
            out = measure.measure(gen_dir, os.path.join(work, "runs"), tag, launcher=launcher)
            steps, rc = out.step_ms, out.rc
        runs.append({"run": i + 1, "rc": rc, "steps": len(steps),
                     "median_ms": round(statistics.median(steps), 2) if steps else None})
        bar.advance(f"{label}run {i + 1}: " + (f"{runs[-1]['median_ms']:.0f} ms/step" if steps else f"failed (rc {rc})"))
    bar.close()
    return runs


def _tail(path: str, lines: int = 8) -> str:
    """The last lines of a run's log (what failed), made safe to print."""
    from mocompile.textsafe import visible

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "\n".join("  " + visible(ln.rstrip("\n"))[:300] for ln in fh.readlines()[-lines:])
    except OSError:
        return ""


def _recorded_env(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "environment.json")
    if not os.path.isfile(path):  # a folder from before the probe wrote it, or copied without it
        return {"missing": [f"environment (not recorded: no {path}; the probe plan is compiled as if "
                            "Transformer Engine and Apex were absent, which changes the fitted host_factor)"]}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    return data if isinstance(data, dict) else {"missing": ["environment (not recorded)"]}


def text(report: dict[str, Any]) -> str:
    from mocompile.textsafe import visible

    env = report["environment"]
    lines = [f"wrote {visible(report['profile'])}: host_factor {report['host_factor']} (the probe plan measured "
             f"{report['measured_ms']:.0f} ms/step, spread {report['spread']:.0%}, over "
             f"{sum(1 for r in report['runs'] if r['median_ms'])} runs; "
             f"the model predicts {report['predicted_dgx_ms']:.0f} ms on a DGX-class host)"]
    if report["note"]:
        lines.append(f"note: {report['note']}")
    lines.append("imports: " + ", ".join(f"{k} {visible(env.get(k))}" for k in
                                         ("torch", "transformer_engine", "deep_ep", "megatron_core", "megatron_bridge")))
    if env.get("missing"):
        lines.append("missing: " + ", ".join(visible(m) for m in env["missing"]))
    k = report.get("kernels") or {}
    if k.get("measured"):
        intra = (k.get("all_to_all") or {}).get("nccl_intra_node") or {}
        share = f"{k['gemm_share']:.0%} of the BF16 peak" if k.get("gemm_share") else "not measured"
        lines.append(f"kernels: reference GEMM {share}"
                     + (f" (gemm_scale {k['gemm_scale']})" if k.get("gemm_scale") is not None else "")
                     + (f"; NCCL all-to-all in a node {intra['gbps']:.0f} GB/s per GPU, {intra['latency_us']:.0f} us"
                        if intra else "")
                     + (f" (a2a_scale {k['a2a_scale']})" if k.get("a2a_scale") is not None else "")
                     + (f"; host launch {k['launch_us']:.1f} us per kernel" if k.get("launch_us") else ""))
    if k.get("why"):
        lines.append(f"kernels: {visible(k['why'])}")
    ov = report.get("overlap")
    if ov is not None:
        runs = ", ".join(f"{r['median_ms']:.0f}" if r["median_ms"] else "failed" for r in ov["runs"]) or "none"
        lines.append("EP overlap on: runs " + runs + " ms/step"
                     + (f" (x{ov['measured_ratio']:.3f})" if ov.get("measured_ratio") else "") + "; "
                     + (f"overlap_host_factor {ov['factor']}" + (f" ({visible(ov['note'])})" if ov.get("note") else "")
                        if ov.get("factor") is not None else "overlap_host_factor not set: " + visible(ov.get("why", ""))))
    lines.append("not measured (DGX defaults kept): " + ", ".join(report["not_measured"]))
    lines.append(f"use it: hardware: {{cluster: {visible(report['profile'])}}} in an intent")
    return "\n".join(lines)
