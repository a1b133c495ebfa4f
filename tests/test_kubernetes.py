"""The Kubernetes target: every trainjob.yaml is a valid Kubeflow PyTorchJob, checked against the
CRD's own OpenAPI schema (tests/ecosystem/data/kubeflow.org_pytorchjobs.yaml, vendored verbatim
from kubeflow/training-operator v1.9.0, manifests/base/crds/)."""

from __future__ import annotations

import copy
import functools
import json
import re

import pytest
from conftest import ROOT, recipe_files
from mocompile.pipeline import compile_recipe

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (tests/ecosystem/setup.sh)")

CRD = ROOT / "tests" / "ecosystem" / "data" / "kubeflow.org_pytorchjobs.yaml"
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")




def openapi_to_jsonschema(node, strict: bool = True):
    """A CRD's structural OpenAPI v3 schema as JSON Schema. `nullable` becomes a null type, and
    `x-kubernetes-int-or-string` an integer-or-string. strict=True also refuses unknown fields
    wherever the CRD lists properties without preserving unknown fields: what the API server does
    under `kubectl apply --validate=strict` (it would otherwise prune them silently)."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(n, strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {k: openapi_to_jsonschema(v, strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = openapi_to_jsonschema(value, strict)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = openapi_to_jsonschema(value, strict)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (strict and "properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=1)
def crd():
    from ruamel.yaml import YAML
    doc = YAML(typ="safe").load(CRD.read_text())
    version = next(v for v in doc["spec"]["versions"] if v.get("served") and v.get("storage"))
    schema = openapi_to_jsonschema(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return {"group": doc["spec"]["group"], "version": version["name"], "kind": doc["spec"]["names"]["kind"],
            "validator": jsonschema.Draft7Validator(schema)}


def _errors(manifest) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in crd()["validator"].iter_errors(manifest)]


def _manifests(recipe: str):
    """The recipe's trainjob.yaml, with the kubernetes target switched on if it was not."""
    from ruamel.yaml import YAML
    result = compile_recipe(str(ROOT / recipe), ["launch.targets=[torchrun, slurm, kubernetes]"])
    assert not result.errors, result.errors
    return result.files, YAML(typ="safe").load(result.files["trainjob.yaml"])


@pytest.mark.parametrize("path", sorted((ROOT / "generated").glob("*/trainjob.yaml")), ids=lambda p: p.parent.name)
def test_committed_trainjobs_validate_against_the_crd(path):
    from ruamel.yaml import YAML
    doc = YAML(typ="safe").load(path.read_text())
    assert _errors(doc) == []


@pytest.mark.parametrize("recipe", recipe_files())
def test_every_recipe_gives_a_valid_pytorchjob(recipe):
    files, doc = _manifests(recipe)
    c = crd()
    assert doc["apiVersion"] == f"{c['group']}/{c['version']}" and doc["kind"] == c["kind"]
    assert _errors(doc) == []
    # metadata is not in the CRD schema (ObjectMeta): check what the API server checks.
    assert DNS1123_LABEL.match(doc["metadata"]["name"]) and len(doc["metadata"]["name"]) <= 63
    assert DNS1123_LABEL.match(doc["metadata"]["namespace"])
    lock = json.loads(files["mocompile.lock.json"])
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    assert sum(s["replicas"] for s in specs.values()) == lock["hardware"]["nodes"]
    assert doc["spec"]["nprocPerNode"] == str(lock["hardware"]["gpus_per_node"])
    want_env = {k: v["value"] for k, v in lock["env"].items()}
    for spec in specs.values():
        container = spec["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == lock["hardware"]["gpus_per_node"]
        assert {e["name"]: e["value"] for e in container["env"]} == want_env
        assert "preflight.sh" in container["args"][0]


def test_the_validator_is_not_vacuous():
    """Controls: the converted CRD schema rejects what the API server would reject."""
    _, doc = _manifests("recipes/tiny-moe-h100x2.yaml")
    assert _errors(doc) == []
    bad = copy.deepcopy(doc)
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
    assert any("replicas" in e for e in _errors(bad))
    bad = copy.deepcopy(doc)
    bad["spec"]["nprocPerNode"] = 8  # must be a string in the CRD
    assert any("nprocPerNode" in e for e in _errors(bad))
    bad = copy.deepcopy(doc)
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["envv"] = []
    assert any("envv" in e for e in _errors(bad))
    bad = copy.deepcopy(doc)
    del bad["spec"]["pytorchReplicaSpecs"]
    assert any("pytorchReplicaSpecs" in e for e in _errors(bad))
    bad = copy.deepcopy(doc)
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"][0]["value"] = 8
    assert _errors(bad)


def test_without_a_container_the_job_names_the_unpinned_image_and_says_so():
    """No NeMo container is documented with the lock's stack (Megatron-Bridge 0.6.2, megatron-core 0.19.2): the
    default image stays nvcr.io/nvidia/nemo:latest, and both the manifest and `explain` say it is unpinned; a
    recipe's own launch.container replaces it and the note goes."""
    from mocompile.pipeline import analyse
    files, doc = _manifests("recipes/tiny-moe-h100x2.yaml")
    text = files["trainjob.yaml"]
    assert '# unpinned: no NeMo container is documented' in text and 'image: "nvcr.io/nvidia/nemo:latest"' in text
    assert analyse(str(ROOT / "recipes/tiny-moe-h100x2.yaml")).plan.settings["kubernetes_image"].reason.startswith(
        "no launch.container: NeMo's unpinned image")
    pinned, _ = _manifests("recipes/qwen3-30b-a3b-h100x16-hybridep.yaml")  # launch.container: nvcr.io/nvidia/nemo:25.11
    assert "unpinned" not in pinned["trainjob.yaml"] and 'image: "nvcr.io/nvidia/nemo:25.11"' in pinned["trainjob.yaml"]
