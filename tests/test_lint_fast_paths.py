"""The cold-`lint` fast paths (issue 8, item 8) give what the plain paths give.

The planner's memoised memory and step-time models equal the one-shot functions for every candidate,
whatever was asked before; ``lint FILE...`` parsed without argparse is argparse's namespace; the cached
pyproject parse sees every edit; the rule check that stops early keeps the same verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import FIXTURES, ROOT, overrides
from mocompile import cli, memory, project, steptime
from mocompile.load import load
from mocompile.resolve import context, search
from mocompile.schema import validate
from mocompile.steptime import Candidate

DSV3 = ("schema: 1\nmodel: deepseek-v3\nhardware: {gpu: h100, nodes: 32}\ngoal: throughput\n"
        "training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 4096}\n")


def ctx_of(path, **sets):
    doc = load(str(path), overrides(sets))
    return context(validate(doc), doc)


def candidates(ctx):
    """A spread of candidates: every layout with a few knob settings and every recompute rung."""
    rungs = search.ladder(ctx, False)
    out = []
    for i, lay in enumerate(search.layouts_for(ctx, ctx["world_size"])):
        for disp, ov, graphs in (("alltoall", False, "none"), ("deepep", True, "te_rp"), ("hybridep", False, "te_rp"),
                                 ("alltoall", True, "full_iteration")):
            out.append(Candidate(lay.tp, lay.pp, lay.vpp, lay.ep, lay.etp, lay.cp, disp, ov, ov and i % 2 == 0,
                                 rungs[i % len(rungs)], graphs))
    return out


@pytest.fixture(scope="module")
def dsv3(tmp_path_factory):
    path = tmp_path_factory.mktemp("dsv3") / "dsv3.yaml"
    path.write_text(DSV3)
    return ctx_of(path)


def ctx_named(which, dsv3, tmp_path):
    """The contexts these tests sweep: DeepSeek-V3 on 256 H100s, the tiny local recipe, Qwen3-30B in MXFP8."""
    if which == "dsv3":
        return dsv3
    if which == "tiny-local":
        return ctx_of(ROOT / "recipes" / "tiny-moe-h100x2.yaml")
    path = tmp_path / "q.yaml"
    path.write_text("schema: 1\nmodel: qwen3-30b-a3b\nhardware: {gpu: b200, nodes: 2}\ngoal: throughput\n"
                    "training: {seq_length: 4096, micro_batch_size: 2, global_batch_size: 512, precision: mxfp8}\n")
    return ctx_of(path)


@pytest.mark.parametrize("which", ["dsv3", "tiny-local", "fp8"])
def test_the_memoised_models_equal_the_one_shot_estimates(which, dsv3, tmp_path):
    ctx = ctx_named(which, dsv3, tmp_path)
    sc = search.Scorer(ctx)
    cands = candidates(ctx)
    assert len(cands) > 20
    for cand in cands:  # one Scorer (memos filled by the earlier candidates) against fresh one-shot calls
        mem = sc.memory(cand)
        assert mem == memory.estimate(ctx.model, sc.config(cand)), cand
        assert sc.total_gib(cand) == mem["total_gib"], cand
        est = sc.score(cand).est
        fresh = steptime.estimate(ctx.model, sc.hw, cand, sc.batch, sc.world)
        assert (est.step_s, est.terms, est.tflops_per_gpu, est.notes) == \
            (fresh.step_s, fresh.terms, fresh.tflops_per_gpu, fresh.notes), cand


def test_the_search_s_fast_candidate_is_the_dataclass_s_own(dsv3):
    """``search._candidate`` skips the frozen dataclass's per-field checks: what it makes must be the very value
    ``Candidate(...)`` makes (equal, same hash and label, copied by ``replace``), or the search's memos and the plan
    cache would see two plans where there is one."""
    for cand in candidates(dsv3)[:200]:
        fast = search._candidate(cand.tp, cand.pp, cand.vpp, cand.ep, cand.etp, cand.cp, cand.dispatcher, cand.overlap,
                                 cand.delay_wgrad, cand.recompute, cand.graphs)
        assert fast == cand and hash(fast) == hash(cand) and repr(fast) == repr(cand), cand
        assert fast.label() == cand.label() and replace(fast, ep=cand.ep) == cand
        assert search._with(fast, ep=cand.ep * 2) == replace(cand, ep=cand.ep * 2)


def test_the_lightest_fitting_rung_is_the_first_one_that_fits(dsv3):
    sc = search.Scorer(dsv3)
    for ov in (False, True):
        rungs = search.ladder(dsv3, ov)
        for cand in candidates(dsv3)[::7]:
            cand = replace(cand, overlap=ov)
            got = sc.lightest_fitting(cand, rungs)
            totals = [memory.estimate(dsv3.model, sc.config(replace(cand, recompute=r)))["total_gib"] for r in rungs]
            fits = [r for r, t in zip(rungs, totals, strict=False) if t <= sc.limit]
            want = rungs[-1] if totals[-1] > sc.limit or not fits else fits[0]
            assert got == replace(cand, recompute=want)
            assert sc.total_gib(got) == memory.estimate(dsv3.model, sc.config(got))["total_gib"]


@pytest.mark.parametrize("which", ["dsv3", "fp8"])
def test_a_layouts_floor_is_under_every_estimate_of_it(which, dsv3, tmp_path):
    """``floor_gib`` (weights, gradients, optimizer state and the NCCL workspace) is what lets the search skip a
    layout's knobs and rungs: it must not exceed the total of any candidate of that layout."""
    ctx = ctx_named(which, dsv3, tmp_path)
    sc = search.Scorer(ctx)
    cands = candidates(ctx)
    for cand in cands:
        floor = sc.estimator.floor_gib(cand.tp, cand.pp, cand.vpp, cand.ep, cand.etp, cand.cp)
        total = memory.estimate(ctx.model, sc.config(cand))["total_gib"]
        assert floor <= total + 0.005, cand  # the total is rounded to 0.01 GiB
    # and it is tight: the weights are most of a weight-bound layout's total
    assert any(sc.estimator.floor_gib(c.tp, c.pp, c.vpp, c.ep, c.etp, c.cp) > sc.limit for c in cands) or which != "dsv3"


