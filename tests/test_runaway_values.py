"""Counts that size the compiler's own work are bounded: no input allocates or loops without end.

The 100,000-input fuzz run (docs/fuzz-nightly.md) found `--set model.mtp_num_layers=946788970`
(with `parallelism={"vpp": 4}`) allocating ~100 MB/s until a memory limit stopped it: the derived
pipeline layout spelt out every layer as a letter, so its size followed the layer counts, and
its stage list followed PP*VPP. `model.num_layers=45759` took 1.13 CPU s. The schema now bounds
every count the planner, the layout or the emitted model walks (layers, pipeline stages,
experts); the layout code neither lists stages one by one nor expands a repeat past twice the
length of a legal layout. Memory is measured with tracemalloc (peak bytes allocated), not time.
"""

from __future__ import annotations

import itertools
import json
import tracemalloc
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

BENCH = ROOT / "recipes" / "bench"


def _peak(fn, *args):
    """(result or raised exception, peak bytes allocated while ``fn`` ran)."""
    tracemalloc.start()
    try:
        try:
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the caller looks at what was raised
            out = exc
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _compile(recipe: Path, sets: list[str]):
    from mocompile.pipeline import compile_recipe
    return compile_recipe(str(recipe), sets)


@pytest.mark.parametrize("recipe,sets,field,bound", [
    # the fuzz run's memory blow-up and its 1.13 s input
    ("bench-mid-ep4-deepep-on.yaml", ['parallelism={"vpp": 4}', "model.mtp_num_layers=946788970"],
     "model.mtp_num_layers", 256),
    ("bench-ep8-mid-auto.yaml", ["model.num_layers=45759"], "model.num_layers", 256),
    # the same class: each of these allocated or looped in proportion to the value
    ("bench-mid-auto.yaml", ["parallelism.pp=2", "parallelism.vpp=1000000000"], "parallelism.vpp", 256),
    ("bench-mid-auto.yaml", ["parallelism.pp=100000000000"], "parallelism.pp", 256),
    ("bench-mid-auto.yaml", ["model.first_k_dense=1000000000"], "model.first_k_dense", 256),
    ("bench-mid-auto.yaml", ["model.num_moe_experts=1000000000"], "model.num_moe_experts", 4096),
])
def test_runaway_counts_are_refused_at_once(recipe, sets, field, bound):
    from mocompile.errors import InputError
    err, peak = _peak(_compile, BENCH / recipe, sets)
    assert isinstance(err, InputError), f"not refused: {err!r}"
    (diag,) = err.diagnostics
    assert diag.rule == "SCHEMA" and str(diag.position) == "<command line>"
    assert diag.message.startswith(f"`{field}` must be <= {bound}, got "), diag.message
    assert str(bound) in diag.hint  # the field's description says why
    assert peak < 16 * 2 ** 20, f"{peak / 2 ** 20:.0f} MB allocated to refuse it"


def test_a_bound_in_a_file_is_positioned(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("schema: 1\nmodel:\n  base: tiny-moe\n  num_layers: 300\nhardware: {gpu: h100, nodes: 1}\n"
                    "goal: throughput\n")
    proc = run_cli("lint", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{path}:4:15: error [SCHEMA] `model.num_layers` must be <= 256, got 300" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("sets", [
    ['model={"base": "tiny-moe", "num_layers": 256, "mtp_num_layers": 256, "first_k_dense": 256}'],
    ["model.num_layers=256", "model.mtp_num_layers=3", "parallelism.pp=2", "parallelism.vpp=256"],
    ["model.num_layers=255", "parallelism.pp=256", "parallelism.vpp=256"],
    ["model.num_moe_experts=4096"],
])
def test_values_at_the_bounds_compile_in_bounded_memory(sets):
    from mocompile.errors import InputError
    out, peak = _peak(_compile, BENCH / "bench-ep8-mid-auto.yaml", sets)
    assert not isinstance(out, Exception) or isinstance(out, InputError), repr(out)
    assert peak < 64 * 2 ** 20, f"{peak / 2 ** 20:.0f} MB allocated"


