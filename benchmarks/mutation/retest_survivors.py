"""Re-run the surviving mutants of cosmic-ray sessions against the tests as they are now.

    python benchmarks/mutation/retest_survivors.py [--add-tests TESTS] SESSION.sqlite...

A full run takes an hour; after tests are added for its survivors, this replays only those
(each stored diff applied with `patch` to a fresh snapshot of the committed tree, the session's
test command run, the diff reverted) and marks the newly killed ones KILLED in the session, with
"retested" in the output column so the report can say which kills came later. ``--add-tests``
appends test files to the session's test command (the tests written for the survivors live in
their own file, e.g. tests/test_planner_mutants.py).
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def snapshot(dest: Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD", "compiler", "tests", "recipes", "schemas", "pyproject.toml",
                              "README.md", "docs", "benchmarks", "clusters"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def _baseline_deselects(command: str) -> str:
    """``--deselect`` options for the tests that fail on an unmutated snapshot (they read generated/, which
    the snapshot lacks): such a test would otherwise kill every mutant."""
    with tempfile.TemporaryDirectory(prefix="mocompile-retest-base-") as tmp:
        snapshot(Path(tmp))
        proc = subprocess.run(command.replace(" -x ", " ") + " -rf", shell=True, cwd=tmp, capture_output=True,
                              text=True, timeout=1800)
    failing = sorted({ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("FAILED ")})
    return "".join(f" --deselect '{t}'" for t in failing)


def main(sessions: list[str], add_tests: str = "", test_command: str = "") -> int:
    for session in sessions:
        config = tomllib.loads((Path(session).parent / "cr.toml").read_text())
        command = config["cosmic-ray"]["test-command"]
        if test_command:  # the session's tests as they are now, golden-file readers deselected afresh
            command = test_command + _baseline_deselects(test_command)
        if add_tests:  # first, so that with -x a mutant they kill stops early
            command = command.replace(" tests/", f" {add_tests} tests/", 1)
        db = sqlite3.connect(session)
        survivors = db.execute("select job_id, diff from work_results where test_outcome = 'SURVIVED'").fetchall()
        killed = skipped = 0
        with tempfile.TemporaryDirectory(prefix="mocompile-retest-") as tmp:
            work = Path(tmp)
            snapshot(work)
            for job_id, diff in survivors:
                body = diff.split("--- mutation diff ---\n", 1)[-1].rstrip("\n") + "\n"
                applied = subprocess.run(["patch", "-p1", "-s", "-N", "-r", "-", "--no-backup-if-mismatch"], cwd=work,
                                         input=body, text=True, capture_output=True)
                if applied.returncode != 0:  # the code moved on since the run: leave it a survivor
                    skipped += 1
                    changed = [ln for ln in body.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
                    print(f"  does not apply: {' | '.join(changed)}")
                    snapshot(work)  # restore any half-applied file
                    continue
                try:
                    proc = subprocess.run(command, shell=True, cwd=work, capture_output=True, text=True, timeout=600)
                finally:
                    subprocess.run(["patch", "-p1", "-R", "-s", "-r", "-", "--no-backup-if-mismatch"], cwd=work,
                                   input=body, text=True, check=True)
                if proc.returncode != 0:
                    killed += 1
                    db.execute("update work_results set test_outcome = 'KILLED', output = 'retested: ' || output "
                               "where job_id = ?", (job_id,))
                    db.commit()
        print(f"{session}: {len(survivors)} survivors, {killed} now killed, {skipped} no longer apply")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--add-tests", default="", help="test files appended to the session's test command")
    parser.add_argument("--test-command", default="",
                        help="replace the session's test command (its deselections are recomputed on a snapshot)")
    parser.add_argument("sessions", nargs="+")
    args = parser.parse_args()
    sys.exit(main(args.sessions, args.add_tests, args.test_command))
