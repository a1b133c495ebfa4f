#!/usr/bin/env python3
"""Run the generated torchrun launchers of the GPU benchmark recipes and collect their metrics.

For every recipe folder ``generated/<prefix>*/`` that has a ``torchrun.sh``, the launcher is run
unmodified as ``bash generated/<dir>/torchrun.sh``, with ``MOCOMPILE_METRICS`` naming a JSONL file
that the generated train.py appends one line per step to (rank 0), over ``--repeats`` interleaved
rounds (the variant order rotates each round, so no variant always runs first or last). Results,
including every metrics row and a summary per variant, go to ``benchmarks/results/<host-tag>.json``;
full logs go to a folder (``--logs``) that ``run.sh`` packs next to the results.

Standard library only: it runs on the GPU host next to torch.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import trace_report  # beside this file (the script's folder is on sys.path), standard library only

REPO = Path(__file__).resolve().parents[2]
SCHEMA = 1

# Never let a launched job use NVLink multicast on the shared hosts (KINDS.md); the generated
# launchers export their own block on top of the inherited environment, so these stay set.
SAFETY_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONFAULTHANDLER": "1",  # a Python stack for native crashes (e.g. SIGSEGV in an extension)
}

# Process settings for every launched job (benchmarks/gpu/benchsite/sitecustomize.py): host-side
# jitter removal and per-rank memory. The launchers and train.py stay unmodified.
BENCHSITE = Path(__file__).resolve().parent / "benchsite"

# Canonical variant order (others follow alphabetically).
ORDER = ["overlap-off", "overlap-on", "overlap-wgrad"]


def _get(d: Any, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def read_lock(folder: Path) -> dict[str, Any]:
    """Read mocompile.lock.json defensively: a missing or odd file gives {}."""
    try:
        data = json.loads((folder / "mocompile.lock.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _setting(lock: dict[str, Any], key: str) -> Any:
    """A resolved setting from the lock; settings may be {key: value} or {key: {value: ...}}."""
    settings = lock.get("settings")
    if isinstance(settings, dict) and key in settings:
        value = settings[key]
        if isinstance(value, dict) and "value" in value:
            return value["value"]
        return value
    if isinstance(settings, list):
        for item in settings:
            if isinstance(item, dict) and item.get("key", item.get("field")) == key:
                return item.get("value")
    return None


def describe(folder: Path) -> dict[str, Any]:
    """Static facts about one generated variant (from its lock file, read defensively)."""
    lock = read_lock(folder)
    est = _get(lock, "memory", "estimate_gib")
    try:
        est = float(est) if est is not None else None
    except (TypeError, ValueError):
        est = None
    hw = lock.get("hardware") if isinstance(lock.get("hardware"), dict) else {}
    nodes = hw.get("nodes") or 1
    gpn = hw.get("gpus_per_node")
    gpus = None
    try:
        gpus = int(nodes) * int(gpn) if gpn else None
    except (TypeError, ValueError):
        gpus = None
    dispatcher = _setting(lock, "moe_token_dispatcher_type")
    backend = _setting(lock, "moe_flex_dispatcher_backend")
    return {
        "dir": str(folder.relative_to(REPO)) if folder.is_relative_to(REPO) else str(folder),
        "gpus": gpus,
        "gpus_per_node": gpn,
        "nodes": nodes,
        "ep": _setting(lock, "expert_model_parallel_size"),
        "tp": _setting(lock, "tensor_model_parallel_size"),
        "pp": _setting(lock, "pipeline_model_parallel_size"),
        "dispatcher": (f"flex/{backend}" if dispatcher == "flex" else dispatcher),
        "overlap": _setting(lock, "overlap_moe_expert_parallel_comm"),
        "delay_wgrad": _setting(lock, "delay_wgrad_compute"),
        "overlap_grad_reduce": _setting(lock, "overlap_grad_reduce"),
        "seq_length": _setting(lock, "seq_length"),
        "global_batch_size": _setting(lock, "global_batch_size"),
        "micro_batch_size": _setting(lock, "micro_batch_size"),
        "train_iters": _setting(lock, "train_iters"),
        "seed": _setting(lock, "seed"),
        "profile": ([_setting(lock, "profile_step_start"), _setting(lock, "profile_step_end")]
                    if _setting(lock, "use_pytorch_profiler") else None),
        "estimate_gib": est,
        "estimate": lock.get("memory") if isinstance(lock.get("memory"), dict) else None,
        "lock_found": bool(lock),
    }


def variant_key(name: str, prefix: str) -> tuple[int, str]:
    short = name[len(prefix):]
    for i, tail in enumerate(ORDER):
        if short.endswith(tail):
            return (i, short)
    return (len(ORDER), short)


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {"hostname": os.uname().nodename, "cpus": os.cpu_count()}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
        rows = [r.strip() for r in out.strip().splitlines() if r.strip()]
        info["gpus"] = rows
        info["gpu_count"] = len(rows)
        if rows:
            info["gpu_name"] = rows[0].split(",")[0].strip()
            info["driver"] = rows[0].split(",")[-1].strip()
    except (OSError, subprocess.SubprocessError):
        info["gpus"] = []
    py = os.environ.get("PYTHON", "python3")
    try:
        out = subprocess.run([py, "-c", "import torch, json; print(json.dumps([torch.__version__, "
                              "torch.version.cuda, str(torch.cuda.nccl.version())]))"],
                             capture_output=True, text=True, timeout=120).stdout.strip().splitlines()
        if out:
            info["torch"], info["cuda"], info["nccl"] = json.loads(out[-1])
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return info


def host_tag(info: dict[str, Any]) -> str:
    name = str(info.get("gpu_name", "gpu")).lower()
    m = re.search(r"(h100|h200|b200|b300|gb200|gb300|a100)", name)
    kind = m.group(1) if m else re.sub(r"[^a-z0-9]+", "", name)[:12] or "gpu"
    return f"{info.get('gpu_count', 0)}x{kind}-{_dt.date.today().isoformat()}"


ERROR_PATTERNS = [
    r"preflight: RUN\d+.*",
    r"mocompile: .*",
    r"\w*Error: .*",
    r".*SIGSEGV.*",
    r".*Signal \d+ \(\w+\) received.*",
    r".*exitcode\s*:\s*-?\d+.*",
    r"Segmentation fault.*",
    r"CUDA out of memory.*",
]


def error_excerpt(log_text: str, limit: int = 12) -> list[str]:
    """The lines that say why a run failed: tracebacks' last lines, preflight codes, signals."""
    lines = log_text.splitlines()
    picked: list[str] = []
    for i, line in enumerate(lines):
        if any(re.search(p, line) for p in ERROR_PATTERNS):
            # keep the 'File ..., line N' frame just above an exception line
            if re.match(r"\w*Error: ", line.strip()) and i >= 2 and lines[i - 2].strip().startswith("File "):
                picked.append(lines[i - 2].strip())
            picked.append(line.strip()[:400])
    seen: list[str] = []
    for line in picked:
        if line not in seen:
            seen.append(line)
    return seen[-limit:]


