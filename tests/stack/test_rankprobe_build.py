"""The rank probe's model path on CPU, with the real stack (issue 23).

A generated ``train.py`` is imported in a child process that holds torch's fake process group at the plan's world
size, as ``rank_probe()`` sets it up on a GPU: its collective fills (``_simulate_collectives``) are exercised through
``torch.distributed`` and the names Megatron-Core bound at import, Bridge's config is built and the probe's
substitutions applied, Megatron-Core's parallel state is initialised for the impersonated rank, and the rank's model
shard is built on the CPU. Its parameter count must be the memory estimate's (``params_per_gpu_m``), for a rank of
the first and of the last pipeline stage.

What the child stubs, and why: ``megatron.bridge.peft.lora_layers`` imports Transformer Engine unconditionally (the
GPU hosts patch the installed file, benchmarks/gpu/README.md); the alltoall dispatcher creates a CUDA stream at
build (none on a CPU host). Nothing else is faked: the process group is torch's own fake backend.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

pytestmark = pytest.mark.stack

CHILD = textwrap.dedent(r'''
    import importlib.util, json, sys, types
    stub = types.ModuleType("megatron.bridge.peft.lora_layers")
    for n in ("LinearAdapter", "LoRALinear", "LoRATopKRouter", "TELinearAdapter", "TEFusedLoRALinear"):
        setattr(stub, n, type(n, (), {}))
    sys.modules["megatron.bridge.peft.lora_layers"] = stub
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    spec = importlib.util.spec_from_file_location("train", sys.argv[1])
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    probe, rank = train.RANK_PROBE, int(sys.argv[2])
    out = {}
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=probe["world_size"])
    import megatron.core.tensor_parallel.mappings as mappings
    train._simulate_collectives()
    out["mappings_rebound"] = mappings.dist_all_gather_func is dist.all_gather_into_tensor
    world = probe["world_size"]
    counts = torch.tensor([3, 1, 2, 5])
    gathered = torch.full((4 * world,), -1, dtype=torch.long)
    dist.all_gather_into_tensor(gathered, counts)
    out["all_gather"] = gathered.tolist()
    # Megatron-Core's layer-wise optimizer (Muon) gathers uneven shards, this rank's own tensor among the outputs
    src = torch.tensor([7.0, 8.0])
    outs = [src if i == rank else torch.full((2 if i % 2 == 0 else 3,), -1.0) for i in range(world)]
    dist.all_gather(outs, src)
    out["uneven_all_gather"] = [t.tolist() for t in outs[:2]]
    sent = torch.arange(12.0).view(6, 2)
    got = torch.full((10, 2), -1.0)
    dist.all_to_all_single(got, sent, [10] + [0] * (world - 1), [6] + [0] * (world - 1))
    out["all_to_all"] = got[:, 0].tolist()
    leaf = torch.zeros(4, requires_grad=True)
    dist.irecv(leaf, src=(rank + 1) % world)
    out["recv_filled"] = bool(leaf.detach().abs().sum() > 0)
    cfg = train.build_config()
    for field, value in probe["model"].items():
        setattr(cfg.model, field, value)
    mc = cfg.model
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(
        tensor_model_parallel_size=mc.tensor_model_parallel_size,
        pipeline_model_parallel_size=mc.pipeline_model_parallel_size,
        expert_model_parallel_size=mc.expert_model_parallel_size,
        expert_tensor_parallel_size=mc.expert_tensor_parallel_size,
        context_parallel_size=mc.context_parallel_size, create_gloo_process_groups=False, order="tp-cp-ep-dp-pp")
    out["stage"] = ps.get_pipeline_model_parallel_rank()
    out["coords"] = [ps.get_tensor_model_parallel_rank(), ps.get_expert_model_parallel_rank()]
    out["dispatcher"] = mc.moe_token_dispatcher_type
    mc.use_cpu_initialization = True
    torch.cuda.Stream = lambda *a, **k: object()  # the alltoall dispatcher's DtoH stream (no CUDA here)
    mc.finalize()
    model = mc.provide(pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())
    out["params"] = sum(p.numel() for p in model.parameters())
    print("RESULT " + json.dumps(out))
''')

from test_rankprobe import TINY16 as INTENT  # noqa: E402  (the CPU tests' 16-GPU, 2-stage plan)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rankprobe")
    (tmp / "tiny16.yaml").write_text(INTENT)
    proc = subprocess.run([sys.executable, "-m", "mocompile", "compile", str(tmp / "tiny16.yaml"), "-o", str(tmp / "gen")],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "compiler"),
                                                                          "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "gen" / "tiny16" / "train.py"


def _child(train_py, rank: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(train_py), str(rank)], capture_output=True, text=True,
                          timeout=280, cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("rank, stage", [(0, 0), (8, 1)])
def test_the_probed_rank_builds_its_shard_of_the_estimated_size_under_a_fake_group(generated, rank, stage):
    probe = _probe_spec(generated)
    out = _child(generated, rank)
    # the collectives a fake group leaves unfilled come back as if every rank held this rank's data
    assert out["mappings_rebound"] is True
    assert out["all_gather"] == [3, 1, 2, 5] * probe["world_size"]
    # torch's fake group refuses outputs of another size than the input; the probe hands it even ones and fills
    # the real, uneven outputs (what fits, repeated)
    assert out["uneven_all_gather"] == [[7.0, 8.0], [7.0, 8.0, 7.0]]
    assert out["all_to_all"] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 0.0, 2.0, 4.0, 6.0]
    assert out["recv_filled"] is True
    # the plan's DeepEP and natural routing are replaced for the probe; the rank is the stage's data-loading rank
    assert probe["model"] == {"moe_token_dispatcher_type": "alltoall", "moe_router_force_load_balancing": True}
    assert out["dispatcher"] == "alltoall"
    assert out["stage"] == stage and out["coords"] == [0, 0]
    # every stage of this even split holds the same layers; the first stage holds the embedding, the last the output
    # layer (untied, the same size): the estimate's per-rank parameters (0.05 M rounding)
    assert abs(out["params"] / 1e6 - probe["estimate"]["probe"]["params_per_gpu_m"]) <= 0.05


def _probe_spec(train_py) -> dict:
    import ast

    tree = ast.parse(train_py.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "RANK_PROBE")
    return ast.literal_eval(node.value)
