"""benchmarks/gpu/issue22_predict.py: a grid's plans compiled again with a cluster profile. The profile copy must
strike exactly the modules named present (a profile probed before DeepEP was installed would otherwise refuse the
grid's own DeepEP plans with CLU001), and the prediction must be the compiler's, from the lock's recipe and pins."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import issue22_predict  # noqa: E402

PROFILE = ROOT / "clusters" / "lent-h200x2.yaml"


def _missing(path: Path) -> str:
    return next(line for line in path.read_text().splitlines() if line.strip().startswith("missing:"))


def test_profile_copy_strikes_only_the_modules_named_present(tmp_path: Path) -> None:
    assert '"deep_ep"' in _missing(PROFILE) and '"apex"' in _missing(PROFILE)
    out = issue22_predict.profile_copy(PROFILE, {"deep_ep", "hybrid_ep"}, tmp_path)
    assert _missing(out).strip() == 'missing: ["apex"]'
    # everything else is the profile as written (host factor, probe, measured list)
    rest = [x for x in out.read_text().splitlines() if not x.strip().startswith("missing:")]
    assert rest == [x for x in PROFILE.read_text().splitlines() if not x.strip().startswith("missing:")]
    (tmp_path / "none").mkdir()
    untouched = issue22_predict.profile_copy(PROFILE, set(), tmp_path / "none")
    assert _missing(untouched) == _missing(PROFILE)


def _grid(tmp: Path, dispatcher: str) -> Path:
    lock = {"_generated": {"source": "recipes/bench/bench-te-mid2-auto.yaml"},
            "estimate": {"chosen": {"pins": {"parallelism.tp": 1, "parallelism.ep": 2, "moe.dispatcher": dispatcher,
                                             "moe.overlap": False, "recompute.granularity": "none"}}}}
    (tmp / "lock-i22-p.json").write_text(json.dumps(lock))
    (tmp / "grid.json").write_text(json.dumps({"plans": {"p": {"runs": [{"median_ms": 800.0}, {"median_ms": 900.0}]}}}))
    return tmp


def test_a_deepep_plan_is_predicted_only_with_deep_ep_taken_as_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid(tmp_path, "deepep")
    monkeypatch.setattr(sys, "argv", ["x", str(grid), "--profile", "clusters/lent-h200x2.yaml"])
    with pytest.raises(SystemExit) as refused:
        issue22_predict.main()
    assert "deep_ep" in str(refused.value) and "missing" in str(refused.value)
    monkeypatch.setattr(sys, "argv", ["x", str(grid), "--profile", "clusters/lent-h200x2.yaml", "--present", "deep_ep"])
    assert issue22_predict.main() == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| p |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].startswith("TP1 PP1 EP2, deepep, overlap off") and cells[4] == "850"
    predicted = float(cells[2])
    assert cells[5] == f"{predicted / 850 - 1:+.1%}"  # the error is against the median of the run medians
