"""The rank probe (issue 23): one rank of a plan of any size, run on one GPU with torch's fake process group.

Megatron-Core can run a single rank of a job of any size under torch's fake process group (Megatron-LM's
``--fake-process-group``, ``megatron/training/initialize.py``: collectives skipped, WORLD_SIZE and RANK set to
the target, one real GPU). That rank builds its real model shard, allocates its real optimizer state and runs
real forward and backward kernels on its share of the batch, so the memory of the most-loaded rank of a
1024-GPU plan is measured on one GPU.

This module decides, at compile time and without torch, what the generated ``train.py`` does in that mode
(``MOCOMPILE_RANK_PROBE=<result.json>``, started by the generated ``rankprobe.sh``):

- which rank it impersonates: the one the memory estimate calls most loaded (the first pipeline stage, which
  holds the most micro-batches in flight, or the last, which holds the logits and the loss), a data-loading
  rank of that stage (tensor-, context- and expert-parallel rank 0: every rank of a stage holds the same shard
  sizes, and a rank that does not load data would receive its batch through a broadcast the fake group skips);
- what the plan uses that cannot run under a fake group and what replaces it (each a rule, ``PRB002``..),
  with the memory estimate of the plan and of the probed configuration, so the difference the substitution
  makes is stated, not hidden;
- how many micro-batches an iteration runs: the plan's global batch cut to twice the pipeline depth (the
  first stage's peak holds as many micro-batches as the schedule's warm-up, which this keeps), so a
  1024-GPU plan's iteration takes seconds on one GPU (``PRB004``).

``findings`` turns a result (or a plan before it runs) into diagnostics with those IDs; ``report`` prints a
result beside its estimate.
"""

from __future__ import annotations

from typing import Any

from mocompile import memory
from mocompile.ir import Plan

ITERATIONS = 6          # iterations a probe runs by default (the first is warm-up: lazy allocations, autotuning)
MEASURED_FROM = 2       # iteration times are the median from this iteration on
TOLERANCE = 0.10        # the acceptance band of issue 23: the estimate within 10 % of the measured peak


