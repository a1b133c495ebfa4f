"""The ncclep flex backend (NCCL EP through Transformer Engine) against the real megatron-core 0.19.2 and
megatron-bridge 0.6.2.

* DSP010: Bridge's ``apply_flex_dispatcher_backend`` keeps ``ncclep`` on exactly the GPUs the hardware catalogue
  lists it for (and ``validate_flex_dispatcher_backend`` raises on the others); one child process behind the TE
  import shim, torch.cuda faking each GPU (``bridge_validate.py``).
* DSP015: Megatron-Core warns that EP overlap with ncclep (no static shape) serialises exactly where mocompile warns.
* The rank capacity factor mocompile emits: Megatron-Core accepts it with ncclep only, and the receive budget
  ``_NCCLEPManager`` computes from it (its own code, run up to the TE bootstrap it cannot reach here) holds the
  most a rank can receive.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from mocompile.catalogue import gpus
from mocompile.ncclep import rank_capacity_factor
from mocompile.pipeline import analyse
from mocompile.rules.engine import broken_rules
from test_parity_transformer_config import RULE_BASE, _overrides, build_real

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.stack

NCCLEP = dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="ncclep", te_version="2.17.0",
              moe_flex_dispatcher_num_sms=None, gpu_flex_backends=["deepep", "hybridep", "ncclep"])

DRIVER = textwrap.dedent('''
    import json, sys, warnings
    from pathlib import Path
    from types import SimpleNamespace
    root, out, gpus = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    sys.path[:0] = [str(root / "tests" / "stack")]
    import bridge_validate as bv
    bv._ensure_te_shim()
    warnings.simplefilter("ignore")
    from megatron.bridge.training.flex_dispatcher_backend import (
        apply_flex_dispatcher_backend, validate_flex_dispatcher_backend)
    result = {}
    for gpu in gpus:
        with bv.fake_gpu(gpu):
            model = SimpleNamespace(num_moe_experts=8, moe_token_dispatcher_type="alltoall",
                                    moe_flex_dispatcher_backend="deepep", moe_shared_expert_overlap=True)
            apply_flex_dispatcher_backend(model, "ncclep")
            kept = (model.moe_token_dispatcher_type, model.moe_flex_dispatcher_backend)
            flex = SimpleNamespace(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="ncclep")
            try:
                validate_flex_dispatcher_backend(flex)
                error = None
            except ValueError as exc:
                error = str(exc)
        result[gpu] = {"kept": list(kept), "shared_overlap": model.moe_shared_expert_overlap, "validate": error}
    out.write_text(json.dumps(result))
''')


@pytest.fixture(scope="module")
def base_flat() -> dict:
    """The parity tests' legal base (tiny MoE on 2 H100s, EP 2 with EP overlap, TE 2.12)."""
    result = analyse(str(RULE_BASE), _overrides({"moe.overlap": True, "parallelism.ep": 2}))
    assert not result.errors
    return result.plan.values()


@pytest.fixture(scope="module")
def bridge_on_each_gpu(tmp_path_factory, site_packages) -> dict:
    import json
    import subprocess
    import sys

    from bridge_validate import GPUS

    tmp = tmp_path_factory.mktemp("ncclep")
    script, out = tmp / "driver.py", tmp / "result.json"
    script.write_text(DRIVER, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(ROOT), str(out), *sorted(GPUS)],
                          capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


def test_bridge_keeps_ncclep_exactly_where_dsp010_allows_it(base_flat, bridge_on_each_gpu):
    """Hopper and Blackwell keep flex + ncclep (shared-expert overlap cleared); A100 falls back to alltoall and
    Bridge's validate raises there: mocompile's DSP010 refuses the same GPUs and no other."""
    for gpu, seen in bridge_on_each_gpu.items():
        legal = [b.split("-", 1)[1] for b in gpus()[gpu]["dispatchers"]["legal"] if b.startswith("flex-")]
        refused = "DSP010" in {r.id for r in broken_rules({**base_flat, **NCCLEP, "gpu_flex_backends": legal})}
        if refused:
            assert seen["kept"] == ["alltoall", None] and "NCCL EP is supported for Hopper and Blackwell" in \
                seen["validate"], (gpu, seen)
        else:
            assert seen == {"kept": ["flex", "ncclep"], "shared_overlap": False, "validate": None}, (gpu, seen)
    assert {g for g, s in bridge_on_each_gpu.items() if s["kept"] == ["alltoall", None]} == {"a100"}


