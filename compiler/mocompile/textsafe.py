"""Make text from an untrusted recipe inert before it is printed or written.

A recipe is untrusted (the pre-commit hook runs on anyone's commit), and so are its file
name and every key and value in it. Two sinks need their own escaping, both kept here so
that every caller uses the same definition of "dangerous character":

- a terminal or CI log: control characters (ESC starts terminal control sequences, a
  newline forges a log line, CR overwrites one), Unicode format characters (bidirectional
  overrides that reorder what a reviewer reads) and line/paragraph separators;
- a generated file's header line: the same characters, plus anything that could form a
  Python source-encoding declaration (PEP 263) or a shell word.
"""

from __future__ import annotations

import re

# Characters a header path keeps as they are; everything else is percent-encoded, so a
# header line holds no quote, `$`, `;`, `=`, `:` (no "coding=" / "coding:"), control or non-ASCII.
_PATH_SAFE = "/._-+@~, "


def _escape_char(ch: str) -> str:
    """Python's own escape for one character: ``\\n``, ``\\x1b``, ``\\u202e``, ``\\U000e0001``."""
    return ch.encode("unicode_escape").decode("ascii")


def visible(text: object, keep: str = "") -> str:
    """``text`` with every control, format or separator character shown as a ``\\x..``
    escape, so it prints on one line and cannot drive a terminal. ``keep`` names characters
    the caller's own layout uses (e.g. ``"\\n"`` for multi-line output it built itself)."""
    s = str(text)
    if s.isprintable():  # fast path: nearly every string
        return s
    # Python's "printable" excludes exactly the dangerous classes: Cc control, Cf format (bidi
    # overrides, zero width), Zl/Zp line and paragraph separators, Cs lone surrogates, Co private
    # use, Cn unassigned, and every space but " " (a no-break space looks like one and is not).
    return "".join(_escape_char(c) if c not in keep and not c.isprintable() else c for c in s)


def header_path(path: str) -> str:
    """A file path for a generated file's header line: ASCII letters, digits and
    ``/._-+@~,`` and space as they are, every other byte percent-encoded (UTF-8).

    Why: the header sits on line 2 or 3 of every generated file. A raw newline there ends
    the comment and makes the rest a shell command; ``coding=shift_jis`` on line 2 of
    ``train.py`` would change the encoding Python decodes the file with. Percent-encoding is
    reversible, so the header still names the file unambiguously."""
    import urllib.parse  # only emission needs it: a plain lint never imports it

    return urllib.parse.quote(path, safe=_PATH_SAFE)


_TERMINAL_SGR = re.compile(r"\x1b\[[0-9;]*m")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def terminal(text: str) -> str:
    """Last line of defence for what mocompile writes to a terminal or log: control and
    bidi characters become escapes, except newline, tab and the colour (SGR) sequences
    mocompile's own text format emits. Field values are escaped with :func:`visible`
    before they are formatted; this catches whatever a message builder forgot."""
    out, pos = [], 0
    for m in _TERMINAL_SGR.finditer(text):
        out.append(_CONTROL.sub(lambda c: _escape_char(c.group()), text[pos:m.start()]))
        out.append(m.group())
        pos = m.end()
    out.append(_CONTROL.sub(lambda c: _escape_char(c.group()), text[pos:]))
    return "".join(out)
