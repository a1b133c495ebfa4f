"""Write a recipe's artifacts so that readers only ever see a whole old or a whole new folder.

Why each step:
- the new files go into a private temporary folder beside the target, each flushed to disk,
  so a kill while writing leaves only that temporary folder behind (removed on the next run);
- the folder then *replaces* the target in one ``renameat2(RENAME_EXCHANGE)`` system call
  (Linux 3.15+): there is no instant at which ``generated/<name>/`` is missing, half-written
  or a mix of two runs. Elsewhere, a two-step rename is used (a kill between the steps
  leaves the old folder under ``.<name>.old.*``);
- an exclusive ``flock`` on the output folder itself serialises concurrent ``compile``
  processes, so the hand-edit check and the swap of one process are not interleaved with
  another's: the last writer wins, whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

from mocompile.emit.header import verify

EXECUTABLE = (".sh", ".sbatch")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _hand_edited(directory: str) -> list[str]:
    edited = []
    current = _current(directory)
    recorded = vendored(current.get("mocompile.lock.json", ""))
    for rel, text in sorted(current.items()):
        path = os.path.join(directory, rel)
        if rel in recorded:  # a file copied verbatim (no header to hold a checksum): the lock holds its sha256
            if hashlib.sha256(text.encode("utf-8")).hexdigest() != recorded[rel]:
                edited.append(path)
        elif verify(text) is not True:
            edited.append(path)
    return edited


def vendored(lock_text: str) -> dict[str, str]:
    """``{relative path: sha256}`` of the files a lock says were copied verbatim (a vendored model config), or
    nothing when the lock is missing or was edited (then its record proves nothing)."""
    if not lock_text or verify(lock_text) is not True:
        return {}
    try:
        mc = json.loads(lock_text).get("model_config") or {}
    except (ValueError, AttributeError):
        return {}
    return {mc["copy"]: mc["sha256"]} if isinstance(mc.get("copy"), str) and isinstance(mc.get("sha256"), str) else {}


def _current(directory: str) -> dict[str, str]:
    """Every file under ``directory`` (one level of sub-folders: hf_config/), keyed by its relative path."""
    files = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            files += [f"{name}/{sub}" for sub in os.listdir(path) if os.path.isfile(os.path.join(path, sub))]
        elif os.path.isfile(path):
            files.append(name)
    out = {}
    for rel in files:
        with open(os.path.join(directory, rel), encoding="utf-8", errors="replace", newline="") as fh:  # byte-exact
            out[rel] = fh.read()
    return out


@contextlib.contextmanager
def _locked(out_dir: str) -> Iterator[None]:
    """Hold an exclusive lock on the folder ``out_dir`` (advisory; other mocompile processes
    wait). Locking the folder itself leaves no lock file among the outputs."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no cross-process lock
        yield
        return
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _renameat2():  # type: ignore[no-untyped-def]
    """libc's renameat2, or None where the platform has none. The running process's own
    symbol table is searched (``dlopen(NULL)``): it holds the C library Python was linked
    with, found without running ``ldconfig`` and cheap enough to look up on every write."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically. False where the platform or file system cannot."""
    fn = _renameat2()
    if fn is None:
        return False
    if not fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):  # 0: done; -1: errno
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def _sweep(out_dir: str, name: str) -> None:
    """Remove temporary folders a killed run left behind (we hold the lock: none is live)."""
    for entry in os.listdir(out_dir):
        if entry.startswith(f".{name}.") and os.path.isdir(os.path.join(out_dir, entry)):
            shutil.rmtree(os.path.join(out_dir, entry), ignore_errors=True)


def _fill(tmp: str, files: dict[str, str]) -> None:
    for rel, text in sorted(files.items()):
        path = os.path.join(tmp, rel)
        if os.path.dirname(rel):
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(path, 0o755 if rel.endswith(EXECUTABLE) else 0o644)
    os.chmod(tmp, 0o755)


def _linked(out_dir: str, name: str) -> str | None:
    """The first symbolic link on the way to ``out_dir/name``, or None.

    Checked from the project root down (only ``out_dir`` and the target when the output
    lies outside the project): a committed link at ``generated/`` or ``generated/<name>``
    would otherwise make a compile on the reviewer's machine write, or swap a folder,
    wherever the link points."""
    from mocompile.project import find_root

    target = os.path.abspath(os.path.join(out_dir, name))
    root = find_root(os.path.abspath(out_dir) if os.path.isdir(out_dir) else os.getcwd()) or os.getcwd()
    root = os.path.abspath(root)
    if os.path.commonpath([root, target]) == root:
        parts = os.path.relpath(target, root).split(os.sep)
        steps = [os.path.join(root, *parts[: i + 1]) for i in range(len(parts))]
    else:
        steps = [os.path.abspath(out_dir), target]
    return next((p for p in steps if os.path.islink(p)), None)


def write_outputs(out_dir: str, name: str, files: dict[str, str], force: bool = False) -> str | None:
    """Replace ``out_dir/name`` with ``files``. Returns a problem message, or None.

    Refuses (unless ``force``) when a file there was edited by hand, so nothing the
    user wrote is lost. Unchanged output is left untouched.
    """
    target = os.path.join(out_dir, name)
    link = _linked(out_dir, name)
    if link is not None:
        return (f"refusing to write through the symbolic link {link} (-> {os.readlink(link)}): "
                "generated files are written only to real folders")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with _locked(out_dir):
            _sweep(out_dir, name)
            if os.path.isdir(target):
                if _current(target) == files:
                    return None
                edited = _hand_edited(target)
                if edited and not force:
                    return f"refusing to overwrite hand-edited file(s): {', '.join(edited)}"
            elif os.path.lexists(target):
                return f"{target} exists and is not a folder"
            tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir)
            try:
                _fill(tmp, files)
                if not os.path.isdir(target):
                    os.rename(tmp, target)
                elif _exchange(tmp, target):
                    shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old folder
                else:
                    old = tmp + ".old"
                    os.rename(target, old)
                    os.rename(tmp, target)
                    shutil.rmtree(old, ignore_errors=True)
            finally:
                if os.path.isdir(tmp):
                    shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        return f"could not write {target}: {exc}"
    return None
