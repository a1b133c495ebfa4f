"""The IDs mocompile prints outside the rule catalogue: the reading stages (INPUT, SCHEMA), the writer (WRITE),
``check`` (EDITED) and the generated preflight's run-time checks (RUN001...). Data in ``data/checks.yaml``, so
that ``explain`` answers for every ID a user can see, and the rule reference lists them."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from mocompile.datafiles import load_yaml

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "checks.yaml")


@dataclass(frozen=True)
class Check:
    id: str
    name: str
    stage: str
    what: str
    fix: str


@functools.lru_cache(maxsize=1)
def checks() -> dict[str, Check]:
    return {c["id"]: Check(c["id"], c["name"], c["stage"], c["what"], c["fix"]) for c in load_yaml(DATA)["checks"]}
