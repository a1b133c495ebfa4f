"""Issue 20's grid on one host: the mid TE model's plans, each compiled with the probed cluster profile, run
round-robin through their generated torchrun launchers until every plan has ``--rounds`` runs or the call's
deadline comes (a run is started only if it can end before it). The state lives in /tmp/grid so that the next
call on the same (warm) machine goes on where this one stopped; every run records the machine it ran on, so
runs of two machines are never compared.

After the first run of the traced plan ``A`` (the auto plan), ``mocompile diagnose`` reads it, and the change it
ranks first is compiled and joins the grid unless it is a plan already there (same plan, same micro-batch).

Usage (repo root on the host, after ``issue20.sh setup probe``):
    python3 benchmarks/gpu/issue20_grid.py --out OUT --deadline 560 --profile clusters/X.yaml
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time

RECIPES = "recipes/bench/bench-te-mid-{}.yaml"
ITERS = 24                      # steps 6-19 timed; the traced plan records 20-22
TRACE = ["profile.start=20", "profile.end=23"]
WINDOW = range(6, 20)
STATE = "/tmp/grid/state.json"
GEN = "/tmp/grid/generated"  # outside the repo copy, which the next call replaces


def mc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mocompile", *args], capture_output=True, text=True)


def machine() -> str:
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
                          capture_output=True, text=True).stdout.strip()
    return f"{socket.gethostname()}/{uuid[-8:]}"


def compile_plan(pid: str, recipe: str, sets: list[str], profile: str, traced: bool) -> dict:
    base = [f"hardware.cluster=../../{profile}", f"training.train_iters={ITERS}", f"name=grid-{pid}"]
    base += TRACE if traced else ["profile=null"]
    args = ["compile", recipe, "-o", GEN, "--force"]
    for s in base + sets:
        args += ["--set", s]
    r = mc(*args)
    lock = f"{GEN}/grid-{pid}/mocompile.lock.json"
    if r.returncode or not os.path.exists(lock):
        raise SystemExit(f"compile {pid} failed: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    with open(lock) as fh:
        data = json.load(fh)
    settings = data["settings"]
    return {"id": pid, "recipe": recipe, "sets": sets, "traced": traced, "gen": f"{GEN}/grid-{pid}",
            "plan": ((data.get("estimate") or {}).get("chosen") or {}).get("plan"),
            "mbs": settings["micro_batch_size"]["value"], "predicted_s": settings["step_time_estimate_s"]["value"]}


def run(plan: dict, n: int, out: str) -> dict:
    d = f"/tmp/grid/{plan['id']}-{n}"
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, MOCOMPILE_METRICS=f"{d}/metrics.jsonl", MASTER_PORT=str(29500 + (os.getpid() + n) % 400))
    t = time.time()
    with open(f"{d}/log.txt", "w") as log:
        rc = subprocess.run(["timeout", "300", "bash", os.path.abspath(f"{plan['gen']}/torchrun.sh")], cwd=d,
                            stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.time() - t
    rows = []
    if os.path.exists(f"{d}/metrics.jsonl"):
        rows = [json.loads(line) for line in open(f"{d}/metrics.jsonl") if line.strip()]
    ms = [r["step_ms"] for r in rows if r["iteration"] in WINDOW]
    os.makedirs(f"{out}/grid", exist_ok=True)
    if rows:
        with open(f"{out}/grid/{plan['id']}-{n}.jsonl", "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    peak = max((r.get("max_memory_allocated") or 0 for r in rows), default=0) / 2**30
    return {"n": n, "rc": rc, "median_ms": round(statistics.median(ms), 1) if ms else None, "steps": len(ms),
            "wall_s": round(wall, 1), "machine": machine(), "peak_gib": round(peak, 2), "dir": d}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--deadline", type=float, required=True, help="seconds from now after which no run may end")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs("/tmp/grid", exist_ok=True)
    if os.path.exists(STATE):
        state = json.load(open(STATE))
    else:
        plans = [("A", "auto", [], True), ("B", "ep4-on", [], False), ("C", "ep4-on-wgrad", [], False),
                 ("D", "ep4-on-graphs", [], False), ("E", "auto", ["training.micro_batch_size=4"], False),
                 ("F", "auto", ["training.micro_batch_size=auto"], False)]
        state = {"plans": {}, "runs": {}, "diagnosed": False}
        for pid, r, sets, traced in plans:
            state["plans"][pid] = compile_plan(pid, RECIPES.format(r), sets, a.profile, traced)
            print("compiled", json.dumps(state["plans"][pid]), flush=True)
        json.dump(state, open(STATE, "w"), indent=1)
    while True:
        order = list(state["plans"])
        todo = [p for p in order if len(state["runs"].get(p, [])) < a.rounds]
        if not todo:
            break
        pid = min(todo, key=lambda p: (len(state["runs"].get(p, [])), order.index(p)))
        walls = [r["wall_s"] for rs in state["runs"].values() for r in rs]
        need = max(walls, default=95) + 10
        if time.time() - t0 + need > a.deadline:
            print(f"grid: deadline: next {pid} needs ~{need:.0f} s, {a.deadline - (time.time() - t0):.0f} s left")
            break
        n = len(state["runs"].get(pid, [])) + 1
        res = run(state["plans"][pid], n, a.out)
        state["runs"].setdefault(pid, []).append(res)
        json.dump(state, open(STATE, "w"), indent=1)
        print(f"grid: {pid} run {n}: {json.dumps(res)} at {time.time() - t0:.0f} s", flush=True)
        if pid == "A" and not state["diagnosed"] and res["median_ms"]:
            state["diagnosed"] = True
            plan = state["plans"]["A"]
            dargs = ["diagnose", res["dir"], "--lock", f"{plan['gen']}/mocompile.lock.json",
                     "--recipe", plan["recipe"], "--set", f"hardware.cluster=../../{a.profile}"]
            d = mc(*dargs, "--format", "json")
            open(f"{a.out}/diagnose-A-1.json", "w").write(d.stdout + d.stderr)
            print(mc(*dargs, "--no-color").stdout, flush=True)
            traces = sorted(glob.glob(f"{res['dir']}/**/rank-0*.json*", recursive=True))
            if traces:  # the same trace through the harness's reader, to compare with diagnose's breakdown
                rep = subprocess.run([sys.executable, "benchmarks/gpu/trace_report.py", traces[0]],
                                     capture_output=True, text=True)
                open(f"{a.out}/trace-A-1-report.txt", "w").write(rep.stdout + rep.stderr)
                print(rep.stdout[-3000:], flush=True)
                if os.path.getsize(traces[0]) < 15 * 2**20:
                    shutil.copy(traces[0], f"{a.out}/trace-A-1" + (".json.gz" if traces[0].endswith(".gz") else ".json"))
            try:
                change = json.loads(d.stdout).get("set_line") or ""
            except ValueError:
                change = ""
            sets = [w for w in shlex.split(change) if w != "--set"]
            if sets:
                g = compile_plan("G", plan["recipe"], sets, a.profile, False)
                same = [p for p, q in state["plans"].items() if (q["plan"], q["mbs"]) == (g["plan"], g["mbs"])]
                g["same_as"] = same[0] if same else None
                print("diagnose change:", change, "->", json.dumps(g), flush=True)
                if not same:
                    state["plans"]["G"] = g
            json.dump(state, open(STATE, "w"), indent=1)
    json.dump(state, open(f"{a.out}/grid-state.json", "w"), indent=1)
    for pid, q in state["plans"].items():
        ms = [r["median_ms"] for r in state["runs"].get(pid, []) if r["median_ms"]]
        print(f"{pid} {q['plan']} mbs={q['mbs']} predicted={q['predicted_s']} runs={ms}"
              f" median={statistics.median(ms) if ms else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