@pytest.mark.parametrize("goal", ["throughput", "fit"])
def test_skipping_the_weight_bound_layouts_changes_no_search_result(goal, tmp_path, monkeypatch):
    """A 1024-GPU DeepSeek-V3 search has hundreds of layouts whose weights alone are over the limit; the search
    gives them no knobs and makes their stand-ins only when the unfit are ranked. With the floor forced to 0 (every
    layout searched the long way) the result is the same, plan for plan and score for score."""
    path = tmp_path / "big.yaml"
    path.write_text(f"schema: 1\nmodel: deepseek-v3\nhardware: {{gpu: h100, nodes: 128}}\ngoal: {goal}\n"
                    "training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 16384}\n")
    ctx = ctx_of(path)

    def digest(res):
        plans = [res.winner, *res.runners_up, *res.excluded]
        return [(s.cand, s.step, s.mem["total_gib"], s.fits, s.broken) for s in plans], res.scored

    fast = search._search_pinned(ctx)
    skipped = sum(search.Scorer(ctx).estimator.floor_gib(lay.tp, lay.pp, lay.vpp, lay.ep, lay.etp, lay.cp)
                  > search.Scorer(ctx).limit + 0.01 for lay in search.layouts_for(ctx, ctx["world_size"]))
    assert skipped > 100  # the case this is about
    monkeypatch.setattr(memory.Estimator, "floor_gib", lambda self, *lay: 0.0)
    assert digest(search._search_pinned(ctx)) == digest(fast)


class _NoMemo(dict):
    """A compile's search memo that never remembers: every search is made afresh, as before the memo."""

    def get(self, key, default=None):
        return default


