"""The loader names the exact place of every problem, and `--set`/`--unset` keep positions honest.

Each case pins a line and column (1-based, as editors count) or a message detail that a one-off
slip in compiler/mocompile/load.py would change.
"""

from __future__ import annotations

import pytest
from mocompile.errors import InputError
from mocompile.ir import Position
from mocompile.load import CLI, _short, apply_overrides, load, parse_text

BASE = "schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2}\ngoal: bring-up\n"


def _error(text: str) -> Position:
    with pytest.raises(InputError) as exc:
        parse_text(text, "r.yaml")
    (d,) = exc.value.diagnostics
    return d.position


@pytest.mark.parametrize("text", ["", "\n\n", "   \n"])
def test_an_empty_file_is_reported_at_line_1_column_1(text):
    pos = _error(text)
    assert (pos.file, pos.line, pos.column) == ("r.yaml", 1, 1)


def test_malformed_yaml_is_reported_where_the_parser_stopped():
    pos = _error("schema: 1\nmodel: x\nhardware: [a,\n  b: c\n")
    assert (pos.line, pos.column) == (5, 1)  # the end of input, where the ']' was still expected


@pytest.mark.parametrize("value,message", [
    ("!!int abc", "'abc' is not a valid int"),
    ("!!float abc", "'abc' is not a valid float"),
    ("!!bool maybe", "'maybe' is not a valid bool"),  # was an internal error (KeyError)
    ("!!timestamp abc", "failed to construct timestamp"),
])
def test_a_value_its_tag_cannot_hold_is_reported_at_the_value(value, message):
    with pytest.raises(InputError) as exc:
        parse_text(f"schema: 1\nmodel: tiny-moe\nx: {value}\n", "r.yaml")
    (d,) = exc.value.diagnostics
    assert (d.position.line, d.position.column) == (3, 4) and message in d.message


def test_long_override_text_is_cut_to_the_width_with_an_ellipsis():
    assert _short("k" * 60) == repr("k" * 60)
    assert _short("k" * 61) == repr("k" * 60 + "...")
    assert _short("abcdef", 3) == repr("abc...")


def test_unsetting_under_a_plain_value_or_nothing_changes_nothing(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(BASE)
    doc = load(str(path))
    before = (dict(doc.data), dict(doc.positions))
    apply_overrides(doc, [], ["model.num_layers", "goal.x.y", "nothing.here", ""])
    assert (doc.data, doc.positions) == before


def test_unsetting_a_key_drops_it_and_every_position_under_it(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(BASE)
    doc = apply_overrides(load(str(path)), [], ["hardware"])
    assert "hardware" not in doc.data
    assert not [p for p in doc.positions if p[:1] == ("hardware",)]


def test_a_set_creates_missing_parents_each_positioned_on_the_command_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(BASE)
    doc = apply_overrides(load(str(path)), ["launch.slurm.partition=gpu"], [])
    assert doc.data["launch"] == {"slurm": {"partition": "gpu"}}
    for p in (("launch",), ("launch", "slurm"), ("launch", "slurm", "partition")):
        assert doc.positions[p] == Position(CLI), p
    assert ("launch", "slurm", "partition", "x") not in doc.positions


@pytest.mark.parametrize("value", ["yes", "on", "Auto", "aardvark", "zzz"])  # above and below "auto", in sort order
def test_a_tri_state_knob_takes_only_true_false_or_the_word_auto(tmp_path, value):
    from mocompile.schema import validate

    path = tmp_path / "r.yaml"
    path.write_text(BASE + f"moe: {{overlap: {value!r}}}\n".replace("'", '"'))
    with pytest.raises(InputError) as exc:
        validate(load(str(path)))
    assert any("moe.overlap" in d.message for d in exc.value.diagnostics)


def test_a_list_with_one_unknown_value_names_that_value_not_the_first(tmp_path):
    from mocompile.schema import validate

    path = tmp_path / "r.yaml"
    path.write_text(BASE + "launch: {targets: [torchrun, kubernetis]}\n")
    with pytest.raises(InputError) as exc:
        validate(load(str(path)))
    (d,) = exc.value.diagnostics
    assert "unknown value 'kubernetis'" in d.message and "kubernetes" in d.hint
