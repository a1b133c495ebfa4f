"""Render a Plan into the artifact files. Templates only format; this module
prepares plain values for them, so every decision lives in the Plan."""

from __future__ import annotations

import functools
import hashlib
import json
import keyword
import os
import re
import shlex
from typing import Any

import jinja2

from mocompile import __version__
from mocompile.emit import header, python_recipe
from mocompile.ir import Document, Plan
from mocompile.memory import full_attention_layers
from mocompile.project import find_root
from mocompile.resolve import mounts
from mocompile.textsafe import visible

TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")


class Emitted(str):
    """Text an escaper made for one target context. Templates may print only these (and
    numbers): :func:`_finalize` refuses any other string, so a value that skipped its
    escaper fails the compile instead of reaching a generated file raw."""


class EmitError(Exception):
    """A template printed a value without an escaper, or an escaper was given a value its
    context cannot hold. Always a mocompile bug (the schema should have refused the input)."""


def pyrepr(value: Any) -> Emitted:
    """A Python literal for a plain value. repr() escapes quotes, backslashes, newlines and
    every non-printable character (str.isprintable), so the literal cannot end early."""
    if isinstance(value, (dict, list, tuple, str, int, float, bool)) or value is None:
        return Emitted(repr(value))
    raise EmitError(f"cannot emit {type(value).__name__} as a Python literal")


def shquote(value: Any) -> Emitted:
    """One shell word that reads back as ``value`` exactly. `$` and backquote stand outside the
    single quotes as "\\$" and "\\`", so shellcheck does not take the literal for a mistake
    (SC2016) and the generated scripts stay shellcheck-clean whatever the user's value.
    NUL cannot be held by a shell word at all: refused."""
    text = str(value)
    if "\0" in text:
        raise EmitError("a shell word cannot hold a NUL character")
    if "$" not in text and "`" not in text:
        return Emitted(shlex.quote(text))
    parts = re.split(r"([$`])", text)
    return Emitted("".join(f'"\\{p}"' if p in ("$", "`") else shlex.quote(p) if p else "" for p in parts))


def yamlstr(value: Any) -> Emitted:
    """JSON strings (ASCII-only) are valid YAML double-quoted scalars, every special character escaped."""
    return Emitted(json.dumps(str(value)))


def pycomment(text: Any) -> Emitted:
    """Text for one ``#`` comment line (Python, shell or YAML): line breaks and every other
    control or format character shown as escapes, so nothing escapes the comment."""
    return Emitted(visible(re.sub(r"[\r\n]+", " ", str(text)).strip()))


def pydoc(text: Any) -> Emitted:
    """Text for the inside of a triple-quoted (non-raw) docstring: backslashes doubled and
    quotes escaped, so neither ``\"\"\"`` nor ``\\N`` can end or break the literal; control and
    format characters as escapes."""
    escaped = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return Emitted(visible(escaped))


_TOKEN = re.compile(r"[A-Za-z0-9._,:/+-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def token(value: Any) -> Emitted:
    """A bare word the schema already restricted to ``[A-Za-z0-9._,:/+-]`` (names, versions,
    Slurm fields, the interpreter): safe unquoted in a shell word, an ``#SBATCH`` line, a
    comment and a YAML plain scalar. Anything else is refused, never passed through."""
    text = str(value)
    if not _TOKEN.fullmatch(text):
        raise EmitError(f"{visible(text)!r} is not a plain word")
    return Emitted(text)


def ident(value: Any) -> Emitted:
    """A (dotted) Python identifier: an attribute, keyword argument, module or import name."""
    text = str(value)
    if not _IDENT.fullmatch(text) or keyword.iskeyword(text):
        raise EmitError(f"{visible(text)!r} is not a Python identifier")
    return Emitted(text)


def envname(value: Any) -> Emitted:
    """An environment variable name (``launch.env`` keys are schema-checked the same way)."""
    text = str(value)
    if not _ENV_NAME.fullmatch(text):
        raise EmitError(f"{visible(text)!r} is not an environment variable name")
    return Emitted(text)


def shvar(value: Any) -> Emitted:
    """``${NAME}``: a shell parameter expansion of an environment variable."""
    return Emitted("${" + envname(value) + "}")


def _finalize(value: Any) -> Any:
    """Every ``{{ ... }}`` passes here: escaped text and numbers print, anything else is a bug."""
    if isinstance(value, Emitted) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise EmitError(f"template printed {type(value).__name__} {visible(repr(value))[:80]} without an escaper")


@functools.lru_cache(maxsize=1)
def env() -> jinja2.Environment:
    e = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                           keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                           finalize=_finalize)
    e.filters.update(pyrepr=pyrepr, shquote=shquote, yamlstr=yamlstr, pycomment=pycomment, pydoc=pydoc,
                     token=token, ident=ident, envname=envname, shvar=shvar)
    return e


