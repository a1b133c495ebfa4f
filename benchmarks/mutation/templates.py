"""Mutation testing of the Jinja templates (cosmic-ray mutates Python only): one line deleted at a time.

    python benchmarks/mutation/templates.py [--per-template 6] [--seed 13] [SCRATCH]

On a `git archive HEAD` copy, each mutant deletes one non-blank, non-comment template line (a fixed random sample per
template, seed 13), recompiles generated/ from every recipe with the mutated template, and runs the tests
that state the emitted files' behaviour (the launchers' dry runs and real Slurm submissions, train.py's AST
and imports, the Kubernetes checks). generated/ is always the mutant's own output, so a test that compares
with committed files can never kill: only behaviour counts. A template the compiler cannot render fails
the recompile (a kill). Prints one line per mutant and a score per template.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = "compiler/mocompile/emit/templates"
TESTS = ["tests/test_untrusted_input.py", "tests/test_emit.py", "tests/test_emit_requirements.py", "tests/test_kubernetes.py",
         "tests/test_training_io.py", "tests/test_hostile_values.py", "tests/test_slurm.py", "tests/test_launchers.py"]


def _comment(line: str) -> bool:
    """A line only a reader sees (as cosmic-ray never mutates a Python comment): a shell, Python or
    YAML comment, or a Jinja comment. Not a comment: `#!`, `#SBATCH` (Slurm reads it) and
    `# shellcheck` directives (shellcheck reads them)."""
    s = line.strip()
    if s.startswith("{#"):
        return True
    return s.startswith("#") and not s.startswith(("#!", "#SBATCH", "# shellcheck"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scratch", nargs="?")
    ap.add_argument("--per-template", type=int, default=6)
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="mocompile-mutation-templates-"))
    scratch.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD", "compiler", "tests", "recipes", "schemas",
                              "pyproject.toml", "README.md", "docs", "benchmarks/data", "clusters"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    py = sys.executable
    base = [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not stack", *TESTS]
    recipes = sorted(str(p.relative_to(scratch)) for p in (scratch / "recipes").rglob("*.yaml"))
    regen = [py, "-m", "mocompile", "compile", "--force", *recipes]
    env = dict(__import__("os").environ, PYTHONPATH=str(scratch / "compiler"), MOCOMPILE_NO_CACHE="1")

    def run_tests() -> bool:
        """True when the recompile or a test fails (the mutant is killed)."""
        if subprocess.run(regen, cwd=scratch, capture_output=True, env=env).returncode not in (0, 1):
            return True
        return subprocess.run(base, cwd=scratch, capture_output=True, env=env, timeout=1200).returncode != 0

    if run_tests():
        print("the tests fail on the unmutated copy", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    totals: dict[str, list[int]] = {}
    comments: dict[str, int] = {}
    survivors: list[str] = []
    for tpl in sorted((scratch / TEMPLATES).glob("*.j2")):
        lines = tpl.read_text().split("\n")
        candidates = [i for i, ln in enumerate(lines) if ln.strip() and not _comment(ln)]
        comments[tpl.name] = sum(1 for ln in lines if ln.strip() and _comment(ln))
        for i in sorted(rng.sample(candidates, min(args.per_template, len(candidates)))):
            mutated = lines[:i] + lines[i + 1:]
            original = tpl.read_text()
            tpl.write_text("\n".join(mutated))
            try:
                killed = run_tests()
            except subprocess.TimeoutExpired:
                killed = True
            finally:
                tpl.write_text(original)
            totals.setdefault(tpl.name, [0, 0])[0 if killed else 1] += 1
            print(f"{tpl.name}:{i + 1} {'killed' if killed else 'SURVIVED'}: {lines[i].strip()[:100]}", flush=True)
            if not killed:
                survivors.append(f"{tpl.name}:{i + 1}: {lines[i].strip()}")
    for name, (k, s) in totals.items():
        print(f"{name}: {k}/{k + s} killed ({k / (k + s):.0%}); {comments[name]} comment lines not mutated")
    k = sum(v[0] for v in totals.values())
    n = sum(sum(v) for v in totals.values())
    print(f"all templates: {k}/{n} killed ({k / n:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
