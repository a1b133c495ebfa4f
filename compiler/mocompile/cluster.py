"""Cluster profiles: what the step-time model needs to know about the user's own nodes.

The model's constants are calibrated on the DGX-class nodes of NVIDIA's published runs. Another
cluster can launch kernels several times slower (the project's lent 4x H100 VMs: 5.2x; the GPU then
waits for the host 50-60 % of a step), so its absolute step times, and which plans are host-bound,
differ. A profile is a small committed YAML file an intent names with ``hardware.cluster`` (a path
relative to the file that names it, inside the project)::

    schema: 1
    name: lent-h100x4
    host_factor: 5.18        # host (CPU launch) time relative to a DGX node
    source: "how it was measured"
    kernels:                 # written by `mocompile probe` (mocompile.kernels); null: not applied
      gemm_scale: 0.98       # BF16 GEMM speed relative to a reference Hopper SXM GPU
      a2a_scale: 1.01        # NCCL all-to-all throughput inside a node, same reference
      a2a_latency_us: 35.0   # per NCCL all-to-all call inside a node
    host_memory_gib: 4096    # optional: host memory per node (rule MEM003), where it differs from the GPU
                             # type's usual node (compiler/mocompile/data/hardware.yaml)
    overlap_host_factor: 1.2 # optional, written by `mocompile tune` (mocompile.overlap_fit): the EP-overlap
                             # schedule's host time relative to the plain one, measured on these nodes

Absent a profile, the DGX defaults apply (``host_factor`` 1). The lock records the profile's path,
its hash and the values the plan used. A profile is read like a recipe: untrusted, size- and
depth-limited, every problem positioned in the profile file.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from mocompile.errors import InputError
from mocompile.ir import Diagnostic, Document, Position

KEYS = {"schema": "format version (1)", "name": "a name for the cluster",
        "host_factor": "host (CPU launch) time relative to a DGX node, 0.1-100",
        "source": "how the values were measured",
        "measured": "measured step times of plans run there (`mocompile tune` adds them)",
        "probe": "what `mocompile probe` ran and found there (imports, runs, what it did not measure)",
        "kernels": "the kernel probe's GEMM and all-to-all measurements and the scales the model applies",
        "host_memory_gib": "host (CPU) memory per node in GiB, where it differs from the GPU type's usual node",
        "overlap_host_factor": "host launch time of the EP-overlap schedule relative to the plain one on these nodes, "
                               "0.5-4 (`mocompile tune` fits it from an overlap on/off pair it measured apart; "
                               "absent: the calibrated constant)"}
KERNEL_SCALES = {"gemm_scale": (0.1, 2.0), "a2a_scale": (0.1, 2.0), "a2a_latency_us": (0.1, 100000.0)}
HOST_FACTOR = (0.1, 100.0)
HOST_MEMORY_GIB = (1.0, 1000000.0)
OVERLAP_HOST_FACTOR = (0.5, 4.0)


def _number_in(value: Any, bounds: tuple[float, float]) -> bool:
    """A YAML number (not a boolean, which Python counts as an int) within ``bounds``."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and bounds[0] <= value <= bounds[1]


def _error(message: str, pos: Position, hint: str = "") -> InputError:
    return InputError([Diagnostic("INPUT", "error", message, pos, hint)])


