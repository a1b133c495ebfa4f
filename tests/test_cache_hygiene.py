"""The caches under $XDG_CACHE_HOME/mocompile stay clean and bounded: a failed or killed write leaves no
temporary file behind for long, nothing is ever half-written in place, and a folder keeps at most
CACHE_ENTRIES entries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from conftest import ROOT, run_cli
from mocompile import datafiles

RECIPE = ROOT / "recipes" / "tiny-moe-h100x2.yaml"


def test_a_write_that_fails_leaves_neither_a_temporary_file_nor_a_half_written_entry(tmp_path):
    target = tmp_path / "c" / "entry.json"
    datafiles.write_json_atomic(str(target), {"x": object()})  # not JSON: json.dump raises mid-write
    assert not target.exists() and os.listdir(tmp_path / "c") == []


def test_a_writer_killed_mid_write_leaves_the_entry_absent_and_the_next_run_sweeps_its_temporary(tmp_path):
    cache = tmp_path / "xdg"
    plans = cache / "mocompile" / "plans"
    target = plans / "killed.json"
    child = subprocess.Popen([sys.executable, "-c", (
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(ROOT / 'compiler')!r})\n"
        "from mocompile import datafiles\n"
        "def slow(obj, fh):\n"
        "    fh.write('{\"partial\": '); fh.flush(); time.sleep(120)\n"
        "json.dump = slow\n"
        f"datafiles.write_json_atomic({str(target)!r}, {{'a': 1}})\n")])
    tmp = plans / f"killed.json.{child.pid}.tmp"
    deadline = time.time() + 60
    while not tmp.exists() and time.time() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert tmp.exists() and not target.exists()  # the kill left its temporary file, never a torn entry
    # the next real run that writes to that cache folder sweeps it (its writer is gone)
    proc = run_cli("lint", str(RECIPE), env={"XDG_CACHE_HOME": str(cache), "MOCOMPILE_NO_CACHE": ""})
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert not tmp.exists()
    assert any(name.endswith(".json") for name in os.listdir(plans))  # the run cached its own verdict
    assert not [p for p in cache.rglob("*.tmp")]


def test_a_temporary_file_of_a_live_writer_is_left_alone_until_it_is_an_hour_old(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    live = folder / f"e.json.{os.getppid()}.tmp"  # the parent of this test process is alive
    live.write_text("{")
    datafiles.prune(str(folder))
    assert live.exists()
    old = time.time() - datafiles.STALE_TMP_S - 60
    os.utime(live, (old, old))
    datafiles.prune(str(folder))
    assert not live.exists()


def test_a_cache_folder_is_bounded_and_keeps_the_newest_entries(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    for i in range(25):
        entry = folder / f"{i:02d}.json"
        entry.write_text(json.dumps(i))
        os.utime(entry, (1_000_000 + i, 1_000_000 + i))
    datafiles.prune(str(folder), keep=20)
    left = sorted(p.name for p in folder.iterdir())
    assert left == [f"{i:02d}.json" for i in range(7, 25)]  # down to 9/10 of 20: the 18 newest
    datafiles.prune(str(folder), keep=20)  # within the bound: nothing more goes
    assert len(list(folder.iterdir())) == 18
