"""Shared fixtures for the stack tests (real megatron-core 0.19.2 / megatron-bridge 0.6.2 on CPU).

These tests run in ``.venv-stack`` (``tests/stack/setup.sh``; ``tests/run`` does it). Importing
Megatron is slow (~20 s on 2 cores), so it happens once per session in the fixtures below.

Only the Bridge checks need Transformer Engine's *import*; they run ``bridge_validate.py`` in a
child process that puts ``tests/stack/te_shim`` on its own ``sys.path``. This process never
imports Bridge and never puts the shim on ``sys.path``: Megatron-Core's ``TransformerConfig``
builds without TE (its TE version then reads 0.0.0; tests set the version they need).

The parity tests report one summary line each (configs tried, rules exercised, disagreements);
``pytest_terminal_summary`` prints them, so they show with plain ``pytest -q`` (no ``-s``).
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

STACK = Path(__file__).resolve().parent
ROOT = STACK.parent.parent
TE_SHIM = STACK / "te_shim"  # stand-in for the Transformer Engine *import* only (child processes)
for p in (str(ROOT / "compiler"), str(STACK)):
    if p not in sys.path:
        sys.path.insert(0, p)


def _restore_root_conftest() -> None:
    """Keep ``import conftest`` meaning tests/conftest.py for the modules in tests/.

    Neither tests/ nor tests/stack/ is a package, so pytest imports this file under the plain
    name ``conftest`` and drops tests/conftest.py from ``sys.modules`` first; the test modules
    in tests/ that do ``from conftest import ...`` (collected after this directory) would then
    get this file. Put the root conftest module object (the one pytest registered) back.
    """
    import gc

    root = str(ROOT / "tests" / "conftest.py")
    for obj in gc.get_objects():
        if isinstance(obj, types.ModuleType) and getattr(obj, "__file__", None) == root:
            sys.modules["conftest"] = obj
            return
    import importlib.util

    spec = importlib.util.spec_from_file_location("conftest", root)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["conftest"] = module


_RESTORED = False


def pytest_plugin_registered(plugin, manager):  # noqa: ARG001
    """Runs right after pytest registered this conftest (its import-path check is done by then)."""
    global _RESTORED
    if not _RESTORED and getattr(plugin, "__file__", None) == __file__:
        _RESTORED = True
        _restore_root_conftest()

# Lines for the terminal summary: the parity tests append to this list.
_SUMMARY: list[str] = []


@pytest.fixture(scope="session")
def parity_summary() -> list[str]:
    return _SUMMARY


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if _SUMMARY:
        terminalreporter.section("mocompile parity")
        for line in _SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def mcore() -> types.SimpleNamespace:
    """The real Megatron-Core config classes and version helpers, imported once."""
    pytest.importorskip("megatron.core", reason="needs .venv-stack (tests/stack/setup.sh)")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core
        import megatron.core.utils as utils
        import torch
        from megatron.core.model_parallel_config import ModelParallelConfig
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
    assert megatron.core.__version__.split("+")[0] == "0.19.2", megatron.core.__version__
    return types.SimpleNamespace(TransformerConfig=TransformerConfig, MLATransformerConfig=MLATransformerConfig,
                                 ModelParallelConfig=ModelParallelConfig, utils=utils, torch=torch,
                                 version=megatron.core.__version__)


@pytest.fixture(scope="session")
def site_packages() -> Path:
    """Where the pinned megatron packages are installed (read as source; Bridge is never imported here)."""
    import importlib.util

    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron is not installed (run tests/stack/setup.sh)")
    return Path(list(spec.submodule_search_locations)[0]).parent


def stack_python() -> str:
    """The interpreter running the tests (.venv-stack under tests/run)."""
    return os.environ.get("MOCOMPILE_STACK_PYTHON", sys.executable)