@pytest.mark.parametrize("changes,warned", [
    (dict(NCCLEP, overlap_moe_expert_parallel_comm=True), True),
    (dict(NCCLEP, overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False), False),
    (dict(NCCLEP, moe_flex_dispatcher_backend="deepep", moe_flex_dispatcher_num_sms=20,
          overlap_moe_expert_parallel_comm=True), False),
])
def test_megatron_core_warns_of_the_serialised_overlap_where_dsp015_does(mcore, base_flat, changes, warned):
    cfg = {**base_flat, **changes}
    exc, seen = build_real(mcore, cfg)
    assert exc is None, exc
    upstream = any("overlap_moe_expert_parallel_comm with ncclep and moe_ncclep_static_shape=False" in w for w in seen)
    assert upstream is warned
    assert ("DSP015" in {r.id for r in broken_rules(cfg)}) is warned


def test_the_rank_capacity_factor_is_accepted_with_ncclep_only(mcore, base_flat):
    """train.py sets moe_expert_rank_capacity_factor for ncclep plans alone: Megatron-Core accepts it there and
    refuses it with DeepEP ('requires moe_flex_dispatcher_backend to be hybridep or ncclep')."""
    cfg = {**base_flat, **NCCLEP, "overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False,
           "moe_expert_rank_capacity_factor": 2.0}
    assert build_real(mcore, cfg)[0] is None
    exc, _ = build_real(mcore, {**cfg, "moe_flex_dispatcher_backend": "deepep", "moe_flex_dispatcher_num_sms": 20})
    assert exc is not None and "requires moe_flex_dispatcher_backend to be 'hybridep' or 'ncclep'" in str(exc)


@pytest.mark.parametrize("tokens,ep,etp,experts,topk", [
    (4096, 16, 1, 128, 8),   # Qwen3-30B-A3B on EP16: 8 experts per rank, all of top-8 can land on one rank
    (4096, 64, 1, 128, 8),   # 2 experts per rank: at most 2 of a token's 8 reach one rank
    (4096, 8, 2, 64, 6),     # top-6 over 8 local experts, ETP 2 (the budget's TP-folded top-k)
    (1000, 4, 1, 16, 3),     # tokens not a multiple of NCCL EP's 64-token chunk; a factor that is not whole
    (2048, 2, 1, 4, 2),
])
def test_megatron_cores_budget_at_that_factor_holds_the_most_a_rank_can_receive(mcore, tokens, ep, etp, experts,
                                                                               topk):
    """Run Megatron-Core's own _NCCLEPManager._ensure_bootstrap budget arithmetic (it stops at the TE bootstrap,
    which needs NCCL EP) with mocompile's factor: the budget is at least ETP*EP ranks x tokens x min(top-k,
    experts per rank), one row per token and local expert, so dropless routing cannot overflow it."""
    from megatron.core.transformer.moe.token_dispatcher import _NCCLEPManager

    mgr = object.__new__(_NCCLEPManager)
    mgr._bootstrapped, mgr.num_local_tokens, mgr.router_topk = False, tokens, etp * topk
    mgr.rank_capacity_factor, mgr.alignment = rank_capacity_factor(ep, experts, topk), 0
    mgr.group, mgr.num_experts, mgr.hidden_dim, mgr.config, mgr.zero_copy = None, etp * experts, 64, None, False
    with pytest.raises(Exception):  # noqa: B017 - whatever stops it past the budget (no TE NCCL EP here)
        mgr._ensure_bootstrap()
    worst = etp * ep * tokens * min(topk, experts // ep)
    assert mgr._recv_capacity >= worst, (mgr._recv_capacity, worst)
    # and not needlessly more than one hundredth of the factor above it
    assert mgr._recv_capacity <= worst * (1 + 0.01 * topk / (ep * min(topk, experts // ep))) + 64 * etp * topk * 2