def profile_excluded(variant: dict[str, Any]) -> list[int] | None:
    """1-based iterations a profiled run must not time, from a variant's ``describe()``: the profiler's
    warm-up step (start - 1), the recorded steps, and the step that exports the trace (end). Bridge's
    schedule records steps start..end-1 as the metrics callback numbers them (prof.step() runs before each)."""
    info = variant.get("profile")
    if not info or info[0] is None or info[1] is None:
        return None
    return [max(1, int(info[0]) - 1), int(info[1])]


def collect_trace(name: str, repeat: int, traces: Path) -> dict[str, Any] | None:
    """Move the trace Bridge wrote (./torch_profile under the repo: no TensorBoard folder, PROF004)
    out of the repo, drop the empty ./None folder Bridge leaves, and summarize it (trace_report.py)."""
    src = REPO / "torch_profile"
    if not src.is_dir():
        return None
    dest = traces / f"{name}.r{repeat}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dest))
    try:
        (REPO / "None").rmdir()
    except OSError:
        pass
    out: dict[str, Any] = {"dir": str(dest)}
    for f in sorted(dest.glob("*.json*")):
        try:
            out[f.name] = trace_report.summarize(trace_report.load(f))
            out[f.name]["bytes"] = f.stat().st_size
        except (OSError, ValueError, EOFError) as exc:
            out[f.name] = {"error": str(exc)[:200]}
    return out


