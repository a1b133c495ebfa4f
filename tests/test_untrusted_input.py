"""A recipe, its file name and the project's pyproject.toml are untrusted: the pre-commit hook runs
on anyone's commit. Nothing from them may become code in a generated file, steer a write outside
the project, or drive the terminal that shows mocompile's output.

The end-to-end hunt over random hostile names and values is tests/fuzz/test_fuzz_injection.py;
these are the rules it relies on, each pinned where it bites.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize

import pytest
from conftest import ROOT, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from mocompile.emit import header, render
from mocompile.textsafe import header_path, terminal, visible

PEP263 = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")  # the interpreter's own pattern
RECIPE = "schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2}\ngoal: bring-up\n"


# --- what reaches a terminal -------------------------------------------------------------------

@pytest.mark.parametrize("raw,shown", [
    ("plain text, ünïcode ✓", "plain text, ünïcode ✓"),  # printable text is left alone
    ("a\x1b[31mb", "a\\x1b[31mb"),  # ESC starts a terminal control sequence
    ("a\nb\rc", "a\\nb\\rc"),  # a newline forges a log line, CR overwrites one: Python's own escapes
    ("a\u202eb", "a\\u202eb"),  # a bidi override reorders what a reviewer reads
    ("a\u2028b", "a\\u2028b"),  # a line separator
    ("tab\tnul\x00del\x7f", "tab\\tnul\\x00del\\x7f"),
    ("nb\u00a0sp", "nb\\xa0sp"),  # a space that is not a plain space is not printable either
    ("tag\U000e0001", "tag\\U000e0001"),  # a format character beyond the BMP: eight hex digits
    ("\U00010000", "\U00010000"),  # the first character beyond the BMP is a printable letter
    ("\uffff", "\\uffff"),  # the last BMP code point (a noncharacter) still takes four hex digits
    ("\u00ff\u0085", "\u00ff\\x85"),  # the last Latin-1 character is a letter; C1 controls take two digits
])
def test_visible_shows_every_control_format_and_separator_character_as_an_escape(raw, shown):
    assert visible(raw) == shown


def test_visible_escapes_every_character_of_the_dangerous_unicode_classes_and_nothing_printable():
    """Cc control, Cf format (bidi, zero width), Zl/Zp separators, Cs surrogates, Co private use,
    Cn unassigned and non-ASCII spaces: every code point of those classes comes out as an escape
    (so it cannot drive a terminal or hide in a review), every other one as itself."""
    import sys
    import unicodedata

    dangerous = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        cat = unicodedata.category(ch)
        escaped = cat in dangerous or (cat == "Zs" and ch != " ")
        assert (visible(ch) != ch) is escaped, (hex(code), cat)
        if escaped:
            assert visible(ch).startswith("\\") and visible(ch).isascii() and visible(ch).isprintable()


def test_visible_keeps_only_the_layout_characters_the_caller_names():
    assert visible("a\nb\x1b", keep="\n") == "a\nb\\x1b"


def test_terminal_keeps_newlines_tabs_and_colour_codes_and_escapes_everything_else():
    assert terminal("\x1b[31merror\x1b[0m: x\ty\n") == "\x1b[31merror\x1b[0m: x\ty\n"
    assert terminal("a\x1b]0;title\x07b\rc\u202e") == "a\\x1b]0;title\\x07b\\rc\\u202e"


def _lint_output(tmp_path, text: str, *args: str) -> str:
    (tmp_path / "r.yaml").write_text(text, encoding="utf-8")
    proc = run_cli("lint", str(tmp_path / "r.yaml"), *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("fmt", ["text", "github"])
def test_a_hostile_key_is_shown_escaped_in_text_and_github_output(tmp_path, fmt):
    out = _lint_output(tmp_path, RECIPE + '"k\\e[2J\\u202e\\nforged": 1\n', "--format", fmt)
    assert "\x1b" not in out and "\u202e" not in out
    assert "forged" in out and "\nforged" not in out  # the key's newline does not start a line


def test_explain_shows_a_hostile_display_text_escaped(tmp_path):
    (tmp_path / "r.yaml").write_text(RECIPE.replace("model: tiny-moe", 'model: {base: tiny-moe, display: "d\\e[2J\\u202e\\nX"}'))
    proc = run_cli("explain", str(tmp_path / "r.yaml"))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("r: d\\x1b[2J\\u202e\\nX on 2x")


# --- what reaches a generated file --------------------------------------------------------------

@pytest.mark.parametrize("path", ["recipes/x\ntouch y #.yaml", "recipes/x coding=shift_jis y.yaml",
                                  "recipes/# -*- coding: latin-1 -*-.yaml", "recipes/$(id)`id`;'\".yaml",
                                  "recipes/ü\u202e\x1b.yaml"])
def test_a_header_line_carries_no_raw_input_whatever_the_file_name(path):
    text = header.stamp_comment("body\n", path, "0" * 16)
    lines = text.split("\n")
    assert lines[3:] == ["body", ""]  # three header lines, then the body: the name made no line
    assert not any(PEP263.match(line) for line in lines[:3])  # and no encoding declaration
    assert all(c.isascii() and c.isprintable() for c in lines[1])
    assert not set("$`;'\"\\=:") & set(lines[1].split(" source ")[1])


def test_header_paths_are_percent_encoded_reversibly():
    from urllib.parse import unquote
    name = "recipes/a b\n=c:ü.yaml"
    assert header_path(name) == "recipes/a b%0A%3Dc%3A%C3%BC.yaml"
    assert unquote(header_path(name)) == name
    assert header_path("recipes/qwen3-30b_a3b.v2+x@y~z,w.yaml") == "recipes/qwen3-30b_a3b.v2+x@y~z,w.yaml"


def test_a_template_that_prints_a_value_without_an_escaper_fails_the_compile():
    env = render.env()
    with pytest.raises(render.EmitError, match="without an escaper"):
        env.from_string("x = {{ v }}").render(v="plain")
    with pytest.raises(render.EmitError):
        env.from_string("x = {{ v }}").render(v=None)
    with pytest.raises(render.EmitError):
        env.from_string("x = {{ v }}").render(v=True)  # a bool is not a number: pyrepr says True
    assert env.from_string("{{ n }} {{ f }} {{ s | pyrepr }}").render(n=3, f=0.5, s="a'b") == "3 0.5 \"a'b\""


@pytest.mark.parametrize("escaper,bad", [
    ("token", "a b"), ("token", "a;b"), ("token", "a\nb"), ("token", ""), ("token", "$x"),
    ("ident", "1a"), ("ident", "a-b"), ("ident", "import"), ("ident", "a.b c"),
    ("envname", "A=B"), ("envname", "1A"), ("envname", "A.B"),
])
def test_restricted_escapers_refuse_what_their_context_cannot_hold(escaper, bad):
    with pytest.raises(render.EmitError):
        getattr(render, escaper)(bad)


def test_restricted_escapers_pass_what_the_schema_allows():
    assert render.token("qwen3-30b_a3b.v2") == "qwen3-30b_a3b.v2"
    assert render.token("1-02:30:00") == "1-02:30:00"
    assert render.ident("megatron.bridge.recipes.qwen") == "megatron.bridge.recipes.qwen"
    assert render.shvar("MY_VAR") == "${MY_VAR}"


def test_a_shell_word_refuses_nul():
    with pytest.raises(render.EmitError):
        render.shquote("a\x00b")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_docstring_text_reads_back_exactly_inside_a_triple_quoted_literal(text):
    literal = '"""' + render.pydoc(text) + '"""'
    assert ast.literal_eval(literal) == text


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_comment_text_stays_on_its_line(text):
    comment = render.pycomment(text)
    tokens = list(tokenize.generate_tokens(io.StringIO(f"x = 1  # {comment}\n").readline))
    assert [t.type for t in tokens] == [tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.COMMENT,
                                        tokenize.NEWLINE, tokenize.ENDMARKER]


def test_emit_refuses_python_that_would_not_compile_from_its_bytes():
    with pytest.raises(render.EmitError, match="shift_jis"):
        render.verify_python("train.py", "# x\n# coding=shift_jis\nx = 1\n")
    with pytest.raises(render.EmitError, match="does not compile"):
        render.verify_python("train.py", '"""\\N"""\n')
    render.verify_python("train.py", "# -*- coding: utf-8 -*-\nx = 1\n")  # UTF-8 may be declared


# --- where files are written -------------------------------------------------------------------

@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", "a\\b", "a b", "", "x" * 81, "a\n"])
def test_the_name_must_be_one_visible_folder_name(tmp_path, name):
    out = _lint_output(tmp_path, RECIPE + f"name: {name!r}\n".replace("'", '"').replace('\\\\', '\\\\'))
    assert "r.yaml:5:7: error [SCHEMA] `name`" in out


@pytest.mark.parametrize("name", ["a", "A.b_c-1", "x" * 80, "-x", "_x", "1.2"])
def test_names_the_schema_accepts(tmp_path, name):
    (tmp_path / "r.yaml").write_text(RECIPE + f'name: "{name}"\n')
    assert run_cli("lint", str(tmp_path / "r.yaml")).returncode == 0


def _project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE)
    outside = tmp_path / "outside"
    outside.mkdir()
    return outside


@pytest.mark.parametrize("link", ["generated", "generated/r"])
def test_compile_refuses_to_write_through_a_committed_symbolic_link(tmp_path, link):
    outside = _project(tmp_path)
    if link == "generated/r":
        (tmp_path / "generated").mkdir()
    os.symlink(outside, tmp_path / link)
    proc = run_cli("compile", "recipes/r.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"recipes/r.yaml: error [WRITE] refusing to write through the symbolic link {tmp_path / link}" \
        in proc.stdout + proc.stderr
    assert list(outside.iterdir()) == []  # nothing written where the link points
    assert sorted(p.name for p in (tmp_path / "generated").iterdir()) == ([] if link == "generated" else ["r"])


def test_compile_writes_normally_without_links(tmp_path):
    _project(tmp_path)
    proc = run_cli("compile", "recipes/r.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "generated" / "r" / "train.py").is_file()


@pytest.mark.parametrize("output", ["../elsewhere", "/tmp/elsewhere", "gen/../../elsewhere", ""])
def test_a_committed_pyproject_cannot_send_output_outside_the_project(tmp_path, output):
    _project(tmp_path)
    (tmp_path / "pyproject.toml").write_text(f'[tool.mocompile]\noutput = "{output}"\n')
    proc = run_cli("compile", "recipes/r.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "[tool.mocompile] output must be a folder inside the project" in proc.stderr
    assert not (tmp_path.parent / "elsewhere").exists()


def test_a_pyproject_output_inside_the_project_is_used(tmp_path):
    _project(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.mocompile]\noutput = "build/gen"\n')
    assert run_cli("compile", "recipes/r.yaml", cwd=tmp_path).returncode == 0
    assert (tmp_path / "build" / "gen" / "r" / "train.py").is_file()


def test_every_committed_generated_python_file_compiles_from_its_bytes():
    files = sorted((ROOT / "generated").glob("*/*.py"))
    assert files
    for path in files:
        render.verify_python(str(path), path.read_bytes().decode("utf-8"))


@pytest.mark.parametrize("value", ["\r", "a\rb", "a\r\nb"])
def test_a_carriage_return_in_a_value_round_trips_and_check_calls_the_files_current(tmp_path, value):
    """Found by the injection fuzzer: the files were read back with universal newlines, so a CR in an
    environment value read as LF and `check` called freshly compiled files hand-edited."""
    import json as _json
    _project(tmp_path)
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE + f"launch: {{env: {{MY_VAR: {_json.dumps(value)}}}}}\n")
    assert run_cli("compile", "recipes/r.yaml", cwd=tmp_path).returncode == 0
    check = run_cli("check", "recipes/r.yaml", cwd=tmp_path)
    assert check.returncode == 0, check.stdout
    again = run_cli("compile", "recipes/r.yaml", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr  # not refused as a hand edit


def test_a_link_anywhere_on_the_way_inside_the_project_is_refused(tmp_path):
    """`build` a link, output `build/gen`: neither the output folder nor the target is the link itself."""
    outside = _project(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.mocompile]\noutput = "build/gen"\n')
    os.symlink(outside, tmp_path / "build")
    proc = run_cli("compile", "recipes/r.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and f"symbolic link {tmp_path / 'build'}" in proc.stdout + proc.stderr
    assert list(outside.iterdir()) == []
