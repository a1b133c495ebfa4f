"""Keep a fixed random sample of a cosmic-ray session's pending mutants; mark the rest not run.

    python benchmarks/mutation/sample.py SESSION.sqlite SIZE [--seed 13]

Run after `cosmic-ray init` and `cr-filter-operators`, before `cosmic-ray exec`. The pending mutants
(those no filter skipped) are ordered by where they are and what they do (module, position,
operator, occurrence: not by cosmic-ray's random job ids), then `random.Random(seed).sample` keeps
SIZE of them; the others get worker outcome SKIPPED with output "not sampled ..." (report.py counts
them apart from the filtered ones). The same commit, seed and size always give the same sample.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("session")
    parser.add_argument("size", type=int)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    db = sqlite3.connect(args.session)
    pending = db.execute(
        "select s.module_path, s.start_pos_row, s.start_pos_col, s.end_pos_row, s.end_pos_col, s.operator_name, "
        "s.occurrence, s.job_id from mutation_specs s left join work_results r on r.job_id = s.job_id "
        "where r.job_id is null").fetchall()
    pending.sort(key=lambda row: row[:7])
    if args.size >= len(pending):
        print(f"{args.session}: all {len(pending)} pending mutants kept")
        return 0
    keep = {row[7] for row in random.Random(args.seed).sample(pending, args.size)}
    note = f"not sampled (seed {args.seed}, {args.size} of {len(pending)})"
    db.executemany("insert into work_results (worker_outcome, output, test_outcome, diff, job_id) "
                   "values ('SKIPPED', ?, NULL, NULL, ?)",
                   [(note, row[7]) for row in pending if row[7] not in keep])
    db.commit()
    print(f"{args.session}: kept {args.size} of {len(pending)} pending mutants (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
