"""`lint`'s whole-file verdict cache and its cold start: a hit is exactly the fresh verdict, any change
of the file, a base it extends, the compiler's data or its version gives a fresh one, and lint never
imports the emitters (jinja2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import ROOT, run_cli

TINY = (ROOT / "recipes" / "tiny-moe-h100x2.yaml").read_text()
BAD = TINY + "moe: {overlap: true, dispatcher: allgather}\n"          # OVL002: an error, exit 1
WARN = """schema: 1
model: moonlight-16b-a3b
hardware: {gpu: h100, nodes: 16}
goal: throughput
moe: {dispatcher: deepep}
parallelism: {ep: 16}
"""  # DSP006 (DeepEP across two nodes): a warning, exit 0


def lint(*args, cache, cwd=None, env=None, pythonpath=None):
    e = {"XDG_CACHE_HOME": str(cache), **(env or {})}
    if pythonpath is None:
        return run_cli("lint", *map(str, args), cwd=cwd, env=e)
    e = {**os.environ, **e, "PYTHONPATH": str(pythonpath)}
    e.pop("MOCOMPILE_NO_CACHE", None)
    return subprocess.run([sys.executable, "-m", "mocompile", "lint", *map(str, args)], cwd=cwd or ROOT, env=e,
                          capture_output=True, text=True, timeout=120)


def entries(cache):
    return sorted((cache / "mocompile" / "lint").glob("*.json"))


def outcome(proc):
    return proc.returncode, proc.stdout, proc.stderr


def test_a_cached_verdict_is_the_fresh_verdict(tmp_path):
    cache = tmp_path / "cache"
    files = []
    for name, text in (("bad.yaml", BAD), ("warn.yaml", WARN), ("tiny.yaml", TINY)):
        (tmp_path / name).write_text(text)
        files.append(tmp_path / name)
    for fmt in ("text", "json", "github", "sarif"):
        first = lint(*files, "--format", fmt, cache=cache)
        assert first.returncode == 1 and "OVL002" in first.stdout and "DSP006" in first.stdout
        assert len(entries(cache)) == 3
        hit = lint(*files, "--format", fmt, cache=cache)
        fresh = lint(*files, "--format", fmt, cache=cache, env={"MOCOMPILE_NO_CACHE": "1"})
        assert outcome(hit) == outcome(first) == outcome(fresh), fmt
    for name in ("warn.yaml", "tiny.yaml"):  # alone: exit 0, and --strict turns the warning into exit 1
        first = [outcome(lint(tmp_path / name, *s, cache=cache)) for s in ((), ("--strict",))]
        again = [outcome(lint(tmp_path / name, *s, cache=cache)) for s in ((), ("--strict",))]
        fresh = [outcome(lint(tmp_path / name, *s, cache=cache, env={"MOCOMPILE_NO_CACHE": "1"}))
                 for s in ((), ("--strict",))]
        assert first == again == fresh
    assert first[0][0] == 0 and first[1][0] == 0  # tiny: clean even when strict
    assert outcome(lint(tmp_path / "warn.yaml", cache=cache))[0] == 0  # a warning alone exits 0
    assert [outcome(lint(tmp_path / "warn.yaml", "--strict", cache=cache))[0]] == [1]


def test_overrides_and_the_path_are_part_of_the_key(tmp_path):
    cache = tmp_path / "cache"
    (tmp_path / "tiny.yaml").write_text(TINY)
    clean = lint(tmp_path / "tiny.yaml", cache=cache)
    bad = lint(tmp_path / "tiny.yaml", "--set", "moe.overlap=true", "--set", "moe.dispatcher=allgather", cache=cache)
    assert clean.returncode == 0 and bad.returncode == 1 and "OVL002" in bad.stdout
    assert outcome(lint(tmp_path / "tiny.yaml", cache=cache)) == outcome(clean)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tiny.yaml").write_text(BAD)
    rel = lint("tiny.yaml", cache=cache, cwd=tmp_path / "sub")  # same path text, another folder
    assert rel.returncode == 1 and "tiny.yaml:" in rel.stdout


def test_a_changed_file_gives_a_fresh_verdict(tmp_path):
    cache = tmp_path / "cache"
    path = tmp_path / "r.yaml"
    path.write_text(TINY)
    assert lint(path, cache=cache).returncode == 0
    path.write_text(BAD)
    proc = lint(path, cache=cache)
    assert proc.returncode == 1 and "OVL002" in proc.stdout
    path.write_text(TINY)
    assert outcome(lint(path, cache=cache)) == outcome(lint(path, cache=cache, env={"MOCOMPILE_NO_CACHE": "1"}))


def test_a_changed_base_gives_a_fresh_verdict(tmp_path):
    cache = tmp_path / "cache"
    (tmp_path / ".git").mkdir()  # the project root, so that the base may be reached
    base, child = tmp_path / "base.yaml", tmp_path / "child.yaml"
    base.write_text(TINY)
    child.write_text("extends: base.yaml\nname: child\n")
    assert lint(child, cache=cache).returncode == 0
    assert lint(child, cache=cache).returncode == 0
    base.write_text(BAD)
    proc = lint(child, cache=cache)
    assert proc.returncode == 1 and "OVL002" in proc.stdout
    base.unlink()
    proc = lint(child, cache=cache)
    assert proc.returncode == 2 and "missing file" in proc.stdout + proc.stderr


def test_no_entry_for_input_errors_and_none_without_the_cache(tmp_path):
    cache = tmp_path / "cache"
    path = tmp_path / "r.yaml"
    path.write_text(TINY + "bogus_key: 1\n")
    assert lint(path, cache=cache).returncode == 2
    assert entries(cache) == []
    path.write_text(TINY)
    assert lint(path, cache=cache, env={"MOCOMPILE_NO_CACHE": "1"}).returncode == 0
    assert entries(cache) == []


def test_a_broken_entry_is_linted_again(tmp_path):
    cache = tmp_path / "cache"
    path = tmp_path / "r.yaml"
    path.write_text(BAD)
    first = lint(path, cache=cache)
    for e in entries(cache):
        e.write_text('{"deps": [], "diagnostics": [{"rule": 1}]}')
    assert outcome(lint(path, cache=cache)) == outcome(first)
    for e in entries(cache):
        e.write_text("not json")
    assert outcome(lint(path, cache=cache)) == outcome(first)


def _package_copy(tmp_path):
    dest = tmp_path / "pkg"
    shutil.copytree(ROOT / "compiler" / "mocompile", dest / "mocompile",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_changed_compiler_data_or_version_gives_a_fresh_verdict(tmp_path):
    cache = tmp_path / "cache"
    pkg = _package_copy(tmp_path)
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    first = lint(path, cache=cache, pythonpath=pkg)
    assert first.returncode == 1 and "OVL002" in first.stdout and len(entries(cache)) == 1
    # the rule catalogue (data) changes a message: the next lint says the new one
    catalogue = pkg / "mocompile" / "rules" / "catalogue.yaml"
    text = catalogue.read_text()
    at = text.index("- id: OVL002")
    msg = text.index("message: ", at)
    catalogue.write_text(text[:msg] + "message: CHANGED-MESSAGE " + text[msg + len("message: "):])
    proc = lint(path, cache=cache, pythonpath=pkg)
    assert "CHANGED-MESSAGE" in proc.stdout and len(entries(cache)) == 2
    # a new compiler version: a fresh entry, and the same verdict as a fresh lint
    init = pkg / "mocompile" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "9.9.9+'))
    again = lint(path, cache=cache, pythonpath=pkg)
    assert len(entries(cache)) == 3
    assert outcome(again) == outcome(lint(path, cache=cache, pythonpath=pkg, env={"MOCOMPILE_NO_CACHE": "1"}))
    # code changes count as well (same size, same mtime would not be enough: the content is hashed)
    steptime = pkg / "mocompile" / "memory.py"
    st = steptime.stat()
    steptime.write_text(steptime.read_text().replace("WORKSPACE_GIB = 0.5", "WORKSPACE_GIB = 0.6"))
    os.utime(steptime, ns=(st.st_atime_ns, st.st_mtime_ns))
    lint(path, cache=cache, pythonpath=pkg)
    assert len(entries(cache)) == 4


MODULES = ("import sys, json\nfrom mocompile.cli import main\ncode = main(sys.argv[1:])\n"
           "print(json.dumps(sorted(sys.modules)))\n")


def _modules_after(args, cache, env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT / "compiler"), XDG_CACHE_HOME=str(cache), **(env or {}))
    proc = subprocess.run([sys.executable, "-c", MODULES, *args], env=e, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_lint_imports_no_emitter_and_a_hit_no_loader_schema_or_planner(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(WARN)
    cache = tmp_path / "cache"
    miss = _modules_after(["lint", str(path)], cache)
    assert not {m for m in miss if m.split(".")[0] in ("jinja2", "markupsafe") or m.startswith("mocompile.emit")}
    assert "importlib.metadata" not in miss, "cerberus is imported without importlib.metadata"
    hit = _modules_after(["lint", str(path)], cache)
    heavy = {m for m in hit if m.split(".")[0] in ("jinja2", "cerberus") or m.startswith(
        ("ruamel.yaml", "mocompile.resolve", "mocompile.emit", "mocompile.pipeline", "mocompile.schema",
         "mocompile.steptime", "mocompile.rules"))}
    assert not heavy, heavy


def test_the_lint_cache_finds_the_project_root_as_the_loader_does(tmp_path):
    from mocompile import lintcache, load
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "pyproject.toml").write_text("")
    for p in (tmp_path / "a" / "b" / "x.yaml", tmp_path / "x.yaml", ROOT / "recipes" / "tiny-moe-h100x2.yaml"):
        assert lintcache.project_root(str(p)) == load.project_root(str(p))


def test_the_schema_passes_cerberus_own_check():
    """The validator skips cerberus' check of the schema at run time; here it runs."""
    import cerberus
    from mocompile import schema
    for which in ("intent", "model"):
        checked = schema.checked_validator(which)  # raises SchemaError on a bad schema
        assert dict(checked.schema.schema) == dict(schema._validator(which).schema.schema)
    assert cerberus.__version__ not in ("", "unknown")
