"""Plant the bugs issue 13 named as survivors, one at a time, and check the tests now kill each.

    .venv-stack/bin/python benchmarks/mutation/named_survivors.py [--tests "tests/test_rule_boundaries.py ..."]

Works on a private snapshot of the committed tree (``git archive HEAD``), never on the working
tree. Only tests that say what the right value is run (no comparison with generated/ files),
so a kill here is not a golden-file kill. Prints one line per mutant; exits 1 when one survives.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKS = "compiler/mocompile/rules/checks.py"
ENGINE = "compiler/mocompile/rules/engine.py"
LAYOUT = "compiler/mocompile/layout.py"

# (name, file, exact text, replacement): the survivors, each a plausible one-token bug.
MUTANTS = [
    ("PAR001 drops CP from TP*PP*CP", CHECKS,
     '''c["pipeline_model_parallel_size"]
                                           * c["context_parallel_size"]) != 0''',
     '''c["pipeline_model_parallel_size"]
                                           * 1) != 0'''),
    ("PAR002 drops PP from the expert grid", CHECKS,
     '''c["world_size"] % (_ep_group(c) * c["pipeline_model_parallel_size"]) != 0''',
     '''c["world_size"] % (_ep_group(c) * 1) != 0'''),
    ("PAR007 without the micro batch", CHECKS,
     '''c["global_batch_size"] % (c["micro_batch_size"] * max(1, c["data_parallel_size"])) != 0''',
     '''c["global_batch_size"] % (1 * max(1, c["data_parallel_size"])) != 0'''),
    ("RC004 without its method clause", CHECKS,
     '''(c["recompute_num_layers"] is not None or c["recompute_method"] is not None)''',
     '''(c["recompute_num_layers"] is not None)'''),
    ("PREC001 without fp4", CHECKS,
     '''(c["fp8"] is not None or c["fp4"] is not None) and c["te_version"] is None''',
     '''(c["fp8"] is not None) and c["te_version"] is None'''),
    ("PREC002 architecture test inverted", CHECKS,
     '''c["fp4"] is not None) and c["gpu_arch"] != "blackwell"''',
     '''c["fp4"] is not None) and c["gpu_arch"] == "blackwell"'''),
    ("PP005 rejects micro-batches = PP", CHECKS,
     '''_microbatches(c) < c["pipeline_model_parallel_size"]''',
     '''_microbatches(c) <= c["pipeline_model_parallel_size"]'''),
    ("DSP003 without DeepEP group size 24", CHECKS,
     '''DEEPEP_GROUP_SIZES = (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)''',
     '''DEEPEP_GROUP_SIZES = (2, 4, 8, 16, 32, 64, 128, 144, 160)'''),
    ("DSP008 % 2 -> % 4", CHECKS,
     '''c["moe_flex_dispatcher_num_sms"] % 2 != 0''',
     '''c["moe_flex_dispatcher_num_sms"] % 4 != 0'''),
    ("PAR009 EP > 1 -> EP >= 1", CHECKS,
     '''(c["expert_model_parallel_size"] > 1 and c["tensor_model_parallel_size"] > 1''',
     '''(c["expert_model_parallel_size"] >= 1 and c["tensor_model_parallel_size"] > 1'''),
    ("diagnostic position ignores who pinned the value", ENGINE,
     '''if d is not None and d.source == "user" and d.position is not None:''',
     '''if d is not None and d.position is not None:'''),
    ("layout accepts two E", LAYOUT,
     '''if not stages[0].startswith("E") or flat.count("E") != 1:''',
     '''if not stages[0].startswith("E"):'''),
    ("layout accepts an MTP layer outside the last stage", LAYOUT,
     '''if mtp and "m" not in stages[-1]:''',
     '''if False:'''),
    ("layout accepts a decoder layer after the MTP layers", LAYOUT,
     '''if mtp and "t" in stages[-1][stages[-1].index("m"):]:''',
     '''if False:'''),
]

DEFAULT_TESTS = "tests/test_rule_boundaries.py tests/test_rules.py"


def snapshot(dest: Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD", "compiler", "tests", "recipes", "schemas", "pyproject.toml",
                              "README.md"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default=DEFAULT_TESTS)
    args = parser.parse_args()
    survivors = 0
    with tempfile.TemporaryDirectory(prefix="mocompile-mutants-") as tmp:
        work = Path(tmp)
        snapshot(work)
        for name, rel, old, new in MUTANTS:
            path = work / rel
            original = path.read_text()
            if original.count(old) != 1:
                print(f"STALE     {name}: the text to mutate is not in {rel} once; update this script")
                survivors += 1
                continue
            path.write_text(original.replace(old, new))
            try:
                proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                       *args.tests.split()], cwd=work, capture_output=True, text=True, timeout=600)
            finally:
                path.write_text(original)
            killed = proc.returncode != 0
            survivors += not killed
            first = next((ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")), "")
            print(f"{'killed  ' if killed else 'SURVIVED'}  {name}  {first[7:110]}")
    print(f"{len(MUTANTS) - survivors}/{len(MUTANTS)} named mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