@pytest.mark.parametrize("layout", [
    "((((((Et)*999)*999)*999)*999)*999)*999",  # 38 characters, 2 * 999**6 letters
    "(t*99999999)*99",
    "E" + "(" * 40 + "t" + ")*9" * 40 + "L",
    "E|(|)*" + "9" * 4000 + "L",
])
def test_a_layout_repeat_bomb_is_a_finding_not_an_allocation(layout):
    from mocompile.layout import layout_error
    error, peak = _peak(layout_error, layout, 2, 1, 16, 0)
    assert "expands past" in error
    assert peak < 1 * 2 ** 20, f"{peak / 2 ** 20:.1f} MB allocated"


def test_a_layout_repeat_bomb_on_the_command_line_is_pp003():
    proc = run_cli("lint", str(ROOT / "recipes" / "tiny-moe-h100x2.yaml"), "--set", "parallelism.pp=2",
                   "--set", "parallelism.layout=((((((Et)*999)*999)*999)*999)*999)*999")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[PP003]" in proc.stdout and "expands past" in proc.stdout


def _derive_listing_every_stage(pp: int, vpp: int, num_layers: int, mtp: int) -> str:
    """The derivation as it was (one string per stage, then folded): the reference for the counted one."""
    stages_n = pp * vpp
    units = num_layers + 2 + mtp
    base, extra = divmod(units, stages_n)
    sizes = [base + (1 if i >= stages_n - extra else 0) for i in range(stages_n)]
    stages, remaining = [], num_layers
    for i, size in enumerate(sizes):
        head = "E" if i == 0 else ""
        tail = ("m" * mtp + "L") if i == stages_n - 1 else ""
        t = max(0, min(size - len(head) - len(tail), remaining))
        if i == stages_n - 1:
            t = remaining
        remaining -= t
        stages.append(head + "t" * t + tail)
    out, i = [], 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        count = j - i + 1
        out.append(f"({stages[i]}|)*{count}" if count > 2 else "|".join(stages[i:j + 1]) + "|")
        i = j + 1
    text = "".join(out)
    return text[:-1] if text.endswith("|") else text


def test_derived_layout_is_the_same_as_listing_every_stage():
    from mocompile.layout import derive
    for pp, vpp, layers, mtp in itertools.product(range(1, 11), range(1, 5), range(1, 40), range(0, 3)):
        assert derive(pp, vpp, layers, mtp) == _derive_listing_every_stage(pp, vpp, layers, mtp), (pp, vpp, layers, mtp)


def test_derived_layout_does_not_grow_with_the_stage_count():
    """65,536 stages (PP 256 x VPP 256): the folded layout, and the work, stay small."""
    from mocompile.layout import derive, layout_error
    layout, peak = _peak(derive, 256, 256, 256, 256)
    assert len(layout) < 1024 and peak < 64 * 1024, (len(layout), peak)
    assert layout_error(layout, 256, 256, 256, 256) is None
    # 2**40 stages: still a few characters, where listing them needed terabytes
    layout, peak = _peak(derive, 2 ** 20, 2 ** 20, 61, 1)
    assert len(layout) < 64 and peak < 64 * 1024, (layout, peak)


def test_the_bounds_reach_the_editor_schema():
    schema = json.loads((ROOT / "schemas" / "intent.schema.json").read_text())
    model = schema["properties"]["model"]["anyOf"][1]["properties"]
    for key, bound in (("num_layers", 256), ("mtp_num_layers", 256), ("first_k_dense", 256),
                       ("num_moe_experts", 4096)):
        assert model[key]["maximum"] == bound, key
    for key in ("pp", "vpp"):
        integer = schema["properties"]["parallelism"]["properties"][key]["anyOf"][0]
        assert integer == {"type": "integer", "minimum": 1, "maximum": 256}, key
