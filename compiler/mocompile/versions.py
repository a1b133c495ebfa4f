"""Version strings of the target stack, compared as integer tuples."""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=256)
def parse(version: str) -> tuple[int, ...]:
    """``'2.10.0rc1'`` -> ``(2, 10, 0)``; non-numeric tails are ignored."""
    parts = []
    for piece in str(version).split(".")[:3]:
        m = re.match(r"\d+", piece)
        parts.append(int(m.group()) if m else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def at_least(version: str | None, minimum: str) -> bool:
    return version is not None and parse(version) >= parse(minimum)


@functools.lru_cache(maxsize=1024)
def in_range(version: str | None, spec: str) -> bool:
    """``spec`` like ``'>=0.19,<0.20'``; every clause must hold."""
    if version is None:
        return False
    v = parse(version)
    for clause in filter(None, (s.strip() for s in spec.split(","))):
        m = re.match(r"(>=|<=|==|<|>)\s*(\S+)", clause)
        if not m:
            raise ValueError(f"bad version clause {clause!r}")
        op, ref = m.group(1), parse(m.group(2))
        ok = {">=": v >= ref, "<=": v <= ref, "==": v == ref, "<": v < ref, ">": v > ref}[op]
        if not ok:
            return False
    return True


# The Kubernetes job's image when the recipe names none. Unpinned on purpose: no NeMo container is documented with
# the lock's stack (Bridge 0.6.2, megatron-core 0.19.2, TE 2.12): Bridge's docs/releases/software-versions.md (v0.6.0,
# r0.6.0, main 067f987d) lists 26.06 = Bridge 0.5.0 / megatron-core 0.18.0 / TE 2.16 and 26.02 = Bridge 0.3.0 / 0.16 /
# TE 2.12. explain shows it as the kubernetes_image setting, and the job's manifest says so beside the image.
DEFAULT_IMAGE = "nvcr.io/nvidia/nemo:latest"
