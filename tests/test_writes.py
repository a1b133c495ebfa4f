"""Output writes survive concurrency and interruption, with real `mocompile compile` processes.

Two versions of the same recipe (seed 1 = OLD, seed 2 = NEW) compile into one output folder.
Whatever happens (two writers at once, a reader polling meanwhile, SIGKILL in the middle of
writing), every generated file is byte-for-byte the OLD or the NEW version, the folder as a
whole is one of the two, and the next run cleans up after a killed one.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "tiny-moe-h100x2.yaml"
NAME = "tiny-moe-h100x2"

# The child is the real CLI; for the kill test it announces its first fsync (the write phase
# has begun) and each fsync takes 30 ms longer, so the kill lands among the file writes.
CHILD = """
import os, sys, time
if os.environ.get("SLOW_WRITES"):
    real = os.fsync
    def slow(fd, _first=[True]):
        if _first:
            _first.clear()
            print("writing", flush=True)
        time.sleep(0.03)
        real(fd)
    os.fsync = slow
from mocompile.cli import main
sys.exit(main(sys.argv[1:]))
"""


def compile_proc(out: Path, seed: int, slow: bool = False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "compiler"))
    env.pop("MOCOMPILE_DEBUG", None)
    if slow:
        env["SLOW_WRITES"] = "1"
    return subprocess.Popen([sys.executable, "-c", CHILD, "compile", str(RECIPE), "-o", str(out),
                             "--set", f"training.seed={seed}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_compile(out: Path, seed: int) -> None:
    proc = compile_proc(out, seed)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stdout + stderr


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def versions(tmp_path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The complete OLD and NEW output sets, each made by a real compile into the test's own output folder
    (``tmp_path / "out"``: the launchers name the folder they were written to, so each test makes its own)."""
    out = tmp_path / "out"
    run_compile(out, 1)
    old = snapshot(out / NAME)
    run_compile(out, 2)
    new = snapshot(out / NAME)
    shutil.rmtree(out)
    assert old.keys() == new.keys() and len(old) >= 5
    assert all(old[f] != new[f] for f in ("train.py", "mocompile.lock.json")), "seed must change the output"
    return old, new


def whole(folder: Path, old: dict[str, bytes], new: dict[str, bytes]) -> str:
    """'old' or 'new' when ``folder`` holds exactly one version; fails the test otherwise."""
    got = snapshot(folder)
    for name, data in got.items():
        if data not in (old.get(name), new.get(name)):
            import difflib
            diff = difflib.unified_diff(old[name].decode().splitlines(), data.decode("utf-8", "replace").splitlines(),
                                        lineterm="")
            raise AssertionError(f"{name} is neither version ({len(data)} bytes); against OLD:\n"
                                 + "\n".join(list(diff)[:30]))
    assert got in (old, new), f"mixed folder: {sorted(n for n in got if got[n] == old.get(n))} old, " \
                              f"{sorted(n for n in got if got[n] == new.get(n))} new"
    return "old" if got == old else "new"


def leftovers(out: Path) -> list[str]:
    return [p.name for p in out.iterdir() if p.name != NAME]


