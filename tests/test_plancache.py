"""The CLI's planner cache: a hit gives exactly the verdict a fresh search gives; any change misses."""

from __future__ import annotations

import json

from conftest import run_cli

INTENT = """schema: 1
model: qwen3-30b-a3b
hardware: {gpu: h100, nodes: 2}
goal: throughput
training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: GBS}
moe: {force_balance: true}
"""


def explain(path, cache, **env):
    proc = run_cli("explain", str(path), "--format", "json", env={"XDG_CACHE_HOME": str(cache), **env})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    return out["settings"], out["estimate"]


def test_a_cache_hit_is_the_verdict_a_fresh_search_gives(tmp_path):
    path = tmp_path / "q30.yaml"
    path.write_text(INTENT.replace("GBS", "1024"))
    cache = tmp_path / "cache"
    first = explain(path, cache)
    plans = list((cache / "mocompile" / "plans").glob("*.json"))
    assert len(plans) == 1, "the verdict is stored"
    assert explain(path, cache) == first, "a hit reproduces settings, reasons and estimate"
    assert explain(path, cache, MOCOMPILE_NO_CACHE="1") == first, "and equals a fresh search"


def test_a_changed_intent_misses_the_cache(tmp_path):
    path = tmp_path / "q30.yaml"
    cache = tmp_path / "cache"
    path.write_text(INTENT.replace("GBS", "1024"))
    explain(path, cache)
    path.write_text(INTENT.replace("GBS", "2048"))
    settings, _ = explain(path, cache)
    assert settings["global_batch_size"]["value"] == 2048
    assert len(list((cache / "mocompile" / "plans").glob("*.json"))) == 2


def test_a_broken_cache_entry_is_searched_again(tmp_path):
    path = tmp_path / "q30.yaml"
    path.write_text(INTENT.replace("GBS", "1024"))
    cache = tmp_path / "cache"
    first = explain(path, cache)
    for entry in (cache / "mocompile" / "plans").glob("*.json"):
        entry.write_text('{"winner": 1}')
    assert explain(path, cache) == first
