"""Allow ``python -m mocompile``."""

import gc

# A command-line run is short and its garbage is acyclic tuples and dicts that reference counting frees: the
# cyclic collector's passes over the imports and the planner's candidates cost a cold `lint` ~8 ms of ~200
# (benchmarks/lint_speed.py). cli._main does the same for the `mocompile` console script.
gc.disable()  # cli._main turns it back on for the verbs that run for minutes (probe, tune, ...)

from mocompile.cli import main  # noqa: E402 - after the collector is off: the imports allocate most

raise SystemExit(main())
