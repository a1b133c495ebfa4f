"""Generated files carry a checksum of their body; `check` tells current, stale, edited and foreign files
apart by it (compiler/mocompile/emit/header.py)."""

from __future__ import annotations

import json

import pytest
from mocompile.emit import header

BODY = "x = 1\n"


def _variants(body: str, n: int = 40) -> tuple[str, str]:
    """Two edited files whose bodies' digests sort below and above the stored one (so an ordering
    comparison in place of equality would pass one of them)."""
    stored = None
    low = high = None
    for i in range(n):
        edited = body + f"# edit {i}\n"
        if stored is None:
            stored = header.digest(body)
        d = header.digest(edited)
        if d < stored and low is None:
            low = edited
        if d > stored and high is None:
            high = edited
    assert low and high
    return low, high


def test_a_comment_header_verifies_its_body_and_any_edit_fails_it():
    text = header.stamp_comment(BODY, "recipes/r.yaml", "0" * 16)
    assert header.verify(text) is True
    for edited in _variants(BODY):
        assert header.verify(text.replace(BODY, edited)) is False
    assert header.verify(BODY) is None  # no header: not ours


def test_a_json_header_verifies_its_body_and_any_edit_fails_it():
    text = header.stamp_json({"a": 1}, "recipes/r.yaml", "0" * 16)
    assert header.verify(text) is True
    data = json.loads(text)
    for value in range(2, 40):  # bodies whose digests sort on both sides of the stored one
        data["a"] = value
        assert header.verify(json.dumps(data, indent=2)) is False
    assert header.verify(json.dumps({"a": 1})) is None
    assert header.verify("{not json") is False


def test_the_json_header_leads_with_the_note_and_keeps_its_field_order():
    meta = json.loads(header.stamp_json({"b": 1, "a": 2}, "recipes/r.yaml", "0" * 16))["_generated"]
    assert list(meta) == ["note", "source", "mocompile", "checksum", "input"]
    assert list(json.loads(header.stamp_json({"b": 1, "a": 2}, "r", "0" * 16))) == ["_generated", "b", "a"]


@pytest.mark.parametrize("edit,status", [
    (lambda t: t, "current"),
    (lambda t: t + "\n", "edited"),                                          # body changed under its checksum
    (lambda t: t.replace("x = 1", "x = 2"), "edited"),
    (lambda t: "x = 1\n", "edited"),                                         # header gone
])
def test_compare_tells_current_edited_and_stale_apart(tmp_path, edit, status):
    fresh = header.stamp_comment(BODY, "recipes/r.yaml", "0" * 16)
    path = tmp_path / "f.py"
    path.write_text(edit(fresh))
    assert header.compare(str(path), fresh)[0] == status


def test_an_intact_file_of_another_compile_is_stale_not_edited(tmp_path):
    old = header.stamp_comment("x = 0\n", "recipes/r.yaml", "0" * 16)
    fresh = header.stamp_comment(BODY, "recipes/r.yaml", "1" * 16)
    path = tmp_path / "f.py"
    path.write_text(old)
    assert header.compare(str(path), fresh)[0] == "stale"
    assert header.compare(str(tmp_path / "missing.py"), fresh)[0] == "missing"
    # a file that sorts after the fresh one is still not current (the comparison is equality)
    later = next(t for t in (header.stamp_comment(f"x = {i}\n", "recipes/r.yaml", "1" * 16) for i in range(2, 99))
                 if t > fresh)
    path.write_text(later)
    assert header.compare(str(path), fresh)[0] == "stale"
