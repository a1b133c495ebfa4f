"""`launch.kubernetes.api: trainjob`: a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1), checked
against Kubeflow's own API models (kubeflow-trainer-api, generated from the Trainer's OpenAPI spec): the manifest
parses into TrainerV1alpha1TrainJob and serialises back unchanged, so no field is unknown, misspelt or of the
wrong type."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, recipe_files
from mocompile.pipeline import compile_recipe

api = pytest.importorskip("kubeflow_trainer_api.models.trainer_v1alpha1_train_job",
                          reason="kubeflow-trainer-api not installed (tests/ecosystem/setup.sh installs it)")

SETS = ["launch.targets=[torchrun, slurm, kubernetes]", "launch.kubernetes.api=trainjob"]


def _job(recipe: str, extra: list[str] | None = None):
    from ruamel.yaml import YAML
    result = compile_recipe(str(ROOT / recipe), SETS + (extra or []))
    assert not result.errors, result.errors
    return result.files, YAML(typ="safe").load(result.files["trainjob.yaml"])


@pytest.mark.parametrize("recipe", recipe_files())
def test_every_recipe_gives_a_trainjob_kubeflows_models_accept_unchanged(recipe):
    files, doc = _job(recipe)
    parsed = api.TrainerV1alpha1TrainJob.from_dict(doc)
    assert parsed.to_dict() == doc  # nothing dropped (unknown field) or coerced
    lock = json.loads(files["mocompile.lock.json"])
    trainer = doc["spec"]["trainer"]
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] == "TrainJob"
    assert doc["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainer["numNodes"] == lock["hardware"]["nodes"]
    assert trainer["numProcPerNode"] == lock["hardware"]["gpus_per_node"]
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == lock["hardware"]["gpus_per_node"]
    assert {e["name"]: e["value"] for e in trainer["env"]} == {k: v["value"] for k, v in lock["env"].items()}
    assert trainer["command"] == ["bash", "-c"] and "preflight.sh" in trainer["args"][0]


def test_a_typo_in_the_manifest_is_what_the_round_trip_catches():
    """The check bites: a misspelt field is dropped by the models, a string count is refused."""
    _, doc = _job("recipes/tiny-moe-h100x2.yaml")
    bad = json.loads(json.dumps(doc))
    bad["spec"]["trainer"]["numNode"] = bad["spec"]["trainer"].pop("numNodes")
    assert api.TrainerV1alpha1TrainJob.from_dict(bad).to_dict() != bad
    bad = json.loads(json.dumps(doc))
    bad["spec"]["trainer"]["numProcPerNode"] = "2"
    with pytest.raises(ValueError):
        api.TrainerV1alpha1TrainJob.from_dict(bad)


def test_the_runtime_patch_mounts_shared_memory_and_the_host_folders_in_the_node_container():
    _, doc = _job("recipes/tiny-moe-h100x2.yaml", ["launch.container=nvcr.io/nvidia/nemo:25.11",
                                                   "launch.mounts=[/data/sets]", "launch.kubernetes.runtime=my-rt"])
    assert doc["spec"]["runtimeRef"]["name"] == "my-rt" and doc["spec"]["trainer"]["image"] == "nvcr.io/nvidia/nemo:25.11"
    patch = doc["spec"]["runtimePatches"][0]
    job = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert job["name"] == "node"  # the replicated job (and container) Kubeflow's torch runtime runs the trainer in
    pod = job["template"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert pod["containers"][0]["name"] == "node"
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    assert volumes[mounts["/data/sets"]]["hostPath"] == {"path": "/data/sets", "type": "Directory"}


@pytest.mark.parametrize("api_name", ["pytorchjob", "trainjob"])
def test_multi_node_pods_request_the_clusters_rdma_resource(api_name):
    from ruamel.yaml import YAML
    sets = ["launch.targets=[torchrun, kubernetes]", f"launch.kubernetes.api={api_name}", "hardware.nodes=2",
            "launch.kubernetes.rdma_resource=rdma/ib", "launch.kubernetes.rdma_per_pod=2"]
    result = compile_recipe(str(ROOT / "recipes/tiny-moe-h100x2.yaml"), sets)
    assert not result.errors and "LAU002" not in {d.rule for d in result.diagnostics}
    doc = YAML(typ="safe").load(result.files["trainjob.yaml"])
    if api_name == "trainjob":
        limits = doc["spec"]["trainer"]["resourcesPerNode"]["limits"]
        assert api.TrainerV1alpha1TrainJob.from_dict(doc).to_dict() == doc
    else:
        from test_kubernetes import _errors
        limits = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert _errors(doc) == []
    assert limits == {"nvidia.com/gpu": 2, "rdma/ib": 2}
    # without the resource: no request, and LAU002 warns at launch.targets
    result = compile_recipe(str(ROOT / "recipes/tiny-moe-h100x2.yaml"), sets[:3])
    warned = [d for d in result.diagnostics if d.rule == "LAU002"]
    assert warned and warned[0].severity == "warning" and "rdma/ib" not in result.files["trainjob.yaml"]
