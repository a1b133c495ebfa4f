"""Validate a generated Megatron-Bridge recipe file on CPU with Bridge's real runtime checks.

Run inside the Python 3.12 venv made by ``tests/stack/setup.sh`` (``.venv-stack``).  The
recipe file is imported as a module (its ``if __name__ == "__main__":`` block does not run),
its ``build_config()`` is called, and Bridge's own ``runtime_config_update(cfg)`` is applied:
mixed-precision setup, data-parallel size, ``CommOverlapConfig`` pre-checks, provider
``finalize()`` (Megatron-Core ``TransformerConfig.__post_init__``) and
``ConfigContainer.validate()``.

What is faked (and therefore NOT checked):
* Transformer Engine: ``tests/stack/te_shim`` stands in for the TE *import* only and reports
  ``MOCOMPILE_TE_SHIM_VERSION`` (default 2.12.0); ``te_version=`` overrides the version that
  Megatron-Core's ``is_te_min_version`` sees for one call.
* The GPU: ``torch.cuda.is_available`` / ``get_device_properties`` / ``get_device_capability``
  / ``get_device_name`` report the target GPU, so ``apply_flex_dispatcher_backend`` (run while
  the recipe builds its config) and ``validate_flex_dispatcher_backend`` decide for that GPU.
* Distributed state: ``WORLD_SIZE`` = world size, ``RANK`` = ``LOCAL_RANK`` = 0.  No process
  groups and no model are built, so checks made only at model build / group init are missed.

``os.environ`` is restored afterwards (recipes' ``env_vars`` are applied with setdefault).

CLI:  python tests/stack/bridge_validate.py FILE --gpu h100 --world-size 16 [--te-version X]
      [--hf-config MODEL_ID[@REVISION]=CONFIG_JSON ...]   (offline HF config.json stubs)
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import traceback
import uuid
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
TE_SHIM_DIR = os.path.join(HERE, "te_shim")

# name, major, minor, SM count (SM counts are informational; Bridge reads name/major only)
GPUS: dict[str, tuple[str, int, int, int]] = {
    "a100": ("NVIDIA A100-SXM4-80GB", 8, 0, 108),
    "h100": ("NVIDIA H100 80GB HBM3", 9, 0, 132),
    "h200": ("NVIDIA H200", 9, 0, 132),
    "b200": ("NVIDIA B200", 10, 0, 148),
    "b300": ("NVIDIA B300", 10, 3, 148),
    "gb200": ("NVIDIA GB200", 10, 0, 152),
    "gb300": ("NVIDIA GB300", 10, 3, 152),
}

# Resolved model fields reported back (missing ones are skipped).
MODEL_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "ffn_hidden_size", "seq_length", "vocab_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
    "pipeline_dtype", "params_dtype", "bf16", "fp16", "fp8", "fp8_recipe",
    "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_layer_freq",
    "moe_router_num_groups", "moe_router_group_topk", "moe_router_score_function", "moe_router_enable_expert_bias",
    "q_lora_rank", "moe_router_topk_scaling_factor", "add_qkv_bias", "rotary_percent",
    "softmax_type", "window_size", "add_bias_linear",
    "moe_shared_expert_intermediate_size", "moe_shared_expert_overlap",
    "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_flex_dispatcher_num_sms",
    "moe_deepep_num_sms", "moe_hybridep_num_sms", "moe_grouped_gemm", "moe_permute_fusion",
    "moe_router_fusion", "moe_router_force_load_balancing", "moe_router_dtype",
    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
    "cuda_graph_impl", "cuda_graph_modules", "cuda_graph_scope", "cuda_graph_warmup_steps",
    "use_te_rng_tracker", "mtp_num_layers", "multi_latent_attention", "transformer_impl",
    "gradient_accumulation_fusion", "tp_comm_overlap",
)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _ensure_te_shim() -> None:
    """Put the TE import shim first on sys.path (before any transformer_engine import)."""
    if TE_SHIM_DIR not in sys.path:
        sys.path.insert(0, TE_SHIM_DIR)
    loaded = sys.modules.get("transformer_engine")
    if loaded is not None and not getattr(loaded, "IS_MOCOMPILE_TE_SHIM", False):
        raise RuntimeError("a real transformer_engine is already imported; use a fresh process")


def gpu_properties(gpu: str) -> SimpleNamespace:
    key = gpu.lower()
    if key not in GPUS:
        raise ValueError(f"unknown gpu {gpu!r}; known: {sorted(GPUS)}")
    name, major, minor, sms = GPUS[key]
    return SimpleNamespace(
        name=name,
        major=major,
        minor=minor,
        multi_processor_count=sms,
        total_memory=80 * 2**30,
        is_integrated=False,
        is_multi_gpu_board=False,
    )


@contextlib.contextmanager
def fake_gpu(gpu: str) -> Iterator[SimpleNamespace]:
    """Make torch.cuda report the target GPU (device queries only; no CUDA work is possible)."""
    props = gpu_properties(gpu)
    with contextlib.ExitStack() as stack:
        for target, kwargs in (
            ("torch.cuda.is_available", {"return_value": True}),
            ("torch.cuda.get_device_properties", {"return_value": props}),
            ("torch.cuda.get_device_capability", {"return_value": (props.major, props.minor)}),
            ("torch.cuda.get_device_name", {"return_value": props.name}),
        ):
            stack.enter_context(mock.patch(target, **kwargs))
        yield props


@contextlib.contextmanager
def preserved_environ() -> Iterator[None]:
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def te_version_override(te_version: str | None) -> Iterator[None]:
    """Make Megatron-Core's is_te_min_version/get_te_version see ``te_version`` (cached global)."""
    if te_version is None:
        yield
        return
    import megatron.core.utils as mcu
    from packaging.version import Version

    saved = mcu._te_version
    mcu._te_version = Version(te_version)
    try:
        yield
    finally:
        mcu._te_version = saved


