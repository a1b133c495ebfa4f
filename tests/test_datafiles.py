"""The parse caches of `datafiles`: a cached parse is used only for exactly the bytes and Python it came from,
and anything unreadable falls back to parsing; pruning survives races and bad files."""

from __future__ import annotations

import json
import os
import sys
import time

from mocompile import datafiles


def test_a_remembered_parse_is_read_back_for_the_same_bytes_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    raw = b"a: 1\n"
    assert datafiles.parsed("k", raw) is None
    datafiles.remember("k", raw, {"a": 1})
    assert datafiles.parsed("k", raw) == {"a": 1}
    assert datafiles.parsed("other", raw) is None and datafiles.parsed("k", b"a: 2\n") is None
    entry = datafiles._content_entry("k", raw)
    stored = json.loads(open(entry).read())
    assert stored["python"] == list(sys.version_info[:2])
    # another Python's entry, or one whose text differs (a CRC collision), is not used
    for bad in (dict(stored, python=[2, 7]), dict(stored, python=[99, 0]), dict(stored, text="a: 1\n\n"),
                dict(stored, text="a: 0\n")):
        open(entry, "w").write(json.dumps(bad))
        assert datafiles.parsed("k", raw) is None, bad
    open(entry, "w").write("{torn")
    assert datafiles.parsed("k", raw) is None


def test_bytes_that_are_not_utf8_are_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    datafiles.remember("k", b"\xff\xfe", {"a": 1})  # no exception, no entry
    assert not os.path.exists(datafiles._content_entry("k", b"\xff\xfe"))


def test_load_yaml_writes_its_cache_reads_it_back_and_parses_again_when_it_is_unreadable(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = tmp_path / "d.yaml"
    src.write_text("x: [1, 2]\n")
    assert datafiles.load_yaml(str(src)) == {"x": [1, 2]}
    cache = datafiles._cache_path(str(src))
    assert cache and os.path.exists(cache)  # the parse was cached
    open(cache, "w").write(json.dumps({"x": "from the cache"}))
    assert datafiles.load_yaml(str(src)) == {"x": "from the cache"}  # ... and is what a second load reads
    open(cache, "w").write("{torn")
    assert datafiles.load_yaml(str(src)) == {"x": [1, 2]}
    src.write_text("x: [1, 2, 3]\n")  # another size: another key
    assert datafiles.load_yaml(str(src)) == {"x": [1, 2, 3]}


def test_pruning_measures_age_by_difference_and_skips_what_vanishes_or_cannot_be_signalled(tmp_path, monkeypatch):
    folder = tmp_path / "c"
    folder.mkdir()
    old = folder / f"e.json.{os.getppid()}.tmp"  # a live writer's, last written long ago
    old.write_text("{")
    half = int(time.time()) // 2  # the epoch's half-way point: far more than an hour ago
    os.utime(old, (half, half))
    vanishing = folder / f"v.json.{os.getppid()}.tmp"
    vanishing.write_text("{")
    stale = folder / "z.json.999999999.tmp"  # no such process
    stale.write_text("{")
    real_lstat = os.lstat

    def lstat(path, *a, **k):
        if str(path).endswith(vanishing.name):
            raise FileNotFoundError(path)  # removed by another process between listdir and lstat
        return real_lstat(path, *a, **k)

    monkeypatch.setattr(datafiles.os, "lstat", lstat)
    datafiles.prune(str(folder))
    assert not old.exists() and not stale.exists() and vanishing.exists()
    datafiles._remove(str(folder / "gone.json"))  # a file already gone is no error


def test_a_writer_process_owned_by_someone_else_counts_as_alive(monkeypatch):
    def kill(pid, sig):
        raise PermissionError(1, "not yours")

    monkeypatch.setattr(datafiles.os, "kill", kill)
    assert datafiles._alive(12345)