def verify_python(name: str, text: str) -> None:
    """A generated Python file must compile from its UTF-8 *bytes* (what the interpreter
    reads, encoding declaration included) and declare no encoding but UTF-8: otherwise
    emitting it is a bug, not something ``check`` may certify."""
    import io
    import tokenize

    data = text.encode("utf-8")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    if encoding not in ("utf-8", "utf-8-sig"):
        raise EmitError(f"{name} would be decoded as {encoding}, not UTF-8")
    try:
        compile(data, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise EmitError(f"{name} does not compile: {visible(exc)}") from None


def _rel(path: str) -> str:
    """Project-relative POSIX path, so headers do not depend on where mocompile ran."""
    root = find_root(os.path.dirname(os.path.abspath(path))) or os.getcwd()
    rel = os.path.relpath(os.path.abspath(path), root)
    return rel.replace(os.sep, "/")


def input_hash(doc: Document, sets: list[str], unsets: list[str]) -> str:
    h = hashlib.sha256(f"mocompile {__version__}\n".encode())
    for f in doc.files:
        h.update(f"{_rel(f)}\n{doc.text.get(f, '')}\n".encode())
    for s in unsets:
        h.update(f"--unset {s}\n".encode())
    for s in sets:
        h.update(f"--set {s}\n".encode())
    return h.hexdigest()[:16]


def env_block(plan: Plan) -> list[tuple[str, str]]:
    return sorted((k, str(d.value)) for k, d in plan.env.items())


def lock(plan: Plan) -> dict[str, Any]:
    """The resolved plan, target versions and the runtime minimums the preflight checks."""
    return {
        "name": plan.name,
        "goal": plan.goal,
        "model": {k: plan.model[k] for k in ("id", "display", "hf_id", "resized") if k in plan.model},
        "hardware": {"gpu": plan.hardware["id"], "nodes": plan.hardware["nodes"],
                     "gpus_per_node": plan.hardware["gpus_per_node"], "world_size": plan.hardware["world_size"],
                     **({"cluster": plan.hardware["cluster"]} if plan.hardware.get("cluster") else {})},
        "versions": {"megatron_core": plan["mcore_version"], "megatron_bridge": plan["bridge_version"],
                     "torch": plan["torch_version"], "transformer_engine": plan["te_version"]},
        "requirements": requirements(plan),
        **({"model_config": mc} if (mc := model_config(plan)) else {}),
        "settings": {k: _located(d) for k, d in sorted(plan.settings.items())},
        "env": {k: _located(d) for k, d in sorted(plan.env.items())},
        # train.py starts from Bridge's recipe config and sets these fields only (each from the named setting)
        "config_fields": python_recipe.config_fields(plan),
        "memory": plan.memory,
        # The planner's verdict: the chosen plan's predicted step, the runners-up and why they lost.
        "estimate": plan.planner,
        "diagnostics": [dict(d.as_dict(), file=_rel_if_file(d.position.file)) for d in plan.diagnostics],
    }


def _rel_if_file(path: str) -> str:
    """A project-relative path for a real file (the command line's pseudo-file stays as it is): the lock
    must not depend on the folder mocompile ran in or how the recipe's path was typed."""
    return _rel(path) if path and os.path.exists(path) else path


def _located(d: Any) -> dict[str, Any]:
    out = d.as_dict()
    if d.position is not None and "at" in out:
        out["at"] = str(d.position._replace(file=_rel_if_file(d.position.file)))
    return out


def requirements(plan: Plan) -> dict[str, Any]:
    """Minimum versions this plan needs at run time (from the rules it relies on)."""
    torch_min = "2.6.0"
    te_min = None
    if plan["te_version"] is not None:
        te_min = "1.7.0"
        if plan["delay_wgrad_compute"] and plan["overlap_grad_reduce"]:
            te_min = "2.7.0"
        if plan["delay_wgrad_compute"] and plan["cuda_graph_impl"] == "transformer_engine":
            te_min = "2.10.0"
        scopes = plan["cuda_graph_modules"] or []
        if plan["delay_wgrad_compute"] and "attn" in scopes:
            te_min = "2.12.0"
        if plan["fp4"] is not None:
            te_min = max(te_min, "2.7.0", key=lambda v: tuple(int(x) for x in v.split(".")))
    backend = plan["moe_flex_dispatcher_backend"] if plan["moe_token_dispatcher_type"] == "flex" else None
    dispatch = {"deepep": ["deep_ep", "Buffer"], "hybridep": ["deep_ep", "HybridEPBuffer"]}.get(backend or "")
    required_env = {k: str(d.value) for k, d in plan.env.items()
                    if k in ("CUDA_DEVICE_MAX_CONNECTIONS", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "USE_MNNVL")}
    return {"torch": torch_min, "transformer_engine": te_min, "dispatch_import": dispatch, "env": required_env,
            "needs_nvcc": backend == "hybridep",
            "nccl_ep": backend == "ncclep",  # RUN016: Transformer Engine's NCCL EP, built in and with a recent NCCL
            # RUN014: the Hugging Face model whose config Bridge's recipe reads at start-up (cache or hub)
            "hf_config": _hf_config(plan),
            # RUN013: the buffer one MoE layer builds, on one GPU (sizes only shape the probe's allocation)
            "hybridep_probe": {"hidden": int(plan.model["hidden_size"]),
                               "tokens": int(plan["seq_length"]) * int(plan["micro_batch_size"]),
                               "local_experts": max(1, int(plan.model["num_moe_experts"])
                                                    // int(plan["expert_model_parallel_size"]))}
            if backend == "hybridep" else None,
            "needs_apex": bool(plan["gradient_accumulation_fusion"]),  # on only with TE and Apex (parallelism.py)
            # Megatron-Core 0.16+ builds Muon from emerging-optimizers >= 0.2 (optimizer/__init__.py)
            **({"emerging_optimizers": "0.2.0"} if plan.get("optimizer") == "muon" else {}),
            # RUN017: a hybrid model's Gated DeltaNet layers come from fla (flash-linear-attention)
            **({"gated_delta_net_layers": n} if (n := gated_delta_net_layers(plan)) else {})}


def gated_delta_net_layers(plan: Plan) -> int:
    """How many decoder layers Megatron-Core builds as Gated DeltaNet, from fla's kernels (preflight RUN017):
    the layers of a hybrid model (``attention: hybrid`` with ``linear_attention_freq``) that are not full
    attention (memory.full_attention_layers); 0 for every other model."""
    m = plan.model
    return int(m["num_layers"]) - full_attention_layers(m)


def _hf_config(plan: Plan) -> str | None:
    """The Hugging Face model whose config Bridge's recipe reads from the HF cache or the hub at start-up (preflight
    RUN014), if any: none where the recipe vendors it (``model_config``)."""
    bridge = plan.model.get("bridge") or {}
    if plan.model.get("vendored_config"):
        return None
    return plan.model.get("hf_id") if bridge.get("recipe") and bridge.get("needs_hf_config") else None


def model_config(plan: Plan) -> dict[str, Any] | None:
    """The lock's record of a vendored HF config: where it came from, its copy's sha256 (``check`` and the writer
    compare the copy with it) and the numbers it was checked against; None without ``model_config``."""
    v = plan.model.get("vendored_config")
    if not v:
        return None
    return {"hf_id": plan.model["hf_id"], "source": _rel(v["source"]), "copy": v["copy"], "sha256": v["sha256"],
            "model_type": v["model_type"], "architectures": v["architectures"], "matched": v["matched"]}


def hub_reads(plan: Plan) -> list[tuple[str, str]]:
    """What the run still reads through Hugging Face's loaders besides the model config (preflight RUN014):
    a tokenizer named by path or hub id (``tokenizer.path``; Bridge's HuggingFaceTokenizer)."""
    tok = plan.get("tokenizer_model")
    return [("tokenizer.path", str(tok))] if tok else []


def preflight_io(plan: Plan) -> dict[str, Any]:
    """What preflight checks for the data, tokenizer, checkpoint and logging keys (RUN006-RUN010)."""
    blend = plan.get("blend")
    tok = plan.get("tokenizer_model")
    writable = [(plan.get(k), key) for k, key in (("save", "checkpoint.save"), ("path_to_cache", "training.data.cache"),
                                                   ("tensorboard_dir", "logging.tensorboard")) if plan.get(k)]
    packages = [(mod, key) for mod, key, field in (("tensorboard", "logging.tensorboard", "tensorboard_dir"),
                                                   ("wandb", "logging.wandb", "wandb_project")) if plan.get(field)]
    out = {"prefixes": list(blend[0]) if blend else [],
           "tokenizer": {"path": tok, "model_vocab": plan.model["vocab_size"]} if tok else None,
           "writable": writable, "load": plan.get("load"), "pretrained": plan.get("pretrained_checkpoint"),
           "packages": packages}
    out["any"] = bool(out["prefixes"] or tok or writable or out["load"] or out["pretrained"] or packages)
    return out


def artifacts(plan: Plan, doc: Document, sets: list[str], unsets: list[str],
              out_rel: str = "generated") -> dict[str, str]:
    """Every file for ``generated/<name>/``, keyed by file name."""
    source = _rel(doc.files[-1])
    ih = input_hash(doc, sets, unsets)
    intent = plan.intent
    launch = intent["launch"]
    hw = plan.hardware
    req = requirements(plan)
    envs = env_block(plan)
    common = dict(name=plan.name, nodes=hw["nodes"], gpus_per_node=hw["gpus_per_node"],
                  world_size=hw["world_size"], env=envs, python=launch["python"],
                  rel_dir=f"{out_rel.rstrip('/')}/{plan.name}")
    t = env()
    files: dict[str, str] = {}
    files["train.py"] = header.stamp_comment(t.get_template("train.py.j2").render(
        **common, **python_recipe.context(plan, source)), source, ih)
    files["preflight.sh"] = header.stamp_comment(t.get_template("preflight.sh.j2").render(
        **common, required_env=req["env"], torch_min=req["torch"], te_min=req["transformer_engine"],
        dispatch_import=tuple(req["dispatch_import"]) if req["dispatch_import"] else None,
        needs_nvcc=req["needs_nvcc"], nccl_ep=req["nccl_ep"], needs_apex=req["needs_apex"],
        emerging_min=req.get("emerging_optimizers"), fla_gdn=bool(req.get("gated_delta_net_layers")),
        hybridep_probe=req["hybridep_probe"], io=preflight_io(plan), hf_config=_hf_config(plan),
        vendored=model_config(plan), hub_reads=hub_reads(plan)),
        source, ih, shebang="#!/usr/bin/env bash")
    targets = launch["targets"]
    written = mounts.written(plan) if launch.get("container") else []  # made before they are mounted
    if "torchrun" in targets:
        files["torchrun.sh"] = header.stamp_comment(t.get_template("torchrun.sh.j2").render(**common),
                                                    source, ih, shebang="#!/usr/bin/env bash")
    if "slurm" in targets:
        files["slurm.sbatch"] = header.stamp_comment(t.get_template("slurm.sbatch.j2").render(
            **common, slurm=launch["slurm"], container=launch.get("container"), io=preflight_io(plan),
            mounts=plan.get("container_mounts") or [], mkdirs=written,
            segment=hw.get("segment_nodes") if hw["nodes"] > 1 else None, rack_gpus=hw.get("rack_gpus"),
            job_name=re.sub(r"[^A-Za-z0-9._-]", "-", plan.name)), source, ih, shebang="#!/usr/bin/env bash")
    if "kubernetes" in targets:
        k8s = launch.get("kubernetes") or {}
        workdir = "/workspace"
        rel = f"{out_rel.rstrip('/')}/{plan.name}"
        py = shquote(launch["python"])
        command = (f"PYTHON={py} bash {shquote(rel + '/preflight.sh')} && exec {py} -m torch.distributed.run "
                   f"{shquote(rel + '/train.py')}")  # a shell command line inside a YAML string: both escapers apply
        roles = [("Master", 1)] + ([("Worker", hw["nodes"] - 1)] if hw["nodes"] > 1 else [])
        template = "trainjob-v2.yaml.j2" if k8s.get("api") == "trainjob" else "trainjob.yaml.j2"
        files["trainjob.yaml"] = header.stamp_comment(t.get_template(template).render(
            **common, k8s_name=re.sub(r"[^a-z0-9-]", "-", plan.name.lower()).strip("-")[:63] or "mocompile",
            namespace=k8s.get("namespace", "default"), runtime=k8s.get("runtime", "torch-distributed"),
            image=plan.get("kubernetes_image"),  # launch.container, or the unpinned default (versions.DEFAULT_IMAGE)
            image_unpinned=not launch.get("container"),
            workdir=workdir, command=command, roles=roles, rdma=plan.get("kubernetes_rdma"),
            mounts=[(f"host-{i}", path, "DirectoryOrCreate" if path in written else "Directory")
                    for i, path in enumerate(plan.get("container_mounts") or [])]), source, ih)
    probe = python_recipe.rankprobe.spec(plan)
    files["rankprobe.sh"] = header.stamp_comment(t.get_template("rankprobe.sh.j2").render(
        **common, probe_rank=probe["rank"], probe_why=probe["rank_why"], probe_iterations=probe["iterations"]),
        source, ih, shebang="#!/usr/bin/env bash")
    files["mocompile.lock.json"] = header.stamp_json(lock(plan), source, ih)
    if plan.model.get("vendored_config"):  # byte for byte: AutoConfig reads it; the lock holds its sha256
        files[plan.model["vendored_config"]["copy"]] = doc.text[plan.model["vendored_config"]["source"]]
    verify_python("train.py", files["train.py"])
    return files