@contextlib.contextmanager
def offline_hf_configs(entries: dict[str, dict]) -> Iterator[str | None]:
    """Serve HF ``config.json`` files from a throw-away HF cache with the Hub switched off.

    ``entries`` maps "org/name" or "org/name@<40-hex commit>" to the config dict.  AutoBridge
    recipes call ``AutoBridge.from_hf_pretrained(id, revision=...)`` which reads config.json;
    with HF_HUB_OFFLINE=1 huggingface_hub resolves it from this cache.  Must be entered before
    transformers/huggingface_hub read their env settings for the first time in the process
    (the CLI does; in-process callers should use a fresh process).
    """
    if not entries:
        yield None
        return
    root = tempfile.mkdtemp(prefix="mocompile-hf-")
    hub = os.path.join(root, "hub")
    for key, cfg in entries.items():
        model_id, _, revision = key.partition("@")
        revision = revision or "0" * 40
        repo = os.path.join(hub, "models--" + model_id.replace("/", "--"))
        snap = os.path.join(repo, "snapshots", revision)
        os.makedirs(snap, exist_ok=True)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", "main"), "w", encoding="utf-8") as fh:
            fh.write(revision)
        with open(os.path.join(snap, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(cfg, fh)
    with preserved_environ():
        os.environ.update(
            HF_HOME=root, HF_HUB_CACHE=hub, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
        )
        try:
            yield hub
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _load_module(path: str):
    name = f"_mocompile_recipe_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _model_summary(cfg: Any) -> dict[str, Any]:
    model = getattr(cfg, "model", None)
    out: dict[str, Any] = {}
    if model is None:
        return out
    out["provider"] = type(model).__name__
    for field_name in MODEL_FIELDS:
        if hasattr(model, field_name):
            out[field_name] = _jsonable(getattr(model, field_name))
    return out


def run_child(driver: str, names: list[str], model_ids: list[str], site_packages: Any, tmp: Any,
              timeout: float = 900) -> dict:
    """Run ``driver`` (a Python script: argv = ROOT, HF config JSON, output JSON, names...) in a fresh
    interpreter behind offline HF configs for ``model_ids`` and return the JSON it wrote. The configs are built
    here, in the parent: transformers must not be imported in the child before the offline HF cache is in
    place (huggingface_hub reads its settings at import)."""
    import subprocess
    from pathlib import Path

    import hf_configs

    tmp = Path(tmp)
    hf_json = tmp / "hf.json"
    hf_json.write_text(json.dumps(hf_configs.entries(model_ids, site_packages)), encoding="utf-8")
    script, out = tmp / "driver.py", tmp / "result.json"
    script.write_text(driver, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    root = Path(HERE).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(script), str(root), str(hf_json), str(out), *names],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert out.exists(), proc.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


def validate_recipe_file(
    path: str,
    gpu: str,
    world_size: int,
    *,
    te_version: str | None = None,
) -> dict:
    """Import ``path``, call its ``build_config()`` on a faked ``gpu`` at ``world_size`` ranks
    and run Bridge's ``runtime_config_update``.

    Returns ``{"ok", "error", "stage", "model", "data_parallel_size", "warnings"}``; ``stage``
    says where it failed ("import", "build_config", "runtime_config_update") or "done".
    """
    _ensure_te_shim()
    result: dict[str, Any] = {
        "ok": False,
        "error": None,
        "stage": "import",
        "model": {},
        "data_parallel_size": None,
        "warnings": [],
        "gpu": gpu_properties(gpu).name,
        "world_size": world_size,
    }
    module_name = None
    with preserved_environ(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ["RANK"] = "0"
        os.environ["LOCAL_RANK"] = "0"
        cfg = None
        try:
            with fake_gpu(gpu), te_version_override(te_version):
                from megatron.bridge.training.config import ConfigContainer, runtime_config_update

                module = _load_module(path)
                module_name = module.__name__
                result["stage"] = "build_config"
                build = getattr(module, "build_config", None)
                if not callable(build):
                    raise AttributeError(f"{path} defines no build_config()")
                cfg = build()
                if not isinstance(cfg, ConfigContainer):
                    raise TypeError(f"build_config() returned {type(cfg).__name__}, "
                                    "not ConfigContainer")
                result["stage"] = "runtime_config_update"
                runtime_config_update(cfg)
                result["stage"] = "step_metrics_callback"
                result["callback_hooks"] = _metrics_callback_hooks(module)
                result["stage"] = "done"
                result["ok"] = True
        except Exception as exc:  # the point is to report Bridge's own message
            result["error"] = f"{type(exc).__name__}: {exc}".strip()
            result["traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
        finally:
            if module_name:
                sys.modules.pop(module_name, None)
        if cfg is not None:
            result["model"] = _model_summary(cfg)
            result["data_parallel_size"] = getattr(cfg, "data_parallel_size", None)
        seen: list[str] = []
        for w in caught:
            msg = f"{w.category.__name__}: {w.message}"
            if msg not in seen:
                seen.append(msg)
        result["warnings"] = seen[:50]
    return result


def _metrics_callback_hooks(module: Any) -> list[str]:
    """Build the recipe's MOCOMPILE_METRICS callback with the real Bridge and name the hooks it
    overrides; each must be a hook Bridge's ``Callback`` defines (a renamed hook would never run)."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "metrics.jsonl")
        cb = module.step_metrics_callback(path)
        if not isinstance(cb, Callback):
            raise TypeError(f"step_metrics_callback() returned {type(cb).__name__}, not a Bridge Callback")
        own = sorted(k for k in vars(type(cb)) if k.startswith("on_"))
        unknown = [k for k in own if not callable(getattr(Callback, k, None))]
        if unknown:
            raise AttributeError(f"Bridge's Callback has no hook(s) {unknown}: they would never be called")
        # one step on a stand-in GPU: what the hooks write for Bridge's step 6 (its 7th iteration)
        ctx = SimpleNamespace(loss_dict={"lm loss": torch.tensor(2.5)},
                              state=SimpleNamespace(train_state=SimpleNamespace(step=6)))
        with mock.patch.object(torch.cuda, "synchronize", lambda *a: None), \
                mock.patch.object(torch.cuda, "max_memory_allocated", lambda *a: 123), \
                mock.patch.object(torch.cuda, "max_memory_reserved", lambda *a: 456):
            cb.on_train_step_start(ctx)
            cb.on_train_step_end(ctx)
        with open(path, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh]
    return {"hooks": own, "rows": rows}


def _parse_hf_config_args(values: list[str]) -> dict[str, dict]:
    entries: dict[str, dict] = {}
    for item in values:
        key, sep, file_path = item.partition("=")
        if not sep:
            raise SystemExit(f"--hf-config expects MODEL_ID[@REVISION]=CONFIG_JSON, got {item!r}")
        with open(file_path, encoding="utf-8") as fh:
            entries[key] = json.load(fh)
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--gpu", default="h100", choices=sorted(GPUS))
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--te-version", default=None,
                        help="TE version Megatron-Core sees (default: the shim's version)")
    parser.add_argument("--hf-config", action="append", default=[],
                        metavar="MODEL_ID[@REVISION]=CONFIG_JSON",
                        help="serve this config.json offline for AutoBridge recipes")
    args = parser.parse_args(argv)
    entries = _parse_hf_config_args(args.hf_config)
    # Bridge/MCore log through handlers bound to stdout; keep stdout for the JSON alone by
    # pointing file descriptor 1 at stderr while the recipe is validated.
    sys.stdout.flush()
    saved_stdout_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        with offline_hf_configs(entries):
            result = validate_recipe_file(
                args.file, args.gpu, args.world_size, te_version=args.te_version
            )
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout_fd, 1)
        os.close(saved_stdout_fd)
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
