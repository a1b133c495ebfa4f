"""Run a generated launcher on the user's own nodes and read back its step times.

``probe`` and ``tune`` measure plans, and both go through the files ``compile`` writes: the
torchrun launcher (preflight included) runs ``train.py``, whose MOCOMPILE_METRICS callback writes one
JSON line per step. So what is measured is exactly what the user would run, and mocompile itself
never imports torch or Megatron.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WARMUP_STEPS = 5  # the first steps build kernels, graphs and allocator pools: not the steady state


def timed_step_s(chosen: dict[str, Any]) -> float:
    """The predicted step as the launchers' step probe times it (train_step alone): the plan's step time less
    Bridge's scheduled garbage collection, which runs between steps (``train_step_s``; older locks lack it)."""
    return float(chosen.get("train_step_s", chosen["step_time_s"]))


@dataclass
class Outcome:
    """One launcher run: its exit code, the steady steps' times (ms) and where its log is."""

    rc: int
    step_ms: list[float]
    log: str

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.step_ms) if self.step_ms else None


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The metrics lines of a run (rows without a numeric ``step_ms`` are skipped; a torn last line too)."""
    rows: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step_ms"), (int, float)) \
                        and not isinstance(row.get("step_ms"), bool):
                    rows.append(row)
    except FileNotFoundError:
        pass
    return rows


def steady_rows(rows: list[dict[str, Any]], warmup: int = WARMUP_STEPS,
                skip: set[int] | None = None) -> list[dict[str, Any]]:
    """The metrics rows after the warm-up, leaving out the iterations in ``skip`` (e.g. profiled ones)."""
    skip = skip or set()
    return [r for r in rows
            if int(r.get("iteration", 0) or 0) > warmup and int(r.get("iteration", 0) or 0) not in skip]


def steady_ms(rows: list[dict[str, Any]], warmup: int = WARMUP_STEPS, skip: set[int] | None = None) -> list[float]:
    """Step times after the warm-up, leaving out the iterations in ``skip`` (e.g. profiled ones)."""
    return [float(r["step_ms"]) for r in steady_rows(rows, warmup, skip)]


def solve_rising(target: float, predict: Callable[[float], float], bounds: tuple[float, float],
                 steps: int = 40) -> tuple[float, str]:
    """The value in ``bounds`` at which a prediction that rises with it meets a measured ``target``, by bisection
    on its logarithm (how ``probe`` fits a host factor and ``tune`` an overlap factor). At or beyond a bound the
    bound is returned with ``"lowest"`` or ``"highest"``, for the caller to say so; else ``""``."""
    lo, hi = bounds
    if target <= predict(lo):
        return lo, "lowest"
    if target >= predict(hi):
        return hi, "highest"
    a, b = math.log(lo), math.log(hi)
    for _ in range(steps):
        mid = (a + b) / 2
        if predict(math.exp(mid)) < target:
            a = mid
        else:
            b = mid
    return round(math.exp((a + b) / 2), 3), ""


def spread(values: list[float]) -> float:
    """(max - min) / median: what ``explain`` and the profile report as a run-to-run spread."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Launcher = Callable[[str, dict[str, str], str, float], int]


def run_launcher(script: str, env: dict[str, str], log: str, timeout: float) -> int:
    """``bash script`` with ``env`` on top of this process's environment, output to ``log``; the exit code
    (124 when it ran past ``timeout``)."""
    with open(log, "w", encoding="utf-8") as fh:
        try:
            proc = subprocess.run(["bash", script], env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            return 124
    return proc.returncode


def slurm_launcher(sbatch_args: list[str] | None = None, poll: float = 1.0) -> Launcher:
    """A launcher that submits the generated ``slurm.sbatch`` beside ``script`` (the same plan's batch script,
    preflight included) with ``env`` exported, waits for the job (``scontrol show job``) and returns its exit
    code; the job's output goes to ``log``. Run it from a login node of the cluster, in a project folder the
    compute nodes see (the metrics file is written there). ``sbatch_args``: more sbatch options (partition,
    account, nodelist...). Past ``timeout`` the job is cancelled and 124 returned."""
    extra = list(sbatch_args or [])

    def launch(script: str, env: dict[str, str], log: str, timeout: float) -> int:
        def fail(text: str, rc: int) -> int:
            with open(log, "w", encoding="utf-8") as fh:
                fh.write(text)
            return rc

        batch = os.path.join(os.path.dirname(script), "slurm.sbatch")
        if not os.path.isfile(batch):
            return fail(f"{batch}: no Slurm batch script (the plan's launch.targets lacks slurm)\n", 2)
        bad = [k for k, v in env.items() if "," in v or "=" in k]
        if bad:  # sbatch --export splits on commas
            return fail(f"cannot export {bad} through sbatch --export (a comma in the value)\n", 2)
        export = "--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items())
        try:
            sub = subprocess.run(["sbatch", "--parsable", export, f"--output={os.path.abspath(log)}", *extra, batch],
                                 capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return fail(f"sbatch did not run: {exc}\n", 127)
        if sub.returncode != 0:
            return fail(sub.stdout + sub.stderr, sub.returncode)
        job = sub.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout
        while True:
            info = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
            m = re.search(r"JobState=(\S+).*?ExitCode=(\d+):(\d+)", info)
            if m and m.group(1) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING",
                                        "SUSPENDED"):
                return 0 if m.group(1) == "COMPLETED" else int(m.group(2)) or 1
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job], capture_output=True)
                return 124
            if not info.strip():  # purged from slurmctld's memory before it was seen to end: its exit code is lost
                return 1
            time.sleep(poll)

    return launch


def measure(gen_dir: str, work: str, tag: str, timeout: float = 900.0, launcher: Launcher = run_launcher,
            warmup: int = WARMUP_STEPS, skip: set[int] | None = None) -> Outcome:
    """Run ``gen_dir/torchrun.sh`` once with MOCOMPILE_METRICS; ``tag`` names its metrics and log files."""
    os.makedirs(work, exist_ok=True)
    metrics, log = os.path.join(work, f"{tag}.jsonl"), os.path.join(work, f"{tag}.log")
    if os.path.exists(metrics):
        os.remove(metrics)  # a rerun after an interruption starts its metrics afresh
    rc = launcher(os.path.join(gen_dir, "torchrun.sh"),
                  {"MOCOMPILE_METRICS": os.path.abspath(metrics), "MASTER_PORT": str(free_port())}, log, timeout)
    return Outcome(rc, steady_ms(read_metrics(metrics), warmup, skip), log)


class Progress:
    """A one-line progress bar on stderr when it is a terminal, plain lines otherwise (CI logs)."""

    def __init__(self, total: int, what: str, quiet: bool = False):
        self.total, self.what, self.done, self.quiet = max(total, 1), what, 0, quiet
        self.tty = sys.stderr.isatty()

    def step(self, message: str) -> None:
        if self.quiet:
            return
        bar = "#" * (20 * self.done // self.total)
        line = f"{self.what} [{bar:<20}] {self.done}/{self.total} {message}"
        if self.tty:
            print("\r" + line[:120].ljust(120), end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def advance(self, message: str) -> None:
        self.done += 1
        self.step(message)

    def close(self) -> None:
        if self.tty and not self.quiet:
            print(file=sys.stderr)


def write_json_atomic(path: str, data: Any) -> None:
    """``data`` as JSON, written atomically (a resumed ``tune`` reads its state whole)."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def write_text_atomic(path: str, text: str) -> None:
    """Write beside ``path``, flush to disk, rename into place: a reader sees the old or the new file whole,
    and an error propagates (unlike the caches' writer in datafiles.py, this is the user's data)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
