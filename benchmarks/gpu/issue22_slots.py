"""Run generated launchers on a 4-GPU host as two 2-GPU slots at once (issue 22's grid).

Why: a mid-model run on the lent hosts costs 75-110 s, most of it start-up (imports, NCCL, the
first iteration's compilation), so 3 interleaved repeats of 8 plans do not fit one session's device
time one run at a time. Two 2-GPU jobs run side by side on disjoint GPUs (0,1 and 2,3) and disjoint
CPU halves; a 4-GPU job waits for both slots. Every run records its slot and the jobs that overlapped
it in time, so the report can test whether the neighbour moved the step time.

Usage (on the host; JOBS is a JSON list of {"tag", "gen", "gpus": 2|4, "group"?}):
    python3 issue22_slots.py JOBS.json --work W --deadline EPOCH_S [--done DIR ...] [--timeout S]
A job whose metrics already exist in W or in a --done folder is skipped (a later call resumes).
Jobs of one non-empty "group" never run at the same time (HybridEP JIT-compiles its kernels into one
cache on first use). A job with "needs" (a file path) waits until that file exists and runs only if it
reads "rc=0" (DeepEP building beside the first runs: the alltoall jobs go first, the flex ones when the
wheel is in); otherwise it is dropped with the file's words. No job starts after --deadline.
Per job, W gets <tag>.jsonl (the generated train.py's MOCOMPILE_METRICS rows), <tag>-rank<N>.json
(benchsite/sitecustomize.py), <tag>.log.gz and a line in runs.jsonl: rc, wall, slot, GPUs, start/end, the tags that overlapped it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCHSITE = Path(__file__).resolve().parent / "benchsite"  # beside this file (the driver runs a frozen copy)


@dataclass
class Slot:
    """A set of GPUs and the CPUs their ranks are pinned to."""

    name: str
    gpus: str
    cpus: list[int]
    job: Running | None = None


@dataclass
class Running:
    tag: str
    gen: Path
    group: str
    slots: list[Slot]
    proc: subprocess.Popen
    start: float
    run_dir: Path
    overlapped: set[str] = field(default_factory=set)


def _free_port() -> int:
    """A port torchrun's store can listen on, below Linux's ephemeral range (32768-60999): a random port
    inside that range collided with a neighbour job's NCCL socket once (EADDRINUSE, time-hybridep-on-r3)."""
    for _ in range(100):
        port = 20000 + random.randrange(12000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-31999")


def _done(tag: str, work: Path, done_dirs: list[Path]) -> bool:
    return any((d / f"{tag}.jsonl").is_file() and (d / f"{tag}.jsonl").stat().st_size > 0
               for d in [work, *done_dirs])


def _ready(job: dict) -> bool | None:
    """True: may start; None: still waiting for its "needs" file; False: that file says it cannot run."""
    needs = job.get("needs")
    if not needs:
        return True
    path = Path(needs)
    if not path.is_file():
        return None
    return path.read_text().strip() == "rc=0"


def _start(job: dict, slots: list[Slot], work: Path, timeout: int, running: list[Running]) -> Running:
    tag, gen = job["tag"], Path(job["gen"]).resolve()
    run_dir = Path("/tmp/i22/runs") / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "rankstats").mkdir(parents=True)
    cpus = [c for s in slots for c in s.cpus]
    env = dict(os.environ)
    env.update({
        "CUDA_VISIBLE_DEVICES": ",".join(s.gpus for s in slots),
        "MASTER_PORT": str(_free_port()),
        "PYTHONPATH": f"{BENCHSITE}:{env.get('PYTHONPATH', '')}",
        "MOCOMPILE_BENCH_RANKSTATS": str(run_dir / "rankstats"),
        "MOCOMPILE_BENCH_AFFINITY": "1",
        "MOCOMPILE_METRICS": str(run_dir / "metrics.jsonl"),
    })
    log = open(run_dir / "log.txt", "wb")  # noqa: SIM115 - closed when the job is reaped
    proc = subprocess.Popen(
        ["timeout", str(timeout), "bash", str(gen / "torchrun.sh")], cwd=run_dir, env=env,
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    log.close()
    run = Running(tag, gen, job.get("group", ""), slots, proc, time.time(), run_dir)
    for other in running:
        other.overlapped.add(tag)
        run.overlapped.add(other.tag)
    for s in slots:
        s.job = run
    print(f"issue22: start {tag} on GPUs {env['CUDA_VISIBLE_DEVICES']} at {time.strftime('%H:%M:%S')}", flush=True)
    return run


def _reap(run: Running, rc: int, work: Path) -> None:
    end = time.time()
    metrics = run.run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    if rc == 0 and rows:
        shutil.copy(metrics, work / f"{run.tag}.jsonl")
    for f in sorted((run.run_dir / "rankstats").glob("rank*.json")):
        shutil.copy(f, work / f"{run.tag}-{f.name}")
    with open(run.run_dir / "log.txt", "rb") as src, gzip.open(work / f"{run.tag}.log.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    ms = [r["step_ms"] for r in rows if r.get("iteration", 0) > 5]
    peak = max((json.loads(f.read_text()).get("max_memory_allocated", 0)
                for f in (run.run_dir / "rankstats").glob("rank*.json")), default=0)
    record = {
        "tag": run.tag, "rc": rc, "wall_s": round(end - run.start, 1), "start": run.start, "end": end,
        "slot": "+".join(s.name for s in run.slots), "gpus": ",".join(s.gpus for s in run.slots),
        "overlapped": sorted(run.overlapped), "steps": len(rows),
        "median_step_ms": round(statistics.median(ms), 1) if ms else None,
        "last_loss": rows[-1].get("loss") if rows else None,
        "peak_allocated_gib": round(peak / 2**30, 2),
    }
    with open(work / "runs.jsonl", "a") as out:
        out.write(json.dumps(record) + "\n")
    print(f"issue22: {run.tag} rc={rc} wall={record['wall_s']} s slot={record['slot']} steps={len(rows)} "
          f"median(6-)={record['median_step_ms']} ms loss={record['last_loss']} peak={record['peak_allocated_gib']} GiB "
          f"beside={','.join(record['overlapped']) or '-'}", flush=True)
    if rc != 0:
        tail = (run.run_dir / "log.txt").read_text(errors="replace").splitlines()
        print("\n".join([line for line in tail if "Warning" not in line][-20:]), flush=True)
    for s in run.slots:
        s.job = None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jobs", type=Path)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--deadline", type=float, required=True, help="epoch seconds: no job starts later")
    ap.add_argument("--done", type=Path, action="append", default=[])
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--slots", type=int, choices=(1, 2), default=2,
                    help="2-GPU slots on this host: 2 on a 4-GPU host, 1 on a 2-GPU host (4-GPU jobs are dropped)")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    slots = [Slot("A", "0,1", cpus[:half]), Slot("B", "2,3", cpus[half:])][:args.slots]
    queue = [j for j in json.loads(args.jobs.read_text()) if not _done(j["tag"], args.work, args.done)]
    if args.slots == 1:
        print(f"issue22: one slot: 4-GPU jobs dropped: {[j['tag'] for j in queue if j['gpus'] == 4]}", flush=True)
        queue = [j for j in queue if j["gpus"] == 2]
    print(f"issue22: {len(queue)} jobs to run, deadline in {args.deadline - time.time():.0f} s", flush=True)
    running: list[Running] = []
    while queue or running:
        for run in list(running):
            rc = run.proc.poll()
            if rc is not None:
                running.remove(run)
                _reap(run, rc, args.work)
        if time.time() > args.deadline:
            if queue:
                print(f"issue22: deadline: not started {[j['tag'] for j in queue]}", flush=True)
                queue = []
        elif queue:
            for job in [j for j in queue if _ready(j) is False]:
                queue.remove(job)
                print(f"issue22: {job['tag']} dropped: {job['needs']} says "
                      f"{Path(job['needs']).read_text().strip()!r}", flush=True)
            if not queue:
                continue
            job = queue[0]
            free = [s for s in slots if s.job is None]
            busy_groups = {r.group for r in running if r.group}
            if job["gpus"] == 4:
                if len(free) == 2 and _ready(job):  # a 4-GPU job waits at the head of the queue for both slots
                    running.append(_start(queue.pop(0), free, args.work, args.timeout, running))
            elif free:
                pick = next((j for j in queue if j["gpus"] == 2 and _ready(j)
                             and not (j.get("group") and j["group"] in busy_groups)), None)
                # never jump over a waiting 4-GPU job: it would starve
                if pick is not None and queue.index(pick) < next(
                        (i for i, j in enumerate(queue) if j["gpus"] == 4), len(queue)):
                    queue.remove(pick)
                    running.append(_start(pick, [free[0]], args.work, args.timeout, running))
                    continue
        time.sleep(1)
    print("issue22: slots done", flush=True)
    (args.work / "slots.done").write_text(time.strftime("%H:%M:%S\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
