"""Data, tokenizer, checkpoint, evaluation and logging settings (issue 9).

These keys decide nothing about the parallel plan, so they are settled after it, on the
Plan itself: ``apply(plan, doc)`` adds one Decision per Bridge field (named as in Bridge's
``GPTDatasetConfig``, ``TokenizerConfig``, ``CheckpointConfig``, ``ValidationConfig``,
``LoggerConfig`` and ``ProfilingConfig``), each with the position of the key that set it, so the rule catalogue can
check them and point at the user's value.
"""

from __future__ import annotations

from typing import Any

from mocompile.ir import Decision, Document, Plan
from mocompile.versions import DEFAULT_IMAGE

MOCK_SPLIT = "99990,8,2"  # what mock recipes have always used (Bridge's own recipe value)
DEFAULT_SAVE_INTERVAL = 1000
TOKENIZER_TYPES = {"huggingface": "HuggingFaceTokenizer"}


def _blend(items: list[Any]) -> list[Any]:
    """[prefixes, weights or None], the shape of Megatron-Core's ``blend`` (a list, for JSON)."""
    if items and isinstance(items[0], (int, float)) and not isinstance(items[0], bool):
        return [[str(p) for p in items[1::2]], [float(w) for w in items[0::2]]]
    return [[str(p) for p in items], None]


def _written(data: Any, path: tuple[str, ...]) -> bool:
    """Did the recipe (a file, a base file or --set, even of a whole mapping) write ``path``?"""
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