def read(doc: Document) -> None:
    """Load the profile ``hardware.cluster`` names into ``doc.cluster`` (and its text into the hash inputs)."""
    from mocompile.load import parse_text, read_text
    from mocompile.project import project_file

    hw = doc.data.get("hardware")
    path = hw.get("cluster") if isinstance(hw, dict) else None
    if path is None:
        return
    pos = doc.positions.get(("hardware", "cluster"), doc.position(("hardware",)))
    full = project_file(path, "hardware.cluster", pos, doc.files[-1], "clusters/my-cluster.yaml",
                        "keep cluster profiles in the project (e.g. clusters/)")
    if not os.path.isfile(full):
        raise _error(f"`hardware.cluster` names a missing file: {path}", pos,
                     "paths are relative to the recipe that names the profile")
    text = read_text(full, pos)
    data, positions = parse_text(text, full)
    problems = []
    for key in data:
        if key not in KEYS:
            problems.append(Diagnostic("INPUT", "error", f"unknown key `{key}` in a cluster profile",
                                       positions[(key,)], "known keys: " + ", ".join(KEYS)))
    if data.get("schema") != 1:
        problems.append(Diagnostic("INPUT", "error", "a cluster profile needs `schema: 1`",
                                   positions.get(("schema",), Position(full, 1, 1))))
    factor = data.get("host_factor", 1.0)
    if not _number_in(factor, HOST_FACTOR):
        problems.append(Diagnostic("INPUT", "error", f"`host_factor` must be a number from {HOST_FACTOR[0]} to "
                                   f"{HOST_FACTOR[1]:.0f} (got {factor!r})",
                                   positions.get(("host_factor",), Position(full, 1, 1)),
                                   "host (CPU launch) time relative to a DGX node: 1 is DGX-class"))
    for key, kind, what in (("measured", list, "a list"), ("probe", dict, "a mapping")):
        if key in data and not isinstance(data[key], kind):
            problems.append(Diagnostic("INPUT", "error", f"`{key}` must be {what}", positions[(key,)],
                                       f"`{key}` is written by `mocompile {'tune' if key == 'measured' else 'probe'}`"))
    kern = data.get("kernels")
    if kern is not None and not isinstance(kern, dict):
        problems.append(Diagnostic("INPUT", "error", "`kernels` must be a mapping", positions[("kernels",)],
                                   "`kernels` is written by `mocompile probe`"))
        kern = None
    scales: dict[str, float | None] = {}
    for key, (lo, hi) in KERNEL_SCALES.items():
        v = (kern or {}).get(key)
        if v is not None and not _number_in(v, (lo, hi)):
            problems.append(Diagnostic("INPUT", "error", f"`kernels.{key}` must be null or a number from {lo:g} to "
                                       f"{hi:g} (got {v!r})", positions.get(("kernels", key), positions[("kernels",)]),
                                       "written by `mocompile probe`; rerun it"))
            v = None
        scales[key] = float(v) if v is not None else None
    host_mem = data.get("host_memory_gib")
    if host_mem is not None and not _number_in(host_mem, HOST_MEMORY_GIB):
        problems.append(Diagnostic("INPUT", "error", f"`host_memory_gib` must be a number from {HOST_MEMORY_GIB[0]:g} "
                                   f"to {HOST_MEMORY_GIB[1]:g} (got {host_mem!r})", positions[("host_memory_gib",)],
                                   "the node's host memory in GiB, e.g. 2048 for a DGX H100"))
        host_mem = None
    overlap = data.get("overlap_host_factor")
    if overlap is not None and not _number_in(overlap, OVERLAP_HOST_FACTOR):
        problems.append(Diagnostic("INPUT", "error", f"`overlap_host_factor` must be a number from "
                                   f"{OVERLAP_HOST_FACTOR[0]:g} to {OVERLAP_HOST_FACTOR[1]:g} (got {overlap!r})",
                                   positions[("overlap_host_factor",)],
                                   "written by `mocompile tune` from a measured overlap on/off pair; delete it to use "
                                   "the calibrated constant"))
        overlap = None
    for key in ("name", "source"):
        if key in data and not isinstance(data[key], str):
            problems.append(Diagnostic("INPUT", "error", f"`{key}` must be text", positions[(key,)]))
    if problems:
        raise InputError(problems)
    doc.text[full] = text
    doc.files.insert(0, full)  # hashed like a base file: a changed profile makes generated files stale
    doc.cluster = {"path": path, "file": full, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
                   "name": data.get("name"), "source": data.get("source"), "host_factor": float(factor),
                   "kernels": scales, "host_memory_gib": float(host_mem) if host_mem is not None else None,
                   "overlap_host_factor": float(overlap) if overlap is not None else None,
                   "missing": [str(m) for m in (data.get("probe") or {}).get("missing") or []],
                   # what `mocompile tune` measured there for this recipe (its name): explain and the lock say it
                   "measured": [{k: e.get(k) for k in ("plan", "median_ms", "runs", "spread", "predicted_ms")}
                                for e in data.get("measured") or []
                                if isinstance(e, dict) and e.get("recipe") == doc.data.get("name")]}


def apply(hw: dict[str, Any], doc: Document) -> dict[str, Any]:
    """The hardware description with the profile's values laid over the DGX defaults."""
    profile = getattr(doc, "cluster", None)
    if profile:
        hw["host_factor"] = profile["host_factor"]
        if profile.get("host_memory_gib") is not None:
            hw["host_memory_gib"] = profile["host_memory_gib"]
        kern = profile.get("kernels") or {}
        if kern.get("gemm_scale") is not None:
            hw["gemm_scale"] = kern["gemm_scale"]
        if kern.get("a2a_scale") is not None:
            hw["a2a_scale"] = kern["a2a_scale"]
            if kern.get("a2a_latency_us") is not None:
                hw["a2a_latency_s"] = kern["a2a_latency_us"] * 1e-6
        hw["cluster"] = {k: profile[k] for k in ("path", "sha256", "name", "source", "host_factor", "kernels",
                                                  "missing", "measured")}
        if profile.get("host_memory_gib") is not None:
            hw["cluster"]["host_memory_gib"] = profile["host_memory_gib"]
        if profile.get("overlap_host_factor") is not None:  # the step model reads it in place of the constant
            hw["overlap_host_factor"] = hw["cluster"]["overlap_host_factor"] = profile["overlap_host_factor"]
    return hw