def stage_rank(world: int, pp: int, stage: int) -> int:
    """The first global rank of pipeline stage ``stage``: Megatron-Core's rank order puts the pipeline
    outermost (``tp-cp-ep-dp-pp``, Bridge's default), so stage ``s`` holds ranks ``s * world/pp`` onward, and
    its first rank is tensor-, context-, expert- and data-parallel rank 0."""
    return stage * (world // pp)


def _ordinal(n: int) -> str:
    """1 -> "first", 2 -> "2nd", 3 -> "3rd", 11 -> "11th" (stage numbers in the probe's reason)."""
    if n == 1:
        return "first"
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def most_loaded_stage(plan: Plan, est: dict[str, Any]) -> tuple[int, str]:
    """(stage, why) of the rank the estimate describes: ``memory.Estimator`` prices every pipeline stage (its
    layers by the layout, the micro-batches its schedule keeps in flight, the last one's logits) and keeps the
    largest."""
    pp = int(plan["pipeline_model_parallel_size"])
    if pp == 1:
        return 0, "no pipeline: every rank holds the whole stack, the embedding, the output layer and the loss"
    stage = int(est.get("stage") or 0)
    if stage == pp - 1:
        return stage, (f"the last of {pp} pipeline stages: its in-flight activations plus the fp32 logits "
                       f"({est['logits_gib']:g} GiB) are the largest of the stages (memory estimate)")
    return stage, (f"the {_ordinal(stage + 1)} of {pp} pipeline stages: {est['in_flight_microbatches']:g} micro-batches' "
                   "activations in flight on its layers are the largest of the stages (memory estimate)")


def probe_microbatches(plan: Plan) -> int:
    """Micro-batches per probe iteration: twice the pipeline depth (at least 2: EP overlap pairs micro-batches),
    never more than the plan runs. The schedule's warm-up, which sets the first stage's peak, is then the plan's:
    at most ``pp`` micro-batches (1F1B) or ``2(pp-1) + (vpp-1)pp + 1`` model chunks (interleaved), both below
    ``2 pp`` micro-batches of ``vpp`` chunks."""
    m = int(plan.get("num_microbatches") or 1)
    return max(1, min(m, max(2, 2 * int(plan["pipeline_model_parallel_size"]))))


FLEX_NAMES = {"deepep": "DeepEP", "hybridep": "HybridEP", "ncclep": "NCCL EP"}


def _substitutions(plan: Plan, m: int, m_probe: int) -> list[dict[str, Any]]:
    """What the probe runs differently from the plan, each with its rule and reason (model fields only: they are
    applied to ``cfg.model`` after ``build_config()``; the batch and the run-time switches are listed apart)."""
    subs: list[dict[str, Any]] = []
    if plan["moe_token_dispatcher_type"] == "flex":
        backend = plan.get("moe_flex_dispatcher_backend")
        subs.append({"field": "moe_token_dispatcher_type", "plan": f"flex ({backend})", "probe": "alltoall",
                     "rule": "PRB002",
                     "why": f"{FLEX_NAMES.get(str(backend), str(backend))} needs real peers (its buffers exchange "
                            f"{'an NCCL communicator' if backend == 'ncclep' else 'IPC and NVSHMEM handles'} at "
                            "construction); Megatron-LM refuses the flex dispatcher under a fake process group. "
                            "The alltoall dispatcher moves the same tokens through PyTorch's "
                            "allocator; the flex dispatcher's own buffers are outside it"})
    if not plan.get("moe_router_force_load_balancing"):
        subs.append({"field": "moe_router_force_load_balancing", "plan": False, "probe": True, "rule": "PRB003",
                     "why": "the tokens a rank's experts receive depend on every other rank's routing, which a fake "
                            "group does not run: routing is forced to balance (random router logits), so each expert "
                            "gets its mean share; the estimate's natural-routing imbalance is not measured"})
    if m_probe < m:
        subs.append({"field": "global_batch_size", "plan": int(plan["global_batch_size"]),
                     "probe": int(plan["global_batch_size"]) * m_probe // m, "rule": "PRB004",
                     "why": f"{m_probe} of the plan's {m} micro-batches per iteration (the pipeline's warm-up, and so "
                            "the peak, is the plan's); compute times are scaled by "
                            f"{m}/{m_probe} to compare with the step-time model"})
    return subs


def _settings(plan: Plan, subs: list[dict[str, Any]]) -> dict[str, Any]:
    """The plan's flat settings with the probe's substitutions applied (what the estimate of the probe reads)."""
    c = dict(plan.values())
    for s in subs:
        c[s["field"]] = s["probe"]
    if c.get("moe_token_dispatcher_type") != "flex":
        c["moe_flex_dispatcher_backend"] = None
    return c


def spec(plan: Plan) -> dict[str, Any]:
    """Everything the generated ``train.py`` needs for ``MOCOMPILE_RANK_PROBE``: plain values, computed here
    (no torch), printed into the file as one literal."""
    world = int(plan.hardware["world_size"])
    pp = int(plan["pipeline_model_parallel_size"])
    m = int(plan.get("num_microbatches") or 1)
    m_probe = probe_microbatches(plan)
    subs = _substitutions(plan, m, m_probe)
    probed = _settings(plan, subs)
    stage, why = most_loaded_stage(plan, memory.estimate(plan.model, probed))
    # the estimate of the probed rank itself (the planner's adds the heaviest rank's weights to the heaviest rank's
    # activations, which may be two ranks)
    est_plan = memory.estimate(plan.model, dict(plan.values(), memory_stage=stage))
    est_probe = memory.estimate(plan.model, dict(probed, memory_stage=stage))
    # every stage's estimate, so that a rank picked by MOCOMPILE_RANK_PROBE_RANK is compared with its own stage's
    by_stage = [est_probe["estimate_gib"] if s == stage else
                memory.estimate(plan.model, dict(probed, memory_stage=s))["estimate_gib"] for s in range(pp)]
    terms = ((plan.planner or {}).get("chosen") or {}).get("terms_s") or {}
    compute = sum(float(terms.get(k) or 0.0) for k in ("compute", "recompute"))
    keep = ("estimate_gib", "total_gib", "weights_and_optimizer_gib", "activations_gib", "logits_gib",
            "dispatcher_buffers_gib", "graph_buffers_gib", "unfused_wgrad_gib", "optimizer_step_gib",
            "params_per_gpu_m", "in_flight_microbatches")
    return {
        "world_size": world,
        "rank": stage_rank(world, pp, stage),
        "stage": stage,
        "stages": pp,
        "rank_why": why,
        "iterations": ITERATIONS,
        "microbatches": {"plan": m, "probe": m_probe},
        "global_batch_size": int(plan["global_batch_size"]) * m_probe // m,
        "model": {s["field"]: s["probe"] for s in subs if s["field"] != "global_batch_size"},
        "substitutions": subs,
        "estimate": {"plan": {k: est_plan[k] for k in keep}, "probe": {k: est_probe[k] for k in keep},
                     "probe_by_stage_gib": by_stage,
                     # what the substitutions change in the estimate (plan minus probe): the part of the plan's
                     # memory the probe cannot show
                     "difference_gib": {"allocated": round(est_plan["estimate_gib"] - est_probe["estimate_gib"], 2),
                                        "total": round(est_plan["total_gib"] - est_probe["total_gib"], 2)}},
        # the step-time model's compute (+ recompute) for this rank's plan-sized iteration, and scaled to the probe's
        "model_compute_s": {"plan": round(compute, 4), "probe": round(compute * m_probe / m, 4)},
    }


def findings(probe: dict[str, Any], gpu_gib: float | None = None, rank: int | None = None) -> list[dict[str, Any]]:
    """The rank-probe rules a spec (and, once known, the probing GPU's memory) triggers, as plain dicts:
    ``PRB001`` the probed configuration's estimate (of ``rank``'s stage; default the spec's rank) does not fit the
    probing GPU; ``PRB002``-``PRB004`` the substitutions, each with the memory they hide."""
    out: list[dict[str, Any]] = []
    rank = probe["rank"] if rank is None else rank
    est_gib = probed_estimate_gib(probe, rank)
    if gpu_gib is not None and est_gib > gpu_gib:
        out.append({"rule": "PRB001", "severity": "error",
                    "message": f"rank {rank}'s estimated peak, {est_gib:g} GiB, exceeds this "
                               f"GPU's {gpu_gib:g} GiB: the probe would stop at its first out-of-memory error",
                    "hint": "probe on a GPU with more memory (the plan's own GPU type), or lower the rank's share "
                            "first (more expert or pipeline parallelism, recompute)"})
    diff = probe["estimate"]["difference_gib"]
    for s in probe["substitutions"]:
        rule = s["rule"]
        hidden = ""
        if rule == "PRB002":
            buf = probe["estimate"]["plan"]["dispatcher_buffers_gib"]
            hidden = f"; the plan's dispatcher buffers, {buf:g} GiB by the estimate, are not measured"
        elif rule == "PRB003":
            hidden = (f"; the estimate of the plan's natural routing is {diff['allocated']:+g} GiB over the "
                      "balanced one measured")
        out.append({"rule": rule, "severity": "warning" if rule in ("PRB002", "PRB003") else "info",
                    "message": f"{s['field']}: {s['plan']} -> {s['probe']} for the probe: {s['why']}{hidden}",
                    "hint": "the probe's result compares its measurement with the estimate of the probed "
                            "configuration; the plan's own estimate is printed beside it"})
    return out


def stage_of(spec: dict[str, Any], rank: int) -> int:
    """The pipeline stage of global ``rank`` (the pipeline outermost, as ``stage_rank``)."""
    return min(int(spec["stages"]) - 1, rank // max(1, int(spec["world_size"]) // int(spec["stages"])))


def probed_estimate_gib(spec: dict[str, Any], rank: int) -> float:
    """The estimate of the probed configuration for the stage ``rank`` is on: the spec's own rank's, or, when
    MOCOMPILE_RANK_PROBE_RANK picked another stage, that stage's (a spec without per-stage figures: its rank's)."""
    by_stage = spec["estimate"].get("probe_by_stage_gib")
    if by_stage and rank != spec["rank"]:
        return float(by_stage[stage_of(spec, rank)])
    return float(spec["estimate"]["probe"]["estimate_gib"])


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures a result is judged by: measured peaks against the estimate of the probed configuration, for
    the stage of the rank that ran."""
    est = {"estimate_gib": probed_estimate_gib(result["spec"], int(result.get("rank", result["spec"]["rank"])))}
    alloc_gib = result["max_memory_allocated"] / memory.GIB
    reserved_gib = result["max_memory_reserved"] / memory.GIB
    err = (est["estimate_gib"] - alloc_gib) / alloc_gib if alloc_gib else None
    times = [r["step_ms"] for r in result.get("iterations", []) if r["iteration"] >= MEASURED_FROM]
    times.sort()
    median = times[len(times) // 2] if times else None
    scale = result["spec"]["microbatches"]["plan"] / result["spec"]["microbatches"]["probe"]
    return {"measured_allocated_gib": round(alloc_gib, 2), "measured_reserved_gib": round(reserved_gib, 2),
            "estimate_gib": est["estimate_gib"], "error": None if err is None else round(err, 4),
            "within_tolerance": None if err is None else abs(err) <= TOLERANCE,
            "iterations_run": len(result.get("iterations", [])),
            "iteration_ms": None if median is None else round(median, 1),
            "iteration_plan_scaled_s": None if median is None else round(median * scale / 1000.0, 3),
            "model_compute_s": result["spec"]["model_compute_s"]["plan"]}


def read_result(path: str) -> dict[str, Any]:
    """A result the generated ``train.py`` wrote; a file that is not one is a usage error (exit 2), not a crash."""
    import json

    from mocompile.errors import UsageError
    from mocompile.textsafe import visible

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.loads(fh.read(16 * 1024 * 1024))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{visible(path)}: not a rank-probe result ({visible(exc)})") from None
    try:
        ok = isinstance(data, dict) and isinstance(data["spec"]["estimate"]["probe"]["estimate_gib"], (int, float)) \
            and isinstance(data["max_memory_allocated"], int) and isinstance(data["iterations"], list) \
            and all(isinstance(r.get("step_ms"), (int, float)) and isinstance(r.get("iteration"), int)
                    for r in data["iterations"]) \
            and all(isinstance(data["spec"]["microbatches"][k], int) and data["spec"]["microbatches"][k] > 0
                    for k in ("plan", "probe"))
    except (KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise UsageError(f"{visible(path)}: not a rank-probe result (the JSON rankprobe.sh writes)")
    return data


def run(recipe: str, sets: list[str], unsets: list[str], rank: int | None = None, iterations: int | None = None,
        python: str = "python3", work: str | None = None, timeout: float = 1800.0) -> dict[str, Any]:
    """``mocompile rankprobe RECIPE``: compile ``recipe`` into ``work``, run its ``rankprobe.sh`` on this machine's
    first GPU, read the result; the report holds the spec, the findings, the result and its summary."""
    import os

    from mocompile import measure
    from mocompile.emit.writer import write_outputs
    from mocompile.errors import InputError, UsageError
    from mocompile.pipeline import compile_recipe
    from mocompile.project import find_root

    if not os.path.isfile(recipe):
        raise UsageError(f"no such recipe: {recipe}")
    if iterations is not None and iterations < 1:
        raise UsageError("--iterations must be at least 1")
    root = find_root(os.path.dirname(os.path.abspath(recipe))) or os.getcwd()
    work = work or os.path.join(root, ".mocompile", "rankprobe")
    gen = os.path.join(work, "generated")
    os.makedirs(gen, exist_ok=True)
    res = compile_recipe(recipe, sets, unsets, os.path.relpath(gen, root))
    if res.errors or not res.files or res.plan is None:
        raise InputError(res.errors or res.diagnostics)
    world = int(res.plan.hardware["world_size"])
    if rank is not None and not 0 <= rank < world:
        raise UsageError(f"--rank {rank} is not a rank of this {world}-GPU plan (0..{world - 1})")
    problem = write_outputs(gen, res.plan.name, res.files, force=True)
    if problem:
        raise UsageError(problem)
    probe = spec(res.plan)
    out = os.path.join(work, f"{res.plan.name}.json")
    log = os.path.join(work, f"{res.plan.name}.log")
    if os.path.exists(out):
        os.unlink(out)
    env = {"MOCOMPILE_RANK_PROBE": os.path.abspath(out), "PYTHON": python,
           "MOCOMPILE_RANK_PROBE_RANK": str(probe["rank"] if rank is None else rank),
           "MOCOMPILE_RANK_PROBE_ITERS": str(iterations or probe["iterations"])}
    rc = measure.run_launcher(os.path.join(gen, res.plan.name, "rankprobe.sh"), env, log, timeout)
    result = read_result(out) if os.path.exists(out) else None
    return report(probe, result, rc=rc, log=log, recipe=recipe)


def report(probe: dict[str, Any], result: dict[str, Any] | None, rc: int | None = None, log: str | None = None,
           recipe: str | None = None) -> dict[str, Any]:
    """What ``mocompile rankprobe`` prints (``--format json``) and judges its exit code by."""
    gpu = result.get("gpu_memory_gib") if result else None
    rank = int(result["rank"]) if result else probe["rank"]
    why = probe["rank_why"] if rank == probe["rank"] else \
        (f"chosen by the caller: stage {stage_of(probe, rank) + 1} of {probe['stages']}; the estimate's own pick "
         f"is rank {probe['rank']}")
    rep: dict[str, Any] = {"recipe": recipe, "rank": rank,
                           "world_size": probe["world_size"], "rank_why": why,
                           "findings": findings(probe, gpu, rank), "estimate": probe["estimate"],
                           "model_compute_s": probe["model_compute_s"], "rc": rc, "log": log,
                           "device_name": result.get("device_name") if result else None,
                           "error": result.get("error") if result else (None if rc in (None, 0) else
                                                                         f"rankprobe.sh exited {rc} without a result"),
                           "replaced_at_run_time": result.get("replaced_at_run_time", []) if result else [],
                           "summary": summary(result) if result and result["iterations"] else None}
    if result and result.get("rank") != probe["rank"]:
        rep["note"] = (f"rank {result['rank']} is not the rank the estimate describes ({probe['rank']}, stage "
                       f"{probe['stage']}): the estimate is of the most-loaded rank")
    return rep


def text(rep: dict[str, Any]) -> str:
    """The report as a reader checks it: the rank, what was replaced, the measured peak beside the estimate."""
    lines = [f"rank probe: rank {rep['rank']} of {rep['world_size']} ({rep['rank_why']})"]
    if rep.get("device_name"):
        lines[0] += f" on {rep['device_name']}"
    for f in rep["findings"] + rep["replaced_at_run_time"]:
        what = f.get("message") or f"{f['field']}: {f['plan']} -> {f['probe']} for the probe"
        lines.append(f"  {f['rule']}: {what}")
    est = rep["estimate"]
    s = rep["summary"]
    if s:
        err = f"{s['error']:+.1%}" if s["error"] is not None else "n/a"
        verdict = "within" if s["within_tolerance"] else "outside"
        lines += [f"  measured peak allocated {s['measured_allocated_gib']:.2f} GiB, reserved "
                  f"{s['measured_reserved_gib']:.2f} GiB over {s['iterations_run']} iteration(s)",
                  f"  estimate (probed configuration) {s['estimate_gib']:.2f} GiB: {err}, {verdict} "
                  f"+-{TOLERANCE:.0%}; the plan's own estimate {est['plan']['estimate_gib']:.2f} GiB allocated, "
                  f"{est['plan']['total_gib']:.2f} GiB with buffers",
                  f"  iteration {s['iteration_ms']} ms ({s['iteration_plan_scaled_s']} s scaled to the plan's "
                  f"micro-batches; the step-time model's compute {s['model_compute_s']} s)"]
    if rep.get("error"):
        lines.append(f"  error: {rep['error']}")
    if rep.get("note"):
        lines.append(f"  note: {rep['note']}")
    if rep.get("log"):
        lines.append(f"  log: {rep['log']}")
    return "\n".join(lines)