def test_a_pinned_intent_without_a_recipe_makes_each_search_once(tmp_path, monkeypatch):
    """With pins and no shipped recipe the decision is also made on subsets of the pins (``decide._relaxed``), and the
    pinned decision is compared with them: each distinct search (the pins a view keeps, the micro-batch size, the
    levers) is made once per compile, not once per asker, and the plan is the one fresh searches give (TP 4 pinned:
    auto's plan has another TP, so the relaxation runs to the end)."""
    from mocompile.pipeline import analyse
    from mocompile.resolve.context import Context
    path = tmp_path / "glm.yaml"
    path.write_text("schema: 1\nmodel: glm-4.5-air\nhardware: {gpu: h100, nodes: 8}\ngoal: throughput\n"
                    "training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 1024}\n")
    monkeypatch.setenv("MOCOMPILE_NO_CACHE", "1")
    calls: list[str] = []
    real = search._search_pinned

    def counted(ctx):
        # what the memo keys on (its key holds the intent, whose micro-batch size a view hides where it relaxes it)
        calls.append(json.dumps([search._kept_pins(ctx), ctx.intent["training"].get("micro_batch_size"),
                                 ctx["micro_batch_size"], ctx["optimizer_state"],
                                 ctx["optimizer_offload_fraction"], ctx["use_megatron_fsdp"], ctx["offload_modules"]],
                                default=str))
        return real(ctx)

    monkeypatch.setattr(search, "_search_pinned", counted)
    auto = analyse(str(path)).plan
    assert auto["tensor_model_parallel_size"] != 4 and len(calls) == 1  # the case this is about
    calls.clear()
    pinned = analyse(str(path), ["parallelism.tp=4"]).plan
    assert len(calls) == len(set(calls)), calls  # no search made twice
    assert '[["parallelism.tp"], 1, 1' in "".join(calls) and '[[], "auto"' in "".join(calls)  # pinned one, free one
    made = len(calls)
    calls.clear()
    init = Context.__init__

    def forgetful(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.searches = _NoMemo()

    monkeypatch.setattr(Context, "__init__", forgetful)
    fresh = analyse(str(path), ["parallelism.tp=4"]).plan
    assert len(calls) > made  # without the memo some are made again
    assert pinned.planner["chosen"] == fresh.planner["chosen"] and pinned.values() == fresh.values()
    assert pinned["tensor_model_parallel_size"] == 4


def test_a_pinned_plan_that_does_not_fit_is_not_relaxed(tmp_path, monkeypatch):
    """A relaxed plan keeps every pin, so it lies in the space the pinned decision searched: where nothing there fits,
    the subsets are not tried (CI's fuzzer once charged a pinned 8-GPU recipe with top-k 2**31 with 3 CPU s of them).
    The same intent with a plan that fits is relaxed: the shortcut's own boundary."""
    from mocompile.pipeline import analyse
    from mocompile.resolve import decide
    relaxed: list[int] = []
    real = decide._relaxed

    def counted(ctx, units, own):
        relaxed.append(ctx.hw["nodes"])
        return real(ctx, units, own)

    monkeypatch.setattr(decide, "_relaxed", counted)
    monkeypatch.setenv("MOCOMPILE_NO_CACHE", "1")
    path = tmp_path / "glm.yaml"
    path.write_text("schema: 1\nmodel: glm-4.5-air\nhardware: {gpu: h100, nodes: 8}\ngoal: throughput\n"
                    "parallelism: {tp: 4}\ntraining: {seq_length: 4096, global_batch_size: 1024}\n")
    fits = analyse(str(path))
    assert relaxed == [8] and not fits.errors
    relaxed.clear()
    heavy = analyse(str(path), ["hardware.nodes=1"])  # 106 B parameters with Adam on 8 GPUs
    assert "MEM001" in {d.rule for d in heavy.errors} and relaxed == []


def test_the_rule_check_stops_once_the_verdict_is_settled(dsv3, monkeypatch):
    """Best first until four are legal and three excluded (or the anchor is checked): the excluded are the
    first broken candidates in rank order, the winner and runners-up the first legal ones."""
    checked = []
    real = search.Scorer.check

    def check(self, s):
        broken = real(self, s)
        checked.append((s.cand, bool(broken)))
        return broken

    monkeypatch.setattr(search.Scorer, "check", check)
    res = search._search(dsv3)
    in_loop = checked[:-1] if res.anchor is not None else checked  # the anchor is checked once more at the end
    assert [s.cand for s in res.excluded] == [c for c, b in in_loop if b][:3]
    legal = [c for c, b in in_loop if not b]
    if not res.winner.anchor:
        assert [s.cand for s in [res.winner, *res.runners_up]] == legal[:4]
    assert len(legal) >= 4 and (len(res.excluded) == 3 or res.anchor is None or res.anchor.broken is not None)
    assert len(in_loop) < 100  # it used to check down to the anchor's rank


@pytest.mark.parametrize("argv", [["lint", "a.yaml"], ["lint", "a.yaml", "b/c.yaml", "lint", ""], ["lint", "x y.yaml"]])
def test_a_plain_lint_command_line_is_parsed_as_argparse_parses_it(argv):
    fast = cli.plain_lint(argv)
    assert fast is not None and vars(fast) == vars(cli.build_parser().parse_args(argv))


@pytest.mark.parametrize("argv", [["lint"], ["lint", "--strict", "a.yaml"], ["lint", "a.yaml", "--set", "x=1"],
                                  ["lint", "-"], ["compile", "a.yaml"], ["lint", "--", "a.yaml"], []])
def test_any_other_command_line_goes_to_argparse(argv):
    assert cli.plain_lint(argv) is None


def test_the_cached_pyproject_parse_sees_an_edit_of_the_same_size_and_time(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "p"
    root.mkdir()
    py = root / "pyproject.toml"
    py.write_text('[tool.mocompile]\nrecipes = ["aa/*.yaml"]\nstrict = true\n')
    st = py.stat()
    first = project.load_settings(str(root))
    assert (first.recipes, first.strict) == (["aa/*.yaml"], True)
    assert project.load_settings(str(root)) == first  # from the cache
    py.write_text('[tool.mocompile]\nrecipes = ["bb/*.yaml"]\nstrict = true\n')
    os.utime(py, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert project.load_settings(str(root)).recipes == ["bb/*.yaml"]
    py.write_text('[tool.mocompile\n')
    with pytest.raises(Exception, match="pyproject.toml"):
        project.load_settings(str(root))


MODULES = ("import sys, json\nfrom mocompile.cli import main\ncode = main(sys.argv[1:])\n"
           "print(json.dumps(sorted(sys.modules)))\n")


def test_a_plain_lint_imports_no_argparse_and_no_toml_parser_once_the_settings_are_cached(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text((FIXTURES / "rule_base.yaml").read_text())
    env = dict(os.environ, PYTHONPATH=str(ROOT / "compiler"), XDG_CACHE_HOME=str(tmp_path / "cache"),
               MOCOMPILE_NO_CACHE="1")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", MODULES, "lint", str(path)], env=env, capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
    mods = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "mocompile.pipeline" in mods  # the whole analysis ran (no verdict cache)
    assert not mods & {"argparse", "tomllib", "shutil", "urllib.parse", "difflib"}, mods & {"argparse", "tomllib"}


def test_a_command_line_lint_ends_at_once_with_all_its_output_and_its_exit_code(tmp_path, capsys):
    """The real command line skips the interpreter's teardown (``cli._exit_now``): same output, same code."""
    from conftest import run_cli
    ok, bad = tmp_path / "ok.yaml", tmp_path / "bad.yaml"
    ok.write_text(DSV3)
    bad.write_text(DSV3.replace("nodes: 32", "nodes: 1").replace("4096}", "256}"))  # does not fit: MEM001
    env = {"MOCOMPILE_NO_CACHE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = run_cli("lint", str(ok), str(bad), env=env)
    assert proc.returncode == 1 and "MEM001" in proc.stdout
    assert cli.main(["lint", str(ok), str(bad)]) == 1  # in-process: returns
    assert capsys.readouterr().out == proc.stdout
    assert run_cli("lint", str(ok), env=env).returncode == 0