def decisions(intent: dict[str, Any], doc: Document) -> dict[str, Decision]:
    """One Decision per Bridge field these keys control, from the validated intent."""
    out: dict[str, Decision] = {}

    def put(name: str, value: Any, path: tuple[str, ...] | None, reason: str, source: str = "") -> None:
        written = path is not None and _written(doc.data, path)
        src = source or ("user" if written else "default")
        out[name] = Decision(value, src, "set in the recipe" if src == "user" else reason,
                             position=doc.position(path) if written and path else None)

    training = intent["training"]
    data = training.get("data", "mock")
    if isinstance(data, dict):
        put("data_type", "megatron", ("training", "data", "type"), "")
        put("blend", _blend(data["blend"]), ("training", "data", "blend"), "")
        put("split", str(data.get("split", "969,30,1")), ("training", "data", "split"),
            "schema default: 96.9 % train, 3 % validation, 0.1 % test")
        put("path_to_cache", data.get("cache"), ("training", "data", "cache"),
            "no cache directory: Megatron writes the index cache beside the .idx files")
    else:
        put("data_type", "mock", ("training", "data"), "schema default: Megatron's mock GPT dataset")
        put("blend", None, None, "mock data has no blend", "derived")
        put("split", MOCK_SPLIT, None, "mock data: fixed split", "derived")
        put("path_to_cache", None, None, "mock data: no index cache", "derived")

    ev = training.get("eval") or {}
    interval = ev.get("interval")
    put("eval_interval", interval, ("training", "eval", "interval"), "no evaluation during training")
    put("eval_iters", int(ev.get("iters", 10)) if interval else 0, ("training", "eval", "iters"),
        "batches per evaluation" if interval else "no evaluation: no validation batches are built",
        "" if interval else "derived")

    tok = intent.get("tokenizer")
    if isinstance(tok, dict):
        put("tokenizer_type", TOKENIZER_TYPES[tok.get("type", "huggingface")], ("tokenizer", "type"),
            "schema default: a HuggingFace tokenizer")
        put("tokenizer_model", tok["path"], ("tokenizer", "path"), "")
        put("tokenizer_vocab_size", tok.get("vocab_size"), ("tokenizer", "vocab_size"),
            "not declared: preflight checks the real tokenizer's vocabulary")
    else:
        put("tokenizer_type", "NullTokenizer", None, "no tokenizer key: NullTokenizer (mock data only, TOK002)", "default")
        put("tokenizer_model", None, None, "no tokenizer files", "default")
        put("tokenizer_vocab_size", None, None, "NullTokenizer takes the model's vocab_size", "derived")

    ck: dict[str, Any] = intent["checkpoint"] if isinstance(intent.get("checkpoint"), dict) else {}
    save = ck.get("save")
    put("save", save, ("checkpoint", "save"), "no checkpoint key: nothing is saved")
    put("load", ck.get("load"), ("checkpoint", "load"), "no resume directory")
    iters = int(training["train_iters"])
    every = ck.get("interval")
    if every is None:
        put("save_interval", min(iters, DEFAULT_SAVE_INTERVAL) if save else None, None,
            f"every {DEFAULT_SAVE_INTERVAL} iterations, or once at the end of a shorter run" if save
            else "nothing is saved", "default")
    else:
        put("save_interval", every, ("checkpoint", "interval"), "")
    put("ckpt_format", ck.get("format", "torch_dist"), ("checkpoint", "format"),
        "torch_dist: the format Bridge 0.6.2 saves and resumes without Megatron FSDP")
    put("async_save", bool(ck.get("async", False)), ("checkpoint", "async"), "synchronous saves")
    put("pretrained_checkpoint", ck.get("pretrained"), ("checkpoint", "pretrained"), "weights start from random init")
    put("exit_signal_handler", bool(save), None,
        "save a checkpoint and stop on SIGTERM (preemption, scancel)" if save else "nothing to save on SIGTERM",
        "derived")

    lg: dict[str, Any] = intent["logging"] if isinstance(intent.get("logging"), dict) else {}
    put("log_interval", int(lg.get("interval", 1)), ("logging", "interval"), "log every iteration")
    put("tensorboard_dir", lg.get("tensorboard"), ("logging", "tensorboard"), "no TensorBoard")
    wb = lg.get("wandb") if isinstance(lg.get("wandb"), dict) else None
    put("wandb_project", wb["project"] if wb else None, ("logging", "wandb", "project"), "no Weights & Biases")
    name = (wb.get("name") or intent["name"]) if wb else None
    put("wandb_exp_name", name, ("logging", "wandb", "name"), "W&B run named after the recipe" if wb else "no W&B")
    put("wandb_entity", wb.get("entity") if wb else None, ("logging", "wandb", "entity"), "default W&B entity")

    # The learning-rate schedule: train.py builds the optimizer itself (for catalogue and custom models alike) with
    # the intent's peak; warm-up and decay follow the run's length (a recipe's warm-up can outlast a short run, and
    # its decay length is for its own length).
    lr = float(training["lr"])
    put("lr", lr, ("training", "lr"), f"schema default {lr:g} (training.lr): train.py builds the optimizer with it, "
        "for a catalogue model too")
    put("min_lr", float(f"{lr / 10:.6g}"), None, "a tenth of the peak learning rate", "derived")
    put("lr_warmup_iters", max(1, min(500, iters // 10)), None,
        "a tenth of train_iters, at most 500: the schedule fits the run's length", "derived")
    put("lr_decay_iters", iters, None, "cosine decay over the whole run (train_iters)", "derived")
    put("comm_overlap", "explicit", None, "every CommOverlapConfig field the plan decides is set explicitly (None would "
        "let Bridge decide); a recipe without a CommOverlapConfig gets a new one for them", "derived")
    put("tp_comm_overlap", False, None, "TP communication overlap needs TE userbuffers set up for the exact "
        "shapes; mocompile does not plan it (Bridge's CommOverlapConfig.tp_comm_overlap)", "derived")

    pr = intent.get("profile") if isinstance(intent.get("profile"), dict) else None
    put("use_pytorch_profiler", pr is not None, ("profile",), "no profile")
    put("profile_step_start", pr["start"] if pr else None, ("profile", "start"), "no profile")
    put("profile_step_end", pr["end"] if pr else None, ("profile", "end"), "no profile")
    put("profile_ranks", [int(r) for r in pr.get("ranks", [0])] if pr else None, ("profile", "ranks"),
        "schema default: rank 0 records the trace" if pr else "no profile")
    put("pytorch_profiler_collect_shapes", bool(pr.get("shapes", False)) if pr else False,
        ("profile", "shapes"), "no tensor shapes (smaller traces)")
    return out


def apply(plan: Plan, doc: Document) -> Plan:
    """Add these settings to a resolved plan (call before the rule check)."""
    from mocompile.resolve import kubernetes, mounts

    plan.settings.update(decisions(plan.intent, doc))
    if plan.get("use_megatron_fsdp") and plan.settings["ckpt_format"].source != "user":
        plan.settings["ckpt_format"] = Decision(
            "fsdp_dtensor", "derived", "Megatron-FSDP saves and resumes only fsdp_dtensor (Bridge's ConfigContainer."
            "_validate_and_apply_megatron_fsdp_configs)")
    plan.settings["container_mounts"] = mounts.decision(plan)
    plan.settings["kubernetes_rdma"] = kubernetes.rdma_decision(plan)
    written = _written(doc.data, ("launch", "targets"))
    plan.settings["kubernetes_target"] = Decision(
        "kubernetes" in ((plan.intent.get("launch") or {}).get("targets") or []), "user" if written else "default",
        "launch.targets", position=doc.position(("launch", "targets")) if written else None)
    container = (plan.intent.get("launch") or {}).get("container")
    plan.settings["kubernetes_image"] = Decision(
        container or DEFAULT_IMAGE, "user" if container else "default",
        "launch.container" if container else "no launch.container: NeMo's unpinned image, since no NeMo container is "
        "documented with the lock's stack (Megatron-Bridge docs/releases/software-versions.md lists none with Bridge "
        "0.6); set launch.container to one you have checked",
        position=doc.position(("launch", "container")) if container else None)
    return plan
