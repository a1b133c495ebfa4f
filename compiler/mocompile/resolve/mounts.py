"""What a container must see: every absolute path the run reads or writes, plus ``launch.mounts``.

With ``launch.container`` set, the job runs inside an image that holds none of the user's files. The launchers
bind-mount the recipe folder and the submit directory (where relative paths resolve, with or without a
container), and this list: the data prefixes' folders, the dataset index cache, a local tokenizer, the
checkpoint folders and TensorBoard (the fields ``training_io`` decided), and what ``launch.mounts`` adds for
the rest. Nested paths collapse to the outermost one. A path with ',' or ':' cannot be written in pyxis'
``--container-mounts`` (LAU001).
"""

from __future__ import annotations

import os
from typing import Any

from mocompile.ir import Decision, Plan

# Bridge fields that name a folder (or, for a data prefix, a file stem whose folder holds .bin/.idx)
FOLDERS = ("path_to_cache", "save", "load", "pretrained_checkpoint", "tensorboard_dir", "tokenizer_model")
WRITTEN = ("save", "path_to_cache", "tensorboard_dir")  # folders the job creates: made before it is mounted


def _absolute(path: Any) -> str | None:
    return os.path.normpath(path) if isinstance(path, str) and path.startswith("/") else None


def touched(plan: Plan) -> list[str]:
    """The absolute folders the run touches, outermost only, in order."""
    found: list[str] = []
    blend = plan.get("blend")
    for prefix in (blend[0] if blend else []):
        if (p := _absolute(prefix)) is not None:
            found.append(os.path.dirname(p) or "/")
    for name in FOLDERS:
        if (p := _absolute(plan.get(name))) is not None:
            found.append(p)
    found += [os.path.normpath(m) for m in (plan.intent.get("launch") or {}).get("mounts") or []]
    out: list[str] = []
    for p in sorted(set(found), key=lambda s: (s.count("/"), s)):  # distinct, outermost first
        if not any(p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return sorted(out)


def written(plan: Plan) -> list[str]:
    """Absolute folders the job writes: created before the container starts (a bind mount needs them)."""
    return sorted({p for name in WRITTEN if (p := _absolute(plan.get(name))) is not None})


def decision(plan: Plan) -> Decision:
    launch = plan.intent.get("launch") or {}
    if not launch.get("container"):
        return Decision(None, "derived", "no launch.container: the job sees the nodes' own file system")
    paths = touched(plan)
    why = ("the container sees the recipe folder, the submit directory (relative paths resolve there) and "
           + ("these absolute paths the run reads or writes (data, index cache, tokenizer, checkpoints, "
              "TensorBoard, launch.mounts)" if paths else "no absolute path: the run names none"))
    return Decision(paths, "derived", why)
