"""Byte-level fuzzing of the loader: random bytes and YAML-shaped noise (hypothesis), and a
coverage-guided atheris run seeded with recipes/ when atheris is installed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .harness import ROOT, Workdir, compile_text, examples, nightly, stats

YAMLISH = st.lists(st.sampled_from(list("abcdefgh01289 :-[]{},&*!|>'\"#?%@`\n\t.\\~=")
                                  + ["schema: 1\n", "model", "extends", "\n  ", ": &a ", "*a", "goal: fit\n"]),
                   max_size=120).map("".join)


def test_random_bytes_give_a_clean_error(tmp_path):
    work = Workdir(tmp_path)
    stat = stats("random bytes")

    @settings(max_examples=examples("bytes"), deadline=None, derandomize=not nightly(), database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.binary(max_size=600), YAMLISH.map(lambda t: t.encode("utf-8"))))
    def run(data: bytes) -> None:
        assert compile_text(data, work.root / "_fuzz.yaml", stat=stat) in ("plan", "findings", "input")

    run()
    assert stat.inputs >= examples("bytes") * 0.9


def test_atheris_coverage_guided_loader_fuzzing():
    pytest.importorskip("atheris", reason="atheris is installed by tests/fuzz/requirements.txt")
    runs = examples("atheris")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz" / "atheris_loader.py"), f"-runs={runs}",
                           "-seed=1" if not nightly() else "-seed=0"],
                          capture_output=True, text=True, errors="replace", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    done = re.search(r"Done (\d+) runs in (\d+) second", out)
    assert done and int(done.group(1)) >= runs, out[-2000:]
    stat = stats("atheris loader")
    stat.inputs, stat.seconds = int(done.group(1)), max(1.0, float(done.group(2)))
    stat.outcomes = {"no crash": stat.inputs}
    stat.note = "none slower than 1 s (libFuzzer -timeout=1 stops at the first)"