def run_once(name: str, folder: Path, repeat: int, port: int, logs: Path, timeout: int,
             nproc: int | None, harness_env: dict[str, str] | None = None,
             traces: Path | None = None, excluded: list[int] | None = None) -> dict[str, Any]:
    metrics = logs / f"{name}.r{repeat}.jsonl"
    log = logs / f"{name}.r{repeat}.log"
    rankstats = logs / f"{name}.r{repeat}.ranks"
    metrics.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(SAFETY_ENV)
    env.update(harness_env or {})
    if BENCHSITE.is_dir():
        env["PYTHONPATH"] = str(BENCHSITE) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["MOCOMPILE_BENCH_RANKSTATS"] = str(rankstats)
    env["MOCOMPILE_METRICS"] = str(metrics)
    env["MASTER_PORT"] = str(port)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("NNODES", "1")
    if nproc:
        env["NPROC_PER_NODE"] = str(nproc)
    cmd = ["bash", str(folder / "torchrun.sh")]
    start = time.time()
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"# {' '.join(cmd)}  repeat={repeat} MASTER_PORT={port} {time.strftime('%F %T')}\n")
        fh.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 15)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait()
                rc = 124
        except OSError as exc:
            fh.write(f"\nrun_bench: could not start: {exc}\n")
            rc = 127
    wall = time.time() - start
    rows = []
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    text = log.read_text(errors="replace")
    ranks = []
    if rankstats.is_dir():
        for f in sorted(rankstats.glob("rank*.json"), key=lambda f: int(re.sub(r"\D", "", f.stem) or 0)):
            try:
                ranks.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                pass
    result = {
        "variant": name, "repeat": repeat, "rc": rc, "wall_s": round(wall, 1), "log": log.name,
        "metrics": rows, "timed_out": rc == 124, "ranks": ranks,
        "started": round(start, 1),
    }
    if rc != 0:
        result["error"] = error_excerpt(text)
    if excluded:
        result["profile_excluded"] = excluded
    trace = collect_trace(name, repeat, traces or logs.parent / f"{logs.name}-traces")
    if trace:
        result["profile"] = trace
    # Bridge's own per-iteration log lines, as a cross-check of the callback timing.
    bridge = re.findall(r"iteration\s+(\d+)/\s*\d+ .*?elapsed time per iteration \(ms\): ([\d.]+)"
                        r"(?:.*?lm loss: ([\d.E+-]+))?", text)
    if bridge:
        result["bridge_log"] = [{"iteration": int(i), "elapsed_ms": float(ms),
                                 "lm_loss": float(loss) if loss else None} for i, ms, loss in bridge]
    return result


