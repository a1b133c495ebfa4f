"""Turn cosmic-ray sessions into docs/mutation.md: score per module and every survivor with its reason.

    python benchmarks/mutation/report.py --commit abc123 SESSION.sqlite... > docs/mutation.md

A survivor is keyed by its module and the mutated line before and after (stable when code moves);
benchmarks/mutation/equivalent.yaml gives the one-line reason each known survivor is harmless, or
names the test still to write. Survivors without an entry are listed as "no reason yet".
"""

from __future__ import annotations

import argparse
import collections
import sqlite3
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _changed(diff: str) -> tuple[str, str]:
    minus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return " / ".join(minus), " / ".join(plus)


def key(module: str, before: str, after: str) -> str:
    return f"{Path(module).name}: {before} -> {after}"


def reasons() -> dict[str, str]:
    path = HERE / "equivalent.yaml"
    if not path.exists():
        return {}
    from ruamel.yaml import YAML
    return dict(YAML(typ="safe").load(path.read_text()) or {})


def rows(session: str) -> list[tuple]:
    db = sqlite3.connect(session)
    return db.execute(
        "select s.module_path, s.operator_name, s.start_pos_row, s.start_pos_col, r.worker_outcome, r.test_outcome, "
        "r.diff, r.output from mutation_specs s left join work_results r on r.job_id = s.job_id").fetchall()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="?")
    parser.add_argument("--named", help="output of named_survivors.py, quoted in the report")
    parser.add_argument("--notes", help="a Markdown file appended as the report's last section")
    parser.add_argument("--planner", action="store_true",
                        help="the planner run (run_planner.sh): its scope, tests and sample in the header")
    parser.add_argument("--modules", action="store_true",
                        help="the input and emission run (run_modules.sh): its scope and tests in the header")
    parser.add_argument("--head", help="the section's opening paragraph (what was run, with which tests)")
    parser.add_argument("sessions", nargs="+")
    args = parser.parse_args()
    known = reasons()
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    survivors = []
    for session in args.sessions:
        for module, op, row, col, worker, test, diff, output in rows(session):
            if worker == "SKIPPED" and (output or "").startswith("not sampled"):
                counts[module]["unsampled"] += 1
            elif worker == "SKIPPED":
                counts[module]["filtered"] += 1
            elif test is None:
                counts[module]["not run"] += 1
            else:
                counts[module][test.lower()] += 1
                if test == "KILLED" and (output or "").startswith("retested:"):
                    counts[module]["retested"] += 1
                if test == "SURVIVED":
                    before, after = _changed(diff or "")
                    survivors.append((module, row, col, op, before, after))
    if args.head:
        head = [args.head]
    elif args.modules:
        head = [f"cosmic-ray 8.7.0 over the loader, input limits, schema, model catalogue and emission at commit "
                f"`{args.commit}` (`benchmarks/mutation/run_modules.sh`), a fixed random sample per module (seed 13). "
                "Each session runs on a copy of the tree WITHOUT `generated/`: a test that compares with committed "
                "output fails on the unmutated copy and is deselected for every mutant, so no kill here is a "
                "golden-file kill. Tests per mutant: the input tests (`test_untrusted_input`, `test_inputs`, "
                "`test_limits`, `test_runaway_values`, `test_rules`, `test_training_io`; `test_editor_schema` too for "
                "`schema.py`, `test_resolve` for `catalogue.py`) or the emission tests (`test_untrusted_input`, "
                "`test_emit`, `test_kubernetes`, `test_training_io`, `test_cli`, `test_hostile_values`, "
                "`test_writes`). Score = killed / (killed + survived)."]
    elif args.planner:
        head = [f"cosmic-ray 8.7.0 over the planner at commit `{args.commit}` (`benchmarks/mutation/run_planner.sh`). "
                "Tests run per mutant: `tests/test_steptime.py` for `steptime.py`; `tests/test_resolve.py`, "
                "`tests/test_steptime.py` and `tests/test_plancache.py` for `resolve/search.py` and "
                "`resolve/decide.py`, plus `tests/test_lint_fast_paths.py` for `memory.py`. The one test among them "
                "that reads `generated/` (`test_the_planner_picks_a_measured_good_plan_for_the_te_grid`) is "
                "deselected, so no kill is a golden-file kill. Score = killed / (killed + survived)."]
    else:
        head = ["# Mutation testing report", "",
                f"cosmic-ray 8.7.0 over `rules/` and `layout.py` at commit `{args.commit}` "
                "(`benchmarks/mutation/run.sh`). Tests run per mutant: `tests/test_rule_boundaries.py` and "
                "`tests/test_rules.py`, which state the right values; neither compares with `generated/`, so no kill "
                "here is a golden-file kill. Score = killed / (killed + survived); incompetent mutants (the module "
                "no longer imports) are counted apart."]
    out = head + ["",
           "| module | mutants run | killed | survived | incompetent | timeout | not run | score |",
           "|---|---|---|---|---|---|---|---|"]
    total = collections.Counter()
    for module in sorted(counts):
        c = counts[module]
        total.update(c)
        run = c["killed"] + c["survived"] + c["incompetent"] + c["timeout"]
        score = c["killed"] / (c["killed"] + c["survived"]) if c["killed"] + c["survived"] else 0.0
        out.append(f"| `{module}` | {run} | {c['killed']} | {c['survived']} | {c['incompetent']} | {c['timeout']} "
                   f"| {c['not run']} | {score:.1%} |")
    run = total["killed"] + total["survived"] + total["incompetent"] + total["timeout"]
    score = total["killed"] / (total["killed"] + total["survived"]) if total["killed"] + total["survived"] else 0.0
    out.append(f"| all | {run} | {total['killed']} | {total['survived']} | {total['incompetent']} "
               f"| {total['timeout']} | {total['not run']} | {score:.1%} |")
    if total["unsampled"]:
        out += ["", f"{total['unsampled']} further mutants (after the operator filter) were left out of the fixed random "
                "sample (`benchmarks/mutation/sample.py`, seed 13) and are not counted above."]
    out += ["", f"{total['retested']} of the kills came from re-running that run's survivors against tests written "
            "after it (`benchmarks/mutation/retest_survivors.py`).",
            "", f"{total['filtered']} further mutants were filtered out before running, as classes of implausible "
            "slips: bit and power operators for arithmetic, value comparisons swapped with identity or membership "
            "tests, a removed decorator (`benchmarks/mutation/"
            f"{'cosmic-ray-planner.toml' if args.planner else 'cosmic-ray.toml'}`).", "",
            "## Survivors", "",
            "Each with the reason it is harmless (equivalent) or what would kill it, from "
            "`benchmarks/mutation/equivalent.yaml`.", ""]
    missing = 0
    for module, row, _col, op, before, after in sorted(survivors):
        why = known.get(key(module, before, after))
        missing += why is None
        out.append(f"- `{Path(module).name}:{row}` {op.split('/')[-1]}: "
                   f"`{before}` → `{after}`  \n  {why or '**no reason yet**'}")
    if not survivors:
        out.append("None.")
    if args.named:
        out += ["", "## The survivors issue 13 named", "",
                "`benchmarks/mutation/named_survivors.py` plants each bug the issue listed, one at a time, and runs "
                "the same tests:", "", "```", Path(args.named).read_text().rstrip(), "```"]
    if args.notes:
        out += ["", Path(args.notes).read_text().rstrip()]
    out.append("")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
