"""Issue 23 report: the rank probes of one or more device calls (benchmarks/gpu/issue23_rankprobe.sh) as a table.

    python3 benchmarks/gpu/rankprobe_report.py OUTDIR CALLDIR...

Each CALLDIR holds what a call left in $OUT (console.log, results.tar.gz, unpacked or not). Per recipe: the probed rank,
what was substituted, the measured peak allocated/reserved memory against the memory estimate of the probed
configuration (and the plan's own), the median iteration time (iterations 2..) scaled to the plan's micro-batches
beside the step-time model's compute term. A recipe that did not finish is listed with the last lines of its log.
Writes OUTDIR/rankprobe.json and OUTDIR/rankprobe.md.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "compiler"))

from mocompile import rankprobe  # noqa: E402


def _files(call: Path, scratch: Path) -> Path:
    """The call's files, its archive unpacked under ``scratch`` (the results folder stays as committed)."""
    tgz = call / "results.tar.gz"
    if not tgz.exists():
        return call
    out = scratch / call.name
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tf:
        tf.extractall(out, filter="data")
    return out


def _tail(log: Path, n: int = 3) -> str:
    if not log.exists():
        return ""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if "Error" in ln or "error" in ln]
    return " | ".join(ln.strip()[:300] for ln in lines[-n:])


def collect(calls: list[Path]) -> list[dict]:
    """One row per recipe and call (a recipe probed at several ranks or in several calls keeps every row); a recipe
    that never finished keeps one row with its error."""
    import tempfile

    rows: dict[tuple[str, str], dict] = {}
    scratch = Path(tempfile.mkdtemp(prefix="rankprobe-report-"))
    seen: set[bytes] = set()
    for call in calls:
        files = _files(call, scratch)
        for lock in sorted(files.glob("lock-*.json")):
            name = lock.stem[len("lock-"):]
            result = files / f"{name}.json"
            row = {"recipe": name, "call": call.name}
            if result.exists():
                raw = result.read_bytes()
                if raw in seen:  # a later call's archive may carry an earlier call's files
                    continue
                seen.add(raw)
                data = rankprobe.read_result(str(result))
                rep = rankprobe.report(data["spec"], data)
                row.update(rank=data["rank"], world_size=data["world_size"],
                           stage=rankprobe.stage_of(data["spec"], int(data["rank"])),
                           stages=data["spec"]["stages"], device=data["device_name"],
                           substitutions=[f"{s['rule']} {s['field']}: {s['plan']} -> {s['probe']}"
                                          for s in data["spec"]["substitutions"]] +
                           [f"{s['rule']} {s['field']}: {s['plan']} -> {s['probe']}" for s in data["replaced_at_run_time"]],
                           plan_estimate=data["spec"]["estimate"]["plan"], probe_estimate=data["spec"]["estimate"]["probe"],
                           before_first_step_gib=round(data["before_first_step"]["allocated"] / 2**30, 2)
                           if data.get("before_first_step") else None,
                           step_ms=[round(r["step_ms"], 1) for r in data["iterations"]],
                           summary=rep["summary"], error=data.get("error") or (None if data["iterations"] else _tail(
                               files / f"{name}.log")))
            else:
                row.update(error=_tail(files / f"{name}.log") or "no result written")
            rows[(name, call.name)] = row
    done = {name for (name, _), r in rows.items() if r.get("summary")}
    return [r for (name, _), r in rows.items() if r.get("summary") or name not in done]


def markdown(rows: list[dict]) -> str:
    head = ("| recipe | call | GPUs | rank (stage) | iterations | peak allocated GiB | peak reserved GiB | estimate GiB | error "
            "| plan estimate GiB (total) | iteration ms | scaled s | model compute s |\n"
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    out = []
    for r in rows:
        s = r.get("summary")
        if not s:
            out.append(f"| {r['recipe']} | {r['call']} | {r.get('world_size', '')} | {r.get('rank', '')} | 0 | - | - | "
                       f"{(r.get('probe_estimate') or {}).get('estimate_gib', '-')} | - | - | - | - | - |")
            continue
        out.append(f"| {r['recipe']} | {r['call']} | {r['world_size']} | {r['rank']} ({r['stage'] + 1}/{r['stages']}) | "
                   f"{s['iterations_run']} | {s['measured_allocated_gib']:.2f} | {s['measured_reserved_gib']:.2f} | "
                   f"{s['estimate_gib']:.2f} | {s['error']:+.1%} | {r['plan_estimate']['estimate_gib']:.2f} "
                   f"({r['plan_estimate']['total_gib']:.2f}) | {s['iteration_ms']} | {s['iteration_plan_scaled_s']} | "
                   f"{s['model_compute_s']} |")
    notes = [f"- **{r['recipe']}**: {r['error']}" for r in rows if r.get("error")]
    subs = [f"- {r['recipe']}: " + "; ".join(r["substitutions"]) for r in rows if r.get("substitutions")]
    return head + "\n".join(out) + "\n\nSubstitutions:\n\n" + "\n".join(subs) + \
        ("\n\nNot finished / errors:\n\n" + "\n".join(notes) if notes else "") + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    rows = collect([Path(a) for a in argv[1:]])
    (out / "rankprobe.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    (out / "rankprobe.md").write_text(markdown(rows), encoding="utf-8")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
