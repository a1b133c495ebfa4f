"""Structure-aware fuzzing: intents drawn from the intent's own JSON Schema, and `--set` overrides
on the real recipes drawn from the schema's keys with schema-valid and hostile values.

Schema-valid intents reach the resolver and the rules (the byte mutants mostly stop at the
loader); every one must end as a plan, findings or a clean input error in under a second.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .harness import RECIPES, SLOW_S, Workdir, compile_text, examples, nightly, stats, warm_up
from .schema_strategy import from_schema
from .test_fuzz_recipes import NAMES, TEXTS, TOKENS

REQUIRED = ["schema", "model", "hardware", "goal"]


def _merge_required(node: dict[str, Any], frag: dict[str, Any]) -> None:
    """Put the `else` branch's (nested) `required` lists back where they apply: the schema for a recipe without
    `extends`, which is what this strategy draws."""
    if frag.get("required"):
        node["required"] = sorted(set(node.get("required", [])) | set(frag["required"]))
    for key, sub in (frag.get("properties") or {}).items():
        _merge_required(node["properties"][key], sub)


def _intent_schema() -> dict[str, Any]:
    from mocompile.jsonschema import json_schema
    schema = copy.deepcopy(json_schema())
    _merge_required(schema, schema.pop("else"))
    schema.pop("if")
    schema["required"] = REQUIRED
    schema["properties"].pop("extends")  # a base file is the limits tests' business
    return schema


def _leaves(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every settable key path with its schema (mappings are settable as a whole too)."""
    out = []
    for key, sub in schema.get("properties", {}).items():
        p = f"{path}.{key}".lstrip(".")
        out.append((p, sub))
        out += _leaves(sub, p)
    for alt in schema.get("anyOf", []):
        out += _leaves(alt, path)
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Workdir:
    w = Workdir(tmp_path_factory.mktemp("fuzz-schema"))
    warm_up(w)
    return w


def test_schema_drawn_intents_give_a_plan_or_a_clean_error(work):
    stat = stats("schema intents")

    @settings(max_examples=examples("schema"), deadline=None, derandomize=not nightly(), database=None,
              suppress_health_check=list(HealthCheck))
    @given(from_schema(_intent_schema()))
    def run(intent: dict[str, Any]) -> None:
        compile_text(json.dumps(intent, indent=1), work.root / "_fuzz.yaml", stat=stat)

    run()
    assert stat.inputs >= examples("schema") * 0.9
    assert stat.outcomes.get("plan", 0) > 0, "no schema-drawn intent planned: the strategy misses the schema"
    assert stat.outcomes.get("findings", 0) > 0, "no schema-drawn intent broke a rule: the rules are never reached"


LEAVES = _leaves(_intent_schema())


@st.composite
def overrides(draw) -> tuple[str, list[str]]:
    """A real recipe and one to three `--set key=value` with schema-valid or hostile values."""
    name = draw(st.sampled_from(NAMES))
    sets = []
    for _ in range(draw(st.integers(1, 3))):
        key, sub = draw(st.sampled_from(LEAVES))
        if draw(st.booleans()):
            value = json.dumps(draw(from_schema(sub, key)))
        else:
            value = draw(st.sampled_from(TOKENS))
        sets.append(f"{key}={value}")
    return name, sets


def test_schema_keyed_overrides_give_a_plan_or_a_clean_error(work):
    stat = stats("--set overrides")

    @settings(max_examples=examples("overrides"), deadline=None, derandomize=not nightly(), database=None,
              suppress_health_check=list(HealthCheck))
    @given(overrides())
    def run(case: tuple[str, list[str]]) -> None:
        name, sets = case
        compile_text(TEXTS[name], work.path_for(name), sets=sets, stat=stat)

    run()
    assert stat.inputs >= examples("overrides") * 0.9
    assert {"plan", "input"} <= set(stat.outcomes), stat.outcomes


def test_huge_cluster_is_planned_or_refused_quickly(tmp_path):
    """10**10 nodes: the planner never enumerates the world size's divisors (it was minutes before)."""
    import multiprocessing as mp

    path = tmp_path / "huge.yaml"
    path.write_text((RECIPES / "tiny-moe-h100x2.yaml").read_text())
    proc = mp.get_context("spawn").Process(target=compile_text, args=(path.read_bytes(), path,
                                                                       ["hardware.nodes=10000000000"]))
    proc.start()
    proc.join(10 * SLOW_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise TimeoutError("10**10 nodes: still planning after 10 s")
    assert proc.exitcode == 0  # a crash is a real failure, not this known slowness
