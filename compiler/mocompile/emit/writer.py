"""Write a recipe's artifacts atomically: all files appear together or none do."""

from __future__ import annotations

import os
import shutil
import tempfile

from mocompile.emit.header import verify

EXECUTABLE = (".sh", ".sbatch")


def _hand_edited(directory: str) -> list[str]:
    edited = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as fh:
                if verify(fh.read()) is not True:
                    edited.append(path)
    return edited


def write_outputs(out_dir: str, name: str, files: dict[str, str], force: bool = False) -> str | None:
    """Replace ``out_dir/name`` with ``files``. Returns a problem message, or None.

    Refuses (unless ``force``) when a file there was edited by hand, so nothing the
    user wrote is lost. Unchanged output is left untouched.
    """
    target = os.path.join(out_dir, name)
    if os.path.isdir(target):
        current = {f: open(os.path.join(target, f), encoding="utf-8", errors="replace").read()
                   for f in os.listdir(target) if os.path.isfile(os.path.join(target, f))}
        if current == files:
            return None
        edited = _hand_edited(target)
        if edited and not force:
            return f"refusing to overwrite hand-edited file(s): {', '.join(edited)}"
    elif os.path.exists(target):
        return f"{target} exists and is not a folder"
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir)
    try:
        for rel, text in sorted(files.items()):
            path = os.path.join(tmp, rel)
            with open(path, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
            os.chmod(path, 0o755 if rel.endswith(EXECUTABLE) else 0o644)
        os.chmod(tmp, 0o755)
        old = None
        if os.path.isdir(target):
            old = tempfile.mkdtemp(prefix=f".{name}.old.", dir=out_dir)
            os.rmdir(old)
            os.rename(target, old)
        os.rename(tmp, target)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"could not write {target}: {exc}"
    return None
