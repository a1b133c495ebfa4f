"""An offline Hugging Face cache of ``config.json`` files built from mocompile's model catalogue (issue 23).

The rank probe runs the generated, unmodified ``train.py``, which starts from Bridge's own recipe for a catalogue
model; Bridge's recipe reads the model's HF ``config.json`` (AutoBridge) on start-up, and the GPU hosts have no
internet. The configs are built from mocompile's own numbers (``compiler/mocompile/data/models.yaml``) by the stack
tests' builders (``tests/stack/hf_configs.py``: Qwen3-MoE, DeepSeek-V3, GPT-OSS) plus two it lacks: Qwen3-Next (its
Gated DeltaNet : full attention = 3 : 1 layout and GDN head counts, published values, kept by the transformers class
defaults) and Kimi-K2 (DeepSeek-V3's config class under Bridge's ``KimiK2ForCausalLM`` architecture). Keys carry the
revision Bridge's recipe pins, as ``hf_configs.entries`` computes them.

    python benchmarks/gpu/rankprobe_hf.py OUTDIR MODEL_ID...   # writes OUTDIR/hub; HF_HUB_CACHE=OUTDIR/hub
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "stack"))

import hf_configs  # noqa: E402  (the stack tests' builders)


def _qwen3_next(m: dict) -> dict:
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["ffn_hidden_size"],
        moe_intermediate_size=m["moe_ffn_hidden_size"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_attention_heads"], num_key_value_heads=m["num_query_groups"],
        head_dim=m["kv_channels"], num_experts=m["num_moe_experts"], num_experts_per_tok=m["moe_router_topk"],
        shared_expert_intermediate_size=m["shared_expert_size"], norm_topk_prob=True, tie_word_embeddings=False,
        architectures=["Qwen3NextForCausalLM"], dtype="bfloat16",
    ).to_dict()


def _kimi_k2(m: dict) -> dict:
    cfg = hf_configs._deepseek_v3(m).to_dict()
    cfg.update(architectures=["KimiK2ForCausalLM"], n_group=1, topk_group=1, routed_scaling_factor=2.827,
               scoring_func="sigmoid", topk_method="noaux_tc")
    return cfg


EXTRA = {"qwen3-next-80b-a3b": _qwen3_next, "kimi-k2": _kimi_k2}


def config(model_id: str) -> dict:
    build = EXTRA.get(model_id)
    return build(hf_configs.catalogue()[model_id]) if build else hf_configs.hf_config(model_id)


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    spec = importlib.util.find_spec("megatron")
    site = Path(list(spec.submodule_search_locations)[0]).parent
    revs = hf_configs.pinned_revisions(site)
    for mid in argv[1:]:
        hf_id = hf_configs.catalogue()[mid]["hf_id"]
        revision = revs.get(hf_id, "0" * 40)
        repo = out / "hub" / ("models--" + hf_id.replace("/", "--"))
        snap = repo / "snapshots" / revision
        snap.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision, encoding="utf-8")
        (snap / "config.json").write_text(json.dumps(config(mid), indent=1), encoding="utf-8")
        print(f"{mid}: {hf_id}@{revision}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