def _timed(run: dict[str, Any], rows: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """Rows that count for step time: after the warm-up steps, outside the profiler's window."""
    measured = rows[warmup:] if len(rows) > warmup + 2 else rows[len(rows) // 2:]
    lo, hi = run.get("profile_excluded") or (0, -1)
    return [r for r in measured if not lo <= int(r.get("iteration", 0)) <= hi]


def summarize_run(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    rows = [r for r in run.get("metrics", []) if isinstance(r, dict) and "step_ms" in r]
    if not rows:
        return {}
    rows.sort(key=lambda r: r.get("iteration", 0))
    steps = [float(r["step_ms"]) for r in _timed(run, rows, warmup)]
    last = rows[-1]
    # Loss: Bridge prints it on the last rank (print_rank_last), i.e. the last pipeline stage; the
    # rank-0 metrics row has no loss under PP > 1. Prefer the Bridge log line of the same iteration.
    bridge = {b["iteration"]: b for b in run.get("bridge_log", []) if b.get("lm_loss") is not None}
    last_it = last.get("iteration")
    loss = bridge[last_it]["lm_loss"] if last_it in bridge else last.get("loss")
    loss_source = "bridge log (last rank)" if last_it in bridge else "rank-0 metrics"
    ranks = [r for r in run.get("ranks", []) if r.get("max_memory_allocated")]
    alloc_r0 = max(float(r.get("max_memory_allocated", 0)) for r in rows) / 2**30
    resv_r0 = max(float(r.get("max_memory_reserved", 0)) for r in rows) / 2**30
    alloc_all = max([alloc_r0] + [r["max_memory_allocated"] / 2**30 for r in ranks])
    resv_all = max([resv_r0] + [r["max_memory_reserved"] / 2**30 for r in ranks])
    return {
        "iterations": len(rows),
        "first_iteration": rows[0].get("iteration"),
        "last_iteration": last.get("iteration"),
        "measured_steps": len(steps),
        "median_step_ms": statistics.median(steps),
        "mean_step_ms": statistics.fmean(steps),
        "stdev_step_ms": statistics.stdev(steps) if len(steps) > 1 else 0.0,
        "min_step_ms": min(steps),
        "max_step_ms": max(steps),
        "first_step_ms": float(rows[0]["step_ms"]),
        "cv_pct": (statistics.stdev(steps) / statistics.fmean(steps) * 100.0) if len(steps) > 1 else 0.0,
        "last_loss": loss,
        "loss_source": loss_source,
        "loss_curve": [bridge[i]["lm_loss"] for i in sorted(bridge)] or [r.get("loss") for r in rows],
        "peak_allocated_gib": alloc_all,
        "peak_reserved_gib": resv_all,
        "rank0_peak_allocated_gib": alloc_r0,
        "per_rank_peak_allocated_gib": [round(r["max_memory_allocated"] / 2**30, 3) for r in ranks],
        "per_rank_peak_reserved_gib": [round(r["max_memory_reserved"] / 2**30, 3) for r in ranks],
        "ranks_seen": len(ranks),
    }


def summarize_variant(info: dict[str, Any], runs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    for run in runs:
        run["summary"] = summarize_run(run, warmup)
    ok = [r for r in runs if r["rc"] == 0 and r.get("summary")]
    out: dict[str, Any] = {"runs_ok": len(ok), "runs_total": len(runs)}
    if not ok:
        return out
    medians = [r["summary"]["median_step_ms"] for r in ok]
    pooled = sorted(s for r in ok for s in _measured_steps(r, warmup))
    med = statistics.median(medians)
    out.update({
        "median_step_ms": med,
        "run_medians_ms": medians,
        "spread_min_ms": min(medians),
        "spread_max_ms": max(medians),
        "spread_pct": (max(medians) - min(medians)) / med * 100.0 if med else None,
        "pooled_p10_ms": _quantile(pooled, 0.10),
        "pooled_p90_ms": _quantile(pooled, 0.90),
        "peak_allocated_gib": max(r["summary"]["peak_allocated_gib"] for r in ok),
        "peak_reserved_gib": max(r["summary"]["peak_reserved_gib"] for r in ok),
        "last_losses": [r["summary"]["last_loss"] for r in ok],
        "last_iteration": ok[0]["summary"]["last_iteration"],
        "within_run_cv_pct": [round(r["summary"]["cv_pct"], 2) for r in ok],
        "per_rank_peak_allocated_gib": ok[0]["summary"]["per_rank_peak_allocated_gib"],
        "order_positions": [r.get("repeat") for r in ok],
    })
    losses = {r["summary"]["last_loss"] for r in ok}
    out["last_loss"] = ok[0]["summary"]["last_loss"] if len(losses) == 1 else None
    out["losses_identical_across_repeats"] = len(losses) == 1
    gbs, seq = info.get("global_batch_size"), info.get("seq_length")
    if gbs and seq and med:
        out["tokens_per_s"] = float(gbs) * float(seq) / (med / 1000.0)
    est = info.get("estimate_gib")
    if est is not None:
        out["estimate_error_pct"] = (est - out["peak_allocated_gib"]) / out["peak_allocated_gib"] * 100.0
    return out


def _measured_steps(run: dict[str, Any], warmup: int) -> list[float]:
    rows = sorted((r for r in run.get("metrics", []) if "step_ms" in r), key=lambda r: r.get("iteration", 0))
    return [float(r["step_ms"]) for r in _timed(run, rows, warmup)]


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generated", default=str(REPO / "generated"), help="folder of compiled recipes")
    ap.add_argument("--prefix", default="bench-", help="run recipe folders whose name starts with this")
    ap.add_argument("--only", default="", help="comma-separated folder names to run (default: all matches)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (at least 3 for a spread)")
    ap.add_argument("--first-round", type=int, default=0,
                    help="number of the first round (a later call on the same host continues the rotation)")
    ap.add_argument("--warmup", type=int, default=5, help="leading iterations left out of step statistics")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per launcher run")
    ap.add_argument("--deadline", type=float, default=0, help="stop starting runs after this many seconds")
    ap.add_argument("--nproc", type=int, default=0, help="NPROC_PER_NODE (default: the launcher's own)")
    ap.add_argument("--host-tag", default="", help="results file name (default: <n>x<gpu>-<date>)")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"), help="results folder")
    ap.add_argument("--logs", default="", help="log folder (default: /tmp/mocompile-bench-logs)")
    ap.add_argument("--extra", action="append", default=[], help="JSON file merged into 'extra' (repeatable)")
    ap.add_argument("--deepep-status", default="", help="JSON from run.sh: flex variants are skipped unless ok")
    ap.add_argument("--base-port", type=int, default=29500)
    ap.add_argument("--gc", choices=["off", "on"], default="off",
                    help="off: gc.disable() in every worker (benchsite/sitecustomize.py); on: Python default")
    ap.add_argument("--affinity", choices=["on", "off"], default="on",
                    help="on: each local rank pinned to its own share of the CPUs")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE added to every launched job (e.g. NCCL_P2P_DISABLE=1; recorded in the JSON)")
    args = ap.parse_args(argv)
    harness_env = {"MOCOMPILE_BENCH_GC": args.gc, "MOCOMPILE_BENCH_AFFINITY": "1" if args.affinity == "on" else "0"}
    for kv in args.env:
        k, _, v = kv.partition("=")
        harness_env[k] = v

    gen = Path(args.generated).resolve()
    folders = sorted((p for p in gen.glob(f"{args.prefix}*") if (p / "torchrun.sh").is_file()),
                     key=lambda p: variant_key(p.name, args.prefix))
    if args.only:
        wanted = {s.strip() for s in args.only.split(",") if s.strip()}
        missing = sorted(wanted - {p.name for p in folders})
        if missing:
            print(f"run_bench: requested variants have no torchrun.sh under {gen}: {', '.join(missing)}", file=sys.stderr)
            return 2
        folders = [p for p in folders if p.name in wanted]
    if not folders:
        print(f"run_bench: no {args.prefix}*/torchrun.sh under {gen}; compile recipes/bench/ first", file=sys.stderr)
        return 2
    info = host_info()
    tag = args.host_tag or host_tag(info)
    logs = Path(args.logs or f"/tmp/mocompile-bench-logs/{tag}")
    if logs.exists():
        for stale in logs.glob("*.r*.*"):
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink()
    logs.mkdir(parents=True, exist_ok=True)
    variants = {p.name: describe(p) for p in folders}
    runs: dict[str, list[dict[str, Any]]] = {p.name: [] for p in folders}
    failed_first: dict[str, str] = {}
    deepep: dict[str, Any] = {}
    if args.deepep_status:
        try:
            deepep = json.loads(Path(args.deepep_status).read_text())
        except (OSError, ValueError) as exc:
            deepep = {"ok": False, "status": "unknown", "reason": f"status file unreadable: {exc}"}
    for name, facts in variants.items():
        if str(facts.get("dispatcher") or "").startswith("flex/") and deepep and not deepep.get("ok"):
            reason = f"deep_ep not available on this host: {deepep.get('status')}: {deepep.get('reason')}"
            failed_first[name] = reason
            runs[name].append({"variant": name, "repeat": 0, "rc": None, "skipped": reason, "metrics": []})
            print(f"run_bench: skip {name}: {reason}", flush=True)
    order_log: list[str] = []
    t0 = time.time()
    port = args.base_port
    last_wall = 0.0
    for rnd in range(args.first_round, args.first_round + args.repeats):
        k = rnd % len(folders)
        rotation = folders[k:] + folders[:k]
        for folder in rotation:
            name = folder.name
            if name in failed_first:
                continue
            elapsed = time.time() - t0
            if args.deadline and elapsed + max(last_wall, 30.0) > args.deadline:
                runs[name].append({"variant": name, "repeat": rnd, "rc": None, "skipped": "time budget",
                                   "metrics": []})
                print(f"run_bench: skip {name} round {rnd}: time budget ({elapsed:.0f}s used)", flush=True)
                continue
            port += 1
            print(f"run_bench: round {rnd} {name} (port {port}) at {elapsed:.0f}s", flush=True)
            result = run_once(name, folder, rnd, port, logs, args.timeout, args.nproc or None, harness_env,
                              excluded=profile_excluded(variants[name]))
            last_wall = result["wall_s"]
            runs[name].append(result)
            order_log.append(f"{rnd}:{name}")
            s = summarize_run(result, args.warmup)
            msg = (f"median {s['median_step_ms']:.1f} ms, loss {s['last_loss']}, alloc {s['peak_allocated_gib']:.2f} GiB"
                   if s else "no metrics")
            print(f"run_bench:   rc={result['rc']} wall={result['wall_s']}s {msg}", flush=True)
            if result["rc"] != 0:
                for line in result.get("error", [])[-4:]:
                    print(f"run_bench:   | {line}", flush=True)
                if not any(r.get("rc") == 0 for r in runs[name]):
                    failed_first[name] = f"failed in round {rnd}; not repeated"
    summary = {name: summarize_variant(variants[name], runs[name], args.warmup) for name in variants}
    base = [n for n in variants if variant_key(n, args.prefix)[0] < len(ORDER)]
    base_losses = {n: summary[n].get("last_loss") for n in base if summary[n].get("runs_ok")}
    extra: dict[str, Any] = {}
    for path in args.extra:
        try:
            extra[Path(path).stem] = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            extra[Path(path).stem] = {"error": f"unreadable: {exc}"}
    doc = {
        "schema": SCHEMA,
        "host_tag": tag,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": info,
        "method": {
            "launcher": "bash generated/<dir>/torchrun.sh (unmodified)",
            "repeats": args.repeats,
            "interleaving": "round-robin, order rotated by one variant each round",
            "warmup_iterations_excluded": args.warmup,
            "step_time": "rank-0 host wall time between Bridge's on_train_step_start/end callbacks, "
                         "torch.cuda.synchronize() at both ends (generated train.py, MOCOMPILE_METRICS)",
            "variant_step_ms": "median of the per-run medians; spread = min..max of the per-run medians",
            "tokens_per_s": "global_batch_size * seq_length / median step time (whole job)",
            "memory": "torch.cuda.max_memory_allocated/reserved, peak over the run, max over every rank "
                      "(benchsite/sitecustomize.py samples each rank every 2 s and at exit)",
            "loss": "lm loss of the last iteration from Bridge's log line, printed by the last rank "
                    "(= last pipeline stage)",
            "safety_env": SAFETY_ENV,
            "harness_env": harness_env,
        },
        "order": order_log,
        "elapsed_s": round(time.time() - t0, 1),
        "variants": {n: {**variants[n], "summary": summary[n], "runs": runs[n]} for n in variants},
        "checks": {
            "alltoall_variant_last_losses": base_losses,
            "alltoall_losses_match": (len({v for v in base_losses.values()}) == 1
                                      if base_losses and None not in base_losses.values() else None),
        },
        "deepep": deepep or None,
        "extra": extra,
    }
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{tag}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"run_bench: wrote {out}")
    packed = results / "logs" / f"{tag}.tar.gz"
    packed.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(packed, "w:gz") as tar:
        for f in sorted(logs.glob("*")):
            tar.add(f, arcname=f"{tag}/{f.name}")
    print(f"run_bench: logs packed in {packed}")
    for n in variants:
        s = summary[n]
        if s.get("runs_ok"):
            print(f"  {n:32s} ok {s['runs_ok']}/{s['runs_total']}  median {s['median_step_ms']:.1f} ms "
                  f"[{s['spread_min_ms']:.1f}..{s['spread_max_ms']:.1f}]  loss {s['last_losses']}  "
                  f"alloc {s['peak_allocated_gib']:.2f} GiB  est {variants[n]['estimate_gib']}")
        else:
            errs = [r.get("error") or r.get("skipped") for r in runs[n]]
            print(f"  {n:32s} FAILED/skipped: {errs[:1]}")
    # A requested variant that could not run (skipped: dispatcher package missing; or every run
    # failed) makes the whole command fail, so a CI or a person cannot mistake it for a result.
    not_run = [n for n in variants if not summary[n].get("runs_ok")]
    if not_run:
        print(f"run_bench: FAILED: requested variant(s) did not run: {', '.join(not_run)}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
