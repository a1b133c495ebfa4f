"""Import shim standing in for the Transformer Engine (TE) *import only*.

This is NOT Transformer Engine.  It exists so that Megatron-Core / Megatron-Bridge
modules that import ``transformer_engine`` at module level can be imported, and their
*configuration validation* run, on a CPU-only test machine.  Nothing here computes
anything: every attribute and every submodule (``transformer_engine.pytorch``,
``transformer_engine.pytorch.fp8``, ...) resolves to an inert dummy.

* ``__version__`` is read from the environment variable ``MOCOMPILE_TE_SHIM_VERSION``
  (default ``"2.12.0"``) when this package is first imported, so Megatron's
  ``is_te_min_version`` / ``get_te_version`` checks see that version.  Megatron-Core
  caches the version in ``megatron.core.utils._te_version``; a test that wants another
  version after the first check must reset that global (or patch
  ``megatron.core.utils.get_te_version``).
* Unknown attributes are inert classes: subclassable (as ``torch.nn.Module`` when torch
  is importable), constructible with any arguments, and their own unknown attributes are
  again inert classes.  Instances are falsy; calling an instance returns ``None``.
* ``transformer_engine.pytorch.optimizers.FusedAdam`` has the precision-aware keyword
  parameters in its signature, because Megatron-Core inspects them.

Put ``tests/stack/te_shim`` on ``sys.path`` (before site-packages) to activate it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

__version__ = os.environ.get("MOCOMPILE_TE_SHIM_VERSION", "2.12.0")
IS_MOCOMPILE_TE_SHIM = True

_PREFIX = __name__ + "."

try:  # subclassable as a torch module when torch is present
    import torch as _torch

    _DUMMY_BASE: tuple[type, ...] = (_torch.nn.Module,)
except Exception:  # pragma: no cover - torch missing
    _DUMMY_BASE = (object,)


class _DummyMeta(type):
    """Metaclass: unknown *class* attributes resolve to further dummy classes."""

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make_dummy(f"{cls.__name__}.{name}")

    def __bool__(cls) -> bool:  # a dummy class is truthy like any class
        return True


def _dummy_init(self, *args, **kwargs):  # noqa: ARG001 - accepts anything
    base = _DUMMY_BASE[0]
    if base is not object:
        base.__init__(self)


def _dummy_call(self, *args, **kwargs):  # noqa: ARG001
    return None


def _dummy_bool(self) -> bool:
    # Instances are falsy so that ``if SomeTEManager.is_enabled():`` style checks on a
    # dummy (e.g. ``FP8GlobalStateManager.is_fp8_enabled()``) read as "off".
    return False


def _dummy_getattr(self, name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if _DUMMY_BASE[0] is not object:
        try:
            return _DUMMY_BASE[0].__getattr__(self, name)
        except AttributeError:
            pass
    return _make_dummy(name)


_DUMMIES: dict[str, type] = {}


def _make_dummy(qualname: str) -> type:
    if qualname not in _DUMMIES:
        _DUMMIES[qualname] = _DummyMeta(
            qualname.rsplit(".", 1)[-1],
            _DUMMY_BASE,
            {
                "__init__": _dummy_init,
                "__call__": _dummy_call,
                "__bool__": _dummy_bool,
                "forward": _dummy_call,
                "__getattr__": _dummy_getattr,
                "__module__": __name__,
                "__qualname__": qualname,
                "__doc__": "Inert stand-in created by the mocompile TE import shim.",
                "_mocompile_te_shim": True,
            },
        )
    return _DUMMIES[qualname]


def _fused_adam_init(
    self,
    params=None,
    lr=1e-3,
    bias_correction=True,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    amsgrad=False,
    *,
    master_weights=None,
    master_weight_dtype=None,
    exp_avg_dtype=None,
    exp_avg_sq_dtype=None,
    use_decoupled_grad=False,
    **kwargs,
):  # noqa: ARG001 - signature only: Megatron-Core inspects it
    _dummy_init(self)


def _special_attributes(module_name: str) -> dict[str, object]:
    """Attributes whose *signature* Megatron inspects (values are still inert)."""
    if module_name == __name__ + ".pytorch.optimizers":
        # megatron/core/optimizer/optimizer_config.py checks FusedAdam's parameters for
        # master_weight_dtype / exp_avg_dtype / exp_avg_sq_dtype / use_decoupled_grad when
        # use_precision_aware_optimizer is set.
        fused_adam = _DummyMeta(
            "FusedAdam",
            (_make_dummy(module_name + ".FusedAdamBase"),),
            {"__init__": _fused_adam_init, "__module__": module_name},
        )
        return {"FusedAdam": fused_adam}
    return {}


class _ShimModule(types.ModuleType):
    """A shim submodule whose unknown attributes are inert dummy classes."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _make_dummy(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _ShimLoader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = _ShimModule(spec.name)
        mod.__doc__ = "mocompile TE import shim submodule (inert)."
        mod.__path__ = []  # a package, so deeper submodules resolve too
        return mod

    def exec_module(self, module) -> None:
        module.__version__ = __version__
        for key, value in _special_attributes(module.__name__).items():
            setattr(module, key, value)


class _ShimFinder(importlib.abc.MetaPathFinder):
    """Resolve every ``transformer_engine.<anything>`` import to a shim module."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        # Real files inside this package (if any are added later) win.
        here = os.path.dirname(__file__)
        rel = fullname[len(_PREFIX):].replace(".", os.sep)
        if os.path.exists(os.path.join(here, rel + ".py")) or os.path.isdir(os.path.join(here, rel)):
            return None
        return importlib.machinery.ModuleSpec(fullname, _ShimLoader(), is_package=True)


if not any(isinstance(f, _ShimFinder) for f in sys.meta_path):
    sys.meta_path.append(_ShimFinder())


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if name in ("pytorch", "common", "jax", "debug"):
        return importlib.import_module(_PREFIX + name)
    return _make_dummy(f"{__name__}.{name}")