def test_sigkill_while_writing_leaves_the_old_or_the_new_folder(tmp_path, versions):
    old, new = versions
    out = tmp_path / "out"
    run_compile(out, 1)
    rng = random.Random(13)
    seen = {"old": 0, "new": 0}
    killed_mid_write = 0
    for _ in range(8):
        proc = compile_proc(out, 2 if whole(out / NAME, old, new) == "old" else 1, slow=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"
        time.sleep(rng.uniform(0.0, 0.25))  # six files at 30 ms each: anywhere in the write phase
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        if proc.returncode == -signal.SIGKILL and leftovers(out):
            killed_mid_write += 1
        seen[whole(out / NAME, old, new)] += 1
    assert killed_mid_write >= 4, "the kills did not land while files were being written"
    run_compile(out, 2)  # the next run sweeps what the killed ones left
    assert whole(out / NAME, old, new) == "new"
    assert leftovers(out) == []


def test_two_writers_and_a_reader_never_see_a_mixed_or_partial_file(tmp_path, versions):
    old, new = versions
    out = tmp_path / "out"
    run_compile(out, 1)
    stop = threading.Event()
    reads: list[int] = []
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            for name in old:
                try:
                    data = (out / NAME / name).read_bytes()
                except FileNotFoundError:
                    bad.append(f"{name} missing")
                    continue
                reads.append(1)
                if data not in (old[name], new[name]):
                    bad.append(f"{name}: {len(data)} bytes, neither version")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for round_ in range(6):
            procs = [compile_proc(out, 1 + (round_ + i) % 2) for i in range(2)]
            for proc in procs:
                stdout, stderr = proc.communicate(timeout=120)
                assert proc.returncode == 0, stdout + stderr
            whole(out / NAME, old, new)
            assert leftovers(out) == []
    finally:
        stop.set()
        thread.join()
    assert not bad, bad[:5]
    assert len(reads) > 100


def test_hand_edit_is_kept_and_named(tmp_path, versions):
    old, _ = versions
    out = tmp_path / "out"
    run_compile(out, 1)
    edited = out / NAME / "torchrun.sh"
    edited.write_bytes(old["torchrun.sh"] + b"# my note\n")
    proc = compile_proc(out, 2)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "hand-edited" in stdout + stderr and str(edited) in stdout + stderr
    assert edited.read_bytes() == old["torchrun.sh"] + b"# my note\n"
    assert snapshot(out / NAME)["train.py"] == old["train.py"]


def test_a_file_where_the_folder_goes_is_not_replaced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / NAME).write_text("mine\n")
    proc = compile_proc(out, 1)
    stdout, stderr = proc.communicate(timeout=120)
    # the file system is in the way, not a hand edit: WRITE, exit 2 (no --force hint)
    assert proc.returncode == 2 and "exists and is not a folder" in stdout + stderr and "WRITE" in stdout + stderr
    assert (out / NAME).read_text() == "mine\n"


def test_writer_swaps_folders_in_one_step_here():
    """The atomic exchange is what the tests above rely on; say so if this system lacks it."""
    from mocompile.emit import writer
    if sys.platform != "linux":
        pytest.skip("renameat2 is Linux-only; elsewhere the two-step rename is used")
    assert writer._renameat2() is not None


def test_leftover_temporary_folder_is_swept(tmp_path, versions):
    old, new = versions
    out = tmp_path / "out"
    run_compile(out, 1)
    stale = out / f".{NAME}.abc123"
    shutil.copytree(out / NAME, stale)
    (stale / "train.py").write_bytes(b"half")
    run_compile(out, 2)
    assert not stale.exists() and whole(out / NAME, old, new) == "new"


@pytest.mark.skipif(sys.platform != "linux", reason="renameat2 is Linux-only")
def test_exchange_swaps_two_folders_and_reports_a_failure(tmp_path, monkeypatch):
    from mocompile.emit import writer
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "f").write_text("A")
    (b / "f").write_text("B")
    assert writer._exchange(str(a), str(b)) is True
    assert ((a / "f").read_text(), (b / "f").read_text()) == ("B", "A")
    with pytest.raises(OSError) as exc:  # a failed exchange (no such folder) is an error, not a success,
        writer._exchange(str(a), str(tmp_path / "missing"))
    assert exc.value.errno == errno.ENOENT  # with the C library's own reason (errno captured by ctypes)
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the current folder (AT_FDCWD)
    assert writer._exchange("a", "b") is True and (a / "f").read_text() == "A"


def test_a_file_system_without_exchange_falls_back_to_the_two_step_rename(tmp_path, monkeypatch, versions):
    """renameat2 answering EINVAL (the file system cannot exchange) is no success: the folder is still replaced."""
    import ctypes
    import errno as errno_

    from mocompile.emit import writer

    def refuses(*_args):
        ctypes.set_errno(errno_.EINVAL)
        return -1

    monkeypatch.setattr(writer, "_renameat2", lambda: refuses)
    old, new = versions
    out = tmp_path / "out"
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in old.items()}) is None
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in new.items()}) is None
    assert whole(out / NAME, old, new) == "new"


