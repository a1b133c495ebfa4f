"""Mutation fuzzing of every recipe in recipes/: byte- and line-level damage, value swaps, splices.

Each mutant goes through the whole compiler (load, validate, resolve, check, emit) and must
end as a plan, findings or a clean input error in under a second (tests/fuzz/harness.py).
Hypothesis drives the mutations, so a failure shrinks to a small reproducer.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .harness import RECIPES, ROOT, Workdir, compile_text, examples, nightly, stats, warm_up

NAMES = sorted(str(p.relative_to(RECIPES)) for p in RECIPES.rglob("*.yaml"))
TEXTS = {n: (RECIPES / n).read_text(encoding="utf-8") for n in NAMES}

# Values a careless or hostile edit puts where a value was: every YAML type, edge numbers,
# shell and template metacharacters, tags, anchors, block indicators.
TOKENS = ["0", "-1", "1.5", "1e309", ".nan", ".inf", "true", "null", "~", "''", '""', "[]", "{}", "[1, 2]",
          "{a: 1}", "auto", "none", "2147483648", str(2 ** 53), str(2 ** 53 + 1), "0x10", "0o17", "1_000", "-0",
          "+1", "1:2", "2001-12-14", "'$(touch /tmp/pwned)'", '"a\\nb"', '"\\0"', "\"{{ 7*7 }}\"", "'${HOME}'",
          "!!binary aGk=", "!!python/object/apply:os.system ['true']", "!!set {a}", "!!omap [a: 1]", "&a x", "*a",
          "*nowhere", "-", "|", ">", "'", '"', "@", "`", "%", "9" * 30, "x" * 5000, "[[[[[[", "=", "<<: *a",
          "? a", "a: b: c", "h100", "deepep", "hybridep", "alltoall", "nvfp4", "fp8-cs", "selective", "full",
          "[torchrun, slurm]", "{A: 1}", "tiny-moe", "deepseek-v3", "{base: tiny-moe, num_layers: 3}", "é", "\t"]


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True) or [""]


@st.composite
def mutants(draw) -> tuple[str, str]:
    """One recipe with one to four mutations applied in turn."""
    name = draw(st.sampled_from(NAMES))
    text = TEXTS[name]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "truncate", "insert", "flip", "value", "indent",
                                   "splice", "deepen", "key"]))
        lines = _lines(text)
        i = draw(st.integers(0, len(lines) - 1))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":  # the same key twice, or a repeated list item
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "truncate":
            text = text[: draw(st.integers(0, len(text)))]
            continue
        elif op == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.text(max_size=8)) + text[at:]
            continue
        elif op == "flip":
            raw = bytearray(text.encode("utf-8", "surrogateescape"))
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
            text = raw.decode("utf-8", "surrogateescape")
            continue
        elif op == "value" and ":" in lines[i]:
            head = lines[i].split(":", 1)[0]
            lines[i] = f"{head}: {draw(st.sampled_from(TOKENS))}\n"
        elif op == "indent":
            delta = draw(st.integers(-4, 4))
            lines[i] = " " * max(0, delta) + (lines[i][-delta:] if delta < 0 else lines[i])
        elif op == "splice":
            other = _lines(TEXTS[draw(st.sampled_from(NAMES))])
            a = draw(st.integers(0, len(other) - 1))
            lines[i:i] = other[a: a + draw(st.integers(1, 6))]
        elif op == "deepen" and ":" in lines[i]:
            head, value = lines[i].rstrip("\n").split(":", 1)
            n = draw(st.integers(1, 40))
            lines[i] = f"{head}: {'[' * n}{value.strip() or 'x'}{']' * n}\n"
        elif op == "key":
            lines.insert(i, f"{draw(st.sampled_from(['extends', 'name', 'model', 'training', 'moe', 'x', '<<']))}: "
                            f"{draw(st.sampled_from(TOKENS))}\n")
        text = "".join(lines)
    return name, text


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Workdir:
    w = Workdir(tmp_path_factory.mktemp("fuzz-recipes"))
    warm_up(w)
    return w


def test_every_recipe_compiles_unmutated(work):
    for name in NAMES:
        assert compile_text(TEXTS[name], work.path_for(name)) in ("plan", "findings"), name


def test_mutated_recipes_give_a_plan_or_a_clean_error(work):
    stat = stats("recipe mutants")

    @settings(max_examples=examples("recipes"), deadline=None, derandomize=not nightly(), database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutants())
    def run(case: tuple[str, str]) -> None:
        name, text = case
        compile_text(text.encode("utf-8", "surrogateescape"), work.path_for(name), stat=stat)

    run()
    assert stat.inputs >= examples("recipes") * 0.9
    assert stat.outcomes.get("plan", 0) + stat.outcomes.get("findings", 0) > 0, "no mutant compiled: fuzzing nothing"
    assert stat.outcomes.get("input", 0) > 0, "no mutant was refused: mutations do nothing"


def test_mutants_through_the_real_command_line(tmp_path):
    """A sample through `python -m mocompile`: exit 0/1/2, never 3, never a traceback."""
    work = Workdir(tmp_path)
    seen = []

    @settings(max_examples=25, deadline=None, derandomize=not nightly(), database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutants())
    def run(case: tuple[str, str]) -> None:
        name, text = case
        path = work.path_for(name)
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        proc = subprocess.run([sys.executable, "-m", "mocompile", "lint", str(path)], cwd=ROOT, capture_output=True,
                              text=True, errors="replace", timeout=60,
                              env={"PYTHONPATH": str(ROOT / "compiler"), "PATH": "/usr/bin:/bin"})
        out = proc.stdout + proc.stderr
        assert proc.returncode in (0, 1, 2), f"exit {proc.returncode} on {text[:300]!r}:\n{out[-2000:]}"
        assert "Traceback" not in out
        if proc.returncode == 2:
            assert "error [" in out, out
        seen.append(proc.returncode)

    run()
    assert 2 in seen
