"""Offline HF ``config.json`` stubs for the Megatron-Bridge standard recipes (AutoBridge).

Bridge's standard recipes build ``cfg.model`` with
``AutoBridge.from_hf_pretrained(<hf id>[, revision=...]).to_megatron_provider(load_weights=False)``,
which reads the model's ``config.json`` from the HF hub. The stack tests have no network, so
they serve one from a throw-away HF cache (``bridge_validate.py --hf-config``). The configs are
built here from mocompile's own model catalogue (``compiler/mocompile/data/models.yaml``) with
transformers' config classes, so the numbers Bridge reads are the numbers mocompile planned
with. Fields the catalogue does not carry (MLA ranks, router groups, RoPE, GPT-OSS windows)
keep the transformers class defaults, which are those models' published values.

``python tests/stack/hf_configs.py OUTDIR`` writes one JSON per catalogued model that has a
Bridge recipe and prints ``--hf-config`` arguments for ``bridge_validate.py``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "compiler"))


def catalogue() -> dict[str, dict]:
    from mocompile.datafiles import load_yaml

    return load_yaml(str(ROOT / "compiler" / "mocompile" / "data" / "models.yaml"))["models"]


def _qwen3_moe(m: dict) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["ffn_hidden_size"],
        moe_intermediate_size=m["moe_ffn_hidden_size"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_attention_heads"], num_key_value_heads=m["num_query_groups"],
        head_dim=m["kv_channels"], num_experts=m["num_moe_experts"], num_experts_per_tok=m["moe_router_topk"],
        decoder_sparse_step=1, mlp_only_layers=list(range(m.get("first_k_dense") or 0)),
        attention_bias=m["add_bias_linear"], tie_word_embeddings=False, norm_topk_prob=True,
        max_position_embeddings=40960, rms_norm_eps=1e-6,
        architectures=["Qwen3MoeForCausalLM"], dtype="bfloat16",
    )


def _deepseek_v3(m: dict, **published: Any) -> Any:
    from transformers import DeepseekV3Config

    shared = m.get("shared_expert_size") or 0
    return DeepseekV3Config(**published,
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["ffn_hidden_size"],
        moe_intermediate_size=m["moe_ffn_hidden_size"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_attention_heads"], num_key_value_heads=m["num_query_groups"],
        n_shared_experts=shared // m["moe_ffn_hidden_size"] if shared else 0,
        n_routed_experts=m["num_moe_experts"], num_experts_per_tok=m["moe_router_topk"],
        first_k_dense_replace=m.get("first_k_dense") or 0, v_head_dim=m["kv_channels"],
        tie_word_embeddings=False, architectures=["DeepseekV3ForCausalLM"], dtype="bfloat16",
    )


def _moonlight(m: dict) -> Any:
    """Moonlight-16B-A3B's config.json is a DeepSeek-V3 one (Bridge's recipe loads it through DeepSeekV3Bridge)
    whose MLA and router fields differ from DeepseekV3Config's defaults, which are DeepSeek-V3's: no query
    low-rank projection and one router group (moonshotai/Moonlight-16B-A3B config.json: q_lora_rank null,
    n_group 1, topk_group 1, routed_scaling_factor 2.446; the catalogue's q_lora_rank 0)."""
    return _deepseek_v3(m, q_lora_rank=m.get("q_lora_rank") or None, n_group=1, topk_group=1,
                        routed_scaling_factor=2.446)


def _glm4_moe(m: dict) -> Any:
    """GLM-4.5 / GLM-4.5-Air: QKV bias (attention_bias), half-rotary RoPE (the class default), one shared expert of
    the routed width, MTP from num_nextn_predict_layers (GLM45Bridge reads it)."""
    from transformers import Glm4MoeConfig

    shared = m.get("shared_expert_size") or 0
    return Glm4MoeConfig(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["ffn_hidden_size"],
        moe_intermediate_size=m["moe_ffn_hidden_size"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_attention_heads"], num_key_value_heads=m["num_query_groups"],
        head_dim=m["kv_channels"], n_shared_experts=shared // m["moe_ffn_hidden_size"] if shared else 0,
        n_routed_experts=m["num_moe_experts"], num_experts_per_tok=m["moe_router_topk"],
        first_k_dense_replace=m.get("first_k_dense") or 0, attention_bias=True, use_qk_norm=bool(m["qk_layernorm"]),
        num_nextn_predict_layers=m.get("mtp_num_layers") or 0, tie_word_embeddings=False,
        architectures=["Glm4MoeForCausalLM"], dtype="bfloat16",
    )


def _gpt_oss(m: dict) -> Any:
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["moe_ffn_hidden_size"],
        num_hidden_layers=m["num_layers"], num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_query_groups"], head_dim=m["kv_channels"],
        num_local_experts=m["num_moe_experts"], num_experts_per_tok=m["moe_router_topk"],
        attention_bias=m["add_bias_linear"], tie_word_embeddings=False,
        architectures=["GptOssForCausalLM"], dtype="bfloat16",
    )


BUILDERS = {"megatron.bridge.recipes.qwen": _qwen3_moe, "megatron.bridge.recipes.deepseek": _deepseek_v3,
            "megatron.bridge.recipes.gpt_oss": _gpt_oss, "megatron.bridge.recipes.moonlight": _moonlight,
            "megatron.bridge.recipes.glm": _glm4_moe}


def pinned_revisions(site_packages: Path) -> dict[str, str]:
    """HF id -> revision, where a Bridge recipe pins one (read from the recipe source)."""
    out: dict[str, str] = {}
    for path in (site_packages / "megatron" / "bridge" / "recipes").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        ids = dict(re.findall(r'^(_\w+)_MODEL_ID\s*=\s*"([^"]+)"', text, re.M))
        for prefix, rev in re.findall(r'^(_\w+)_MODEL_REVISION\s*=\s*"([0-9a-f]{40})"', text, re.M):
            if prefix in ids:
                out[ids[prefix]] = rev
    return out


def hf_config(model_id: str) -> dict:
    """config.json for a catalogued model id (e.g. 'qwen3-30b-a3b')."""
    m = catalogue()[model_id]
    build = BUILDERS.get((m.get("bridge") or {}).get("module"))
    if build is None:
        raise KeyError(f"no HF config builder for {model_id} ({(m.get('bridge') or {}).get('module')})")
    return build(m).to_dict()


def entries(model_ids: list[str], site_packages: Path) -> dict[str, dict]:
    """``{"<hf id>[@<revision>]": config}`` for ``bridge_validate.offline_hf_configs``."""
    revs = pinned_revisions(site_packages)
    out = {}
    for mid in model_ids:
        hf_id = catalogue()[mid]["hf_id"]
        key = f"{hf_id}@{revs[hf_id]}" if hf_id in revs else hf_id
        out[key] = hf_config(mid)
    return out


def main(argv: list[str]) -> int:
    import importlib.util

    outdir = Path(argv[0]) if argv else Path(".")
    outdir.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.find_spec("megatron")
    site = Path(list(spec.submodule_search_locations)[0]).parent
    ids = [k for k, m in catalogue().items() if (m.get("bridge") or {}).get("module") in BUILDERS]
    for key, cfg in entries(ids, site).items():
        path = outdir / (key.split("@")[0].replace("/", "--") + ".json")
        path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")
        print(f"--hf-config {key}={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