def test_a_failed_write_is_reported_and_leaves_no_temporary_folder(tmp_path, monkeypatch, versions):
    from mocompile.emit import writer

    old, new = versions
    out = tmp_path / "out"
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in old.items()}) is None

    def disk_full(tmp, files):
        (Path(tmp) / "train.py").write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_fill", disk_full)
    problem = writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in new.items()})
    assert problem and problem.startswith("could not write") and "No space left" in problem
    assert whole(out / NAME, old, new) == "old"
    assert sorted(p.name for p in out.iterdir()) == [NAME]


def test_without_an_atomic_exchange_the_two_step_rename_replaces_the_folder_whole(tmp_path, monkeypatch, versions):
    """Where renameat2 cannot exchange (other systems, some file systems): old folder aside, new one in, old removed."""
    from mocompile.emit import writer
    old, new = versions
    out = tmp_path / "out"
    monkeypatch.setattr(writer, "_exchange", lambda a, b: False)
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in old.items()}) is None
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in new.items()}) is None
    assert whole(out / NAME, old, new) == "new"
    assert sorted(p.name for p in out.iterdir()) == [NAME]  # nothing left aside


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-step rename"])
def test_a_cleanup_that_fails_after_the_swap_does_not_fail_the_write_and_the_next_run_sweeps_it(
        tmp_path, monkeypatch, versions, exchange):
    """Once the new folder is in place the write has succeeded: failing to delete the old one
    (a busy NFS file, a permission) must not turn a good compile into an error. What is left
    is a `.name.*` folder, which the next run removes."""
    from mocompile.emit import writer

    old, new = versions
    out = tmp_path / "out"
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in old.items()}) is None
    if not exchange:
        monkeypatch.setattr(writer, "_exchange", lambda a, b: False)
    real_rmdir = os.rmdir

    def busy(*args, **kwargs):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(os, "rmdir", busy)
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in new.items()}) is None
    assert whole(out / NAME, old, new) == "new"
    assert any(p.name.startswith(f".{NAME}.") for p in out.iterdir())  # the old folder could not go
    monkeypatch.setattr(os, "rmdir", real_rmdir)
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in old.items()}) is None
    assert sorted(p.name for p in out.iterdir()) == [NAME] and whole(out / NAME, old, new) == "old"


def test_a_c_library_without_renameat2_means_the_two_step_rename(tmp_path, monkeypatch, versions):
    """glibc before 2.28 has no renameat2 symbol: the writer must notice (None), not crash, and still
    replace the folder whole."""
    import ctypes

    from mocompile.emit import writer

    class OldLibc:
        def __init__(self, *args, **kwargs):
            pass

        def __getattr__(self, name):
            raise AttributeError(name)

    monkeypatch.setattr(ctypes, "CDLL", OldLibc)
    assert writer._renameat2() is None
    old, new = versions
    out = tmp_path / "out"
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in old.items()}) is None
    assert writer.write_outputs(str(out), NAME, {k: v.decode() for k, v in new.items()}) is None
    assert whole(out / NAME, old, new) == "new"


def test_generated_files_get_exact_modes_whatever_the_umask(tmp_path, versions):
    """Launchers are executable by everyone, everything else read-only for others, the folder listable:
    modes are set, not inherited from the umask of whoever ran the compile (a CI runner's 077 would
    otherwise leave a launcher nobody else can run)."""
    from mocompile.emit import writer

    old, _ = versions
    saved = os.umask(0o077)
    try:
        assert writer.write_outputs(str(tmp_path), NAME, {k: v.decode() for k, v in old.items()}) is None
    finally:
        os.umask(saved)
    folder = tmp_path / NAME
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    for f in folder.iterdir():
        want = 0o755 if f.name.endswith((".sh", ".sbatch")) else 0o644
        assert stat.S_IMODE(f.stat().st_mode) == want, f.name
