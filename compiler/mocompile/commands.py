"""The CLI verbs. Each returns an exit code; none lets a traceback reach the user."""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mocompile import formats
from mocompile.cli import emit_diagnostics, json_dump
from mocompile.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INPUT, InputError, UsageError
from mocompile.ir import Diagnostic, Position
from mocompile.project import load_settings
from mocompile.textsafe import visible

if TYPE_CHECKING:
    import argparse

    from mocompile.pipeline import Result

# The pipeline (YAML loader, cerberus, planner) is imported only where a verb needs it: a `lint` whose
# files all hit the verdict cache (mocompile.lintcache) imports none of it.


def analyse(path: str, sets: list[str] | None = None, unsets: list[str] | None = None) -> Result:
    from mocompile.pipeline import analyse as run
    return run(path, sets, unsets)


def compile_recipe(path: str, sets: list[str] | None = None, unsets: list[str] | None = None,
                   out_dir: str = "generated") -> Result:
    from mocompile.pipeline import compile_recipe as run
    return run(path, sets, unsets, _out_rel(out_dir, path))


def _out_rel(out_dir: str, recipe: str) -> str:
    """The output folder as the launchers name it: relative to the recipe's project root (where jobs are
    submitted from), POSIX separators; an output folder outside the project is named by its absolute path."""
    from mocompile.project import find_root
    root = find_root(os.path.dirname(os.path.abspath(recipe))) or os.getcwd()
    out = os.path.abspath(out_dir)
    if os.path.commonpath([root, out]) != root:
        return out.replace(os.sep, "/")
    return os.path.relpath(out, root).replace(os.sep, "/")


def _run_all(paths: list[str], fn, args: argparse.Namespace) -> tuple[list[Result], list[Diagnostic], int]:
    results, diags, code = [], [], EXIT_CLEAN
    for path in paths:
        try:
            r = fn(path, getattr(args, "sets", []), getattr(args, "unsets", []))
        except InputError as exc:
            diags.extend(exc.diagnostics)
            code = max(code, EXIT_INPUT)
            continue
        results.append(r)
        diags.extend(r.diagnostics)
        if r.errors:
            code = max(code, EXIT_FINDINGS)
    return results, diags, code


class _Cached:
    """A verdict from the lint cache: only what ``_run_all`` reads of a ``Result``."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        self.errors = [d for d in diagnostics if d.severity == "error"]


def _lint_one(path: str, sets: list[str], unsets: list[str]) -> Result | _Cached:
    """``analyse`` through the whole-file verdict cache: a hit rebuilds the diagnostics it stored."""
    from mocompile import lintcache
    hit = lintcache.get(path, sets, unsets)
    if hit is not None:
        try:
            return _Cached([Diagnostic(d["rule"], d["severity"], d["message"],
                                       Position(d["file"], d["line"], d["column"]), d["hint"]) for d in hit])
        except (KeyError, TypeError):
            pass  # an unreadable entry: lint again
    k = lintcache.key(path, sets, unsets)
    r = analyse(path, sets, unsets)
    if k is not None and r.doc is not None:
        lintcache.put(path, sets, unsets, k[1], r.doc.text, r.doc.files, [d.as_dict() for d in r.diagnostics])
    return r


def cmd_lint(args: argparse.Namespace) -> int:
    settings = load_settings()
    _, diags, code = _run_all(args.recipes, _lint_one, args)
    emit_diagnostics(args, diags)
    if code == EXIT_CLEAN and (args.strict or settings.strict) and any(d.severity == "warning" for d in diags):
        code = EXIT_FINDINGS
    return code


def cmd_compile(args: argparse.Namespace) -> int:
    settings = load_settings()
    out_dir = args.output or settings.output
    results, diags, code = _run_all(args.recipes, lambda p, s, u: compile_recipe(p, s, u, out_dir), args)
    names: dict[str, str] = {}
    for r in results:
        if r.plan is None or r.errors:
            continue
        other = names.get(r.plan.name)
        if other:
            diags.append(Diagnostic("INPUT", "error", f"two recipes compile to the same name `{r.plan.name}` "
                                    f"({other} and {r.source})", Position(r.source), "give each recipe its own `name:`"))
            code = max(code, EXIT_INPUT)
        names[r.plan.name] = r.source
    written: list[str] = []
    if code < EXIT_INPUT:
        for r in results:
            if r.files and r.plan is not None:
                from mocompile.emit.writer import write_outputs
                problem = write_outputs(out_dir, r.plan.name, r.files, force=args.force)
                if problem and problem.startswith("refusing to overwrite hand-edited"):
                    diags.append(Diagnostic("EDITED", "error", problem, Position(r.source),
                                            "review the hand edit, then rerun with --force to overwrite"))
                    code = max(code, EXIT_FINDINGS)
                elif problem:  # the file system said no: nothing to do with hand edits
                    diags.append(Diagnostic("WRITE", "error", problem, Position(r.source),
                                            "check the output folder (-o / [tool.mocompile] output): it must be a real "
                                            "folder (not a symbolic link), writable, with free space"))
                    code = max(code, EXIT_INPUT)
                else:
                    written.append(os.path.join(out_dir, r.plan.name))
    emit_diagnostics(args, diags)
    if _fmtname(args) == "text":
        for w in written:
            print(f"wrote {w}/", file=sys.stderr)
    return code


def _fmtname(args: argparse.Namespace) -> str:
    return "text" if args.format == "auto" else args.format


def _listing(gen_dir: str) -> set[str]:
    """Relative paths under a generated folder: its files, and the files of its sub-folders (hf_config/)."""
    out = set()
    for name in os.listdir(gen_dir):
        path = os.path.join(gen_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            out |= {f"{name}/{sub}" for sub in os.listdir(path)} or {name}
        else:
            out.add(name)
    return out


def _vendored_record(gen_dir: str) -> dict[str, str]:
    """What the lock on disk says about the files copied verbatim into ``gen_dir`` (their sha256)."""
    from mocompile.emit.writer import vendored

    try:
        with open(os.path.join(gen_dir, "mocompile.lock.json"), encoding="utf-8", newline="") as fh:
            return vendored(fh.read())
    except OSError:
        return {}


def cmd_check(args: argparse.Namespace) -> int:
    from mocompile.emit import header

    settings = load_settings()
    out_dir = args.output or settings.output
    recipes = args.recipes or settings.recipe_files()
    if not recipes:
        raise UsageError("no recipes to check (give files or set [tool.mocompile] recipes)")
    report: list[dict[str, str]] = []
    expected_dirs: set[str] = set()
    for path in recipes:
        try:
            r = compile_recipe(path, out_dir=out_dir)
        except InputError as exc:
            report.append({"recipe": path, "file": "", "status": "invalid",
                           "detail": exc.diagnostics[0].message if exc.diagnostics else "invalid input"})
            continue
        if r.errors or r.plan is None:
            report.append({"recipe": path, "file": "", "status": "invalid", "detail": r.errors[0].message})
            continue
        expected_dirs.add(r.plan.name)
        gen_dir = os.path.join(out_dir, r.plan.name)
        recorded = _vendored_record(gen_dir)
        for rel, fresh in r.files.items():
            target = os.path.join(out_dir, r.plan.name, rel)
            status, detail = header.compare(target, fresh, recorded.get(rel))
            report.append({"recipe": path, "file": target, "status": status, "detail": detail,
                           "fresh": fresh if status == "stale" else ""})
        if os.path.isdir(gen_dir):
            for extra in sorted(_listing(gen_dir) - set(r.files)):
                report.append({"recipe": path, "file": os.path.join(gen_dir, extra), "status": "extra",
                               "detail": "not produced by the compiler any more"})
    if os.path.isdir(out_dir) and not args.recipes:
        for d in sorted(os.listdir(out_dir)):
            if os.path.isdir(os.path.join(out_dir, d)) and d not in expected_dirs and not d.startswith("."):
                report.append({"recipe": "", "file": os.path.join(out_dir, d), "status": "orphan",
                               "detail": "no recipe compiles to this folder"})
    bad = [r for r in report if r["status"] != "current"]
    if _fmtname(args) == "json":
        print(json_dump([{k: v for k, v in r.items() if k != "fresh"} for r in report]))
    else:
        for row in bad:
            print(f"{visible(row['file'] or row['recipe'])}: {row['status']}: {visible(row['detail'])}")
            if args.diff and row["status"] == "stale" and os.path.exists(row["file"]):
                import difflib
                with open(row["file"], encoding="utf-8", newline="") as fh:
                    current = fh.read().splitlines(keepends=True)
                sys.stdout.writelines(difflib.unified_diff(current, row["fresh"].splitlines(keepends=True),
                                                           f"current {row['file']}", f"changed {row['file']}"))
        if bad:
            stale = sorted({r["recipe"] for r in bad if r["recipe"] and r["status"] in ("stale", "missing", "extra")})
            edited = [r for r in bad if r["status"] == "edited"]
            if stale:
                print(f"generated files are out of date: run `mocompile compile {' '.join(map(visible, stale))}`")
            if edited:
                print("hand-edited generated files: edit the recipe instead, then `mocompile compile --force ...`")
        else:
            print(f"{len(report)} generated files are current")
    return EXIT_FINDINGS if bad else EXIT_CLEAN


def memory_line(m: dict[str, Any]) -> str:
    """The memory estimate as a sum a reader can check: the allocator's peak term by term, then what the GPU
    holds beside it (each term as the estimate rounds it, so the parts add up to within rounding)."""
    parts = [("weights+optimizer", "weights_and_optimizer_gib"), ("activations", "activations_gib"),
             ("logits", "logits_gib"), ("CUDA-graph buffers", "graph_buffers_gib"),
             ("unfused wgrad buffers", "unfused_wgrad_gib"),
             ("optimizer step (fp32 gradient copies, unscaled moments) beyond the freed activations", "optimizer_step_gib")]
    peak = " + ".join(f"{label} {m[key]}" for label, key in parts if m.get(key))
    return (f"memory estimate: {m.get('total_gib')} GiB of {m.get('gpu_memory_gib')} GiB per GPU = PyTorch peak "
            f"{m.get('estimate_gib')} ({peak}) + dispatcher buffers {m.get('dispatcher_buffers_gib')} + NCCL/context "
            f"{m.get('nccl_context_gib')}")


def cmd_explain(args: argparse.Namespace) -> int:
    from mocompile.rules.engine import by_id
    rules = by_id()
    target = args.target
    from mocompile.limits import ALL as LIMITS
    limit = next((lim for lim in LIMITS if lim.id == target.upper()), None)
    if limit is not None and not os.path.exists(target):
        if _fmtname(args) == "json":
            print(json_dump({"id": limit.id, "name": limit.name, "bound": limit.value, "hint": limit.hint}))
        else:
            bound = f"; bound {limit.value:,}" if limit.value else ""
            print(f"{limit.name} ({limit.id})\n\ninput limit, checked while the YAML is read (exit 2){bound}\n"
                  f"Fix: {limit.hint}")
        return EXIT_CLEAN
    from mocompile.rules.stages import checks
    check = checks().get(target.upper())
    if check is not None and not os.path.exists(target):
        if _fmtname(args) == "json":
            print(json_dump({"id": check.id, "name": check.name, "stage": check.stage, "what": check.what,
                             "fix": check.fix}))
        else:
            print(f"{check.name} ({check.id})\n\nchecked at: {check.stage}\n\nWhat it checks: {check.what}\n"
                  f"Fix: {check.fix}")
        return EXIT_CLEAN
    if target.upper() in rules and not os.path.exists(target):
        rule = rules[target.upper()]
        if _fmtname(args) == "json":
            print(json_dump({"id": rule.id, "name": rule.name, "severity": rule.severity, "message": rule.message,
                             "hint": rule.hint, "upstream": rule.upstream, "source": rule.source,
                             "fields": list(rule.fields)}))
        else:
            print(f"{rule.name} ({rule.id})\n\nseverity: {rule.severity}; enforced upstream by: {rule.upstream}\n"
                  f"source: {rule.source}\nreads: {', '.join(rule.fields)}\n\nWhat it checks: {rule.message}\n"
                  f"Fix: {rule.hint}")
        return EXIT_CLEAN
    try:
        r = analyse(target, args.sets, args.unsets)
    except InputError as exc:
        emit_diagnostics(types.SimpleNamespace(format="text" if args.format == "auto" else args.format,
                                               verb="lint", no_color=True), exc.diagnostics)
        return EXIT_INPUT
    plan = r.plan
    assert plan is not None
    if _fmtname(args) == "json":
        print(json_dump({
            "name": plan.name, "goal": plan.goal, "model": plan.model.get("id"), "gpu": plan.hardware["id"],
            "settings": {k: d.as_dict() for k, d in plan.settings.items()},
            "env": {k: d.as_dict() for k, d in plan.env.items()},
            "memory": plan.memory,
            "estimate": plan.planner,
            "diagnostics": [d.as_dict() for d in r.diagnostics],
        }))
    else:
        print(f"{plan.name}: {visible(plan.model.get('display'))} on {plan.hardware['world_size']}x "
              f"{plan.hardware['display']}, goal {plan.goal}")
        width = max(len(k) for k in plan.settings)
        for key, d in plan.settings.items():
            if d.source in ("model", "hardware") and key not in ("num_layers", "num_moe_experts"):
                continue
            line = f"  {key:<{width}}  {visible(repr(d.value)):<24} {d.source:<8} {visible(d.reason)}"
            print(line)
            for alt, why in d.rejected:
                print(f"  {'':<{width}}    rejected {visible(repr(alt))}: {visible(why)}")
        print("environment:")
        for key, d in plan.env.items():
            print(f"  {key}={visible(d.value)}  ({d.source}: {visible(d.reason)})")
        m = plan.memory
        print(memory_line(m))
        _print_planner(plan.planner)
        _print_cluster(plan.hardware.get("cluster"))
        if r.diagnostics:
            print(formats.text(r.diagnostics))
    return EXIT_FINDINGS if r.errors else EXIT_CLEAN


def _print_cluster(c: dict | None) -> None:
    """The cluster profile the prediction used, and what was measured there for this recipe (mocompile tune)."""
    if not c:
        return
    print(f"cluster profile {visible(c['path'])} ({visible(c.get('name'))}): host_factor {c['host_factor']}"
          + (f", overlap_host_factor {c['overlap_host_factor']} (measured there)"
             if c.get("overlap_host_factor") is not None else "")
          + (f"; missing there: {', '.join(visible(m) for m in c['missing'])}" if c.get("missing") else ""))
    for e in c.get("measured") or []:
        print(f"  measured  {visible(e.get('plan'))}: {visible(e.get('median_ms'))} ms over {visible(e.get('runs'))} "
              f"run(s), spread {visible(e.get('spread'))} (predicted then {visible(e.get('predicted_ms'))} ms)")


def _print_planner(p: dict) -> None:
    """The search's verdict: chosen plan, the shipped recipe it was compared with, the runners-up."""
    if not p:
        return
    def row(s: dict) -> str:
        return (f"{s['step_time_s']:.2f} s/step, {s['tflops_per_gpu']:.0f} TFLOPS/GPU, "
                f"{s['tokens_per_s_per_gpu']:.0f} tok/s/GPU, {s['memory_gib']:.1f} GiB")
    print(f"planner (goal {p['goal']}, {p['candidates_scored']} candidates scored):")
    c = p["chosen"]
    tags = {"shipped": "shipped recipe", "near": "nearest shipped recipe", "defaults": "documented defaults"}
    ref = p.get("reference") or {}
    tag = tags.get(ref.get("kind") or "shipped", "reference")
    print(f"  chosen    {c['plan']}\n            {row(c)}" + (f"  [{tag}: {c['anchor']}]" if c.get("anchor") else ""))
    a = p.get("anchor")
    if a and not (c.get("anchor") and ref.get("kind") == "shipped"):
        state = "breaks " + ", ".join(a["broken"]) if a["broken"] else "does not fit" if not a["fits"] else \
            "slower" if a["step_time_s"] >= c["step_time_s"] else f"faster; goal {p['goal']} does not order by speed"
        print(f"  shipped   {a['plan']}\n            {row(a)}  [{a['anchor']}: {state}]")
    if ref and ref.get("kind") != "shipped" and not c.get("anchor"):
        print(f"  reference {ref['plan']}\n            {row(ref)}  [{tag}: {ref['anchor']}]")
    if (p.get("decision") or {}).get("verdict"):
        print(f"  decision  {p['decision']['verdict']}")
    for s in p.get("runners_up", []) + p.get("excluded", []):
        print(f"  lost      {s['plan']}\n            {row(s)}: {s['why_lost']}")


def cmd_schema(args: argparse.Namespace) -> int:
    from mocompile.jsonschema import json_schema
    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return EXIT_CLEAN


def rules_markdown() -> str:
    """The rule reference (docs/rules.md), generated from the catalogue so it cannot drift."""
    from mocompile.rules.engine import rules
    lines = ["# mocompile rules", "", "Generated by `mocompile rules --format markdown`; do not edit.", "",
             "| ID | name | severity | enforced upstream by | what it checks | fix | source |",
             "|---|---|---|---|---|---|---|"]
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines += [row([r.id, r.name, r.severity, r.upstream, r.message, r.hint, r.source]) for r in rules()]
    from mocompile.limits import ALL as LIMITS
    from mocompile.rules.stages import checks
    lines += ["", "## Outside the catalogue", "",
              "Input limits (checked while the YAML is read), the reading and writing stages, `check`, and the "
              "generated preflight's run-time checks. `mocompile explain ID` prints any of them.", "",
              "| ID | name | checked at | what it checks | fix |", "|---|---|---|---|---|"]
    lines += [row([lim.id, lim.name, "reading (exit 2)", f"bound {lim.value:,}" if lim.value else "", lim.hint])
              for lim in LIMITS]
    lines += [row([c.id, c.name, c.stage, c.what, c.fix]) for c in checks().values()]
    return "\n".join(lines) + "\n"


def cmd_rules(args: argparse.Namespace) -> int:
    from mocompile.rules.engine import rules
    if args.format == "markdown":
        sys.stdout.write(rules_markdown())
        return EXIT_CLEAN
    if _fmtname(args) == "json":
        print(json_dump([{"id": r.id, "name": r.name, "severity": r.severity, "upstream": r.upstream,
                          "message": r.message, "hint": r.hint, "source": r.source} for r in rules()]))
    else:
        for r in rules():
            print(f"{r.id:<8} {r.severity:<8} {r.upstream:<9} {r.name}")
    return EXIT_CLEAN


def cmd_init(args: argparse.Namespace) -> int:
    """Write an intent pinned to a shipped perf recipe; refuse to overwrite an existing file."""
    from mocompile import init
    if args.list:
        for a in init.anchors():
            n = init.smallest_size(a)
            runs_at = f"  (its layout needs {n})" if n != a["gpus"] else ""
            print(f"{a['recipe']:<64} {a['gpus']:>5}x {a['gpu']:<6} {a['precision']}{runs_at}")
        return EXIT_CLEAN
    if not args.recipe:
        raise UsageError("init needs --from <Bridge perf recipe> (or --list)")
    if args.gpus is not None and args.gpus < 1:
        raise UsageError("--gpus must be a positive number of GPUs")
    anchor = init.find(args.recipe)
    text = init.intent_text(anchor, args.gpus, benchmark=args.benchmark)
    needs = init.smallest_size(anchor)
    if args.gpus is None and needs != anchor["gpus"]:
        print(f"note: {anchor['recipe']}'s layout needs {needs} GPUs, not {anchor['gpus']}: "
              "written at that size (weak-scaled by data parallelism)", file=sys.stderr)
    if not args.output:
        sys.stdout.write(text)
        return EXIT_CLEAN
    try:
        with open(args.output, "x", encoding="utf-8") as fh:  # "x": an existing file is never touched
            fh.write(text)
    except FileExistsError:
        raise UsageError(f"{args.output} exists; mocompile init never overwrites a file") from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror}") from None
    print(f"wrote {args.output}: `mocompile {args.output}` compiles it", file=sys.stderr)
    return EXIT_CLEAN


def cmd_models(args: argparse.Namespace) -> int:
    from mocompile.catalogue import gpus, models
    for mid, m in sorted(models().items()):
        print(f"{mid:<22} {m.get('display', ''):<24} {m['num_layers']:>3} layers  {m['num_moe_experts']:>4} experts "
              f"top-{m['moe_router_topk']}")
    print()
    for gid, g in sorted(gpus().items()):
        print(f"{gid:<8} {g['display']:<28} {g['memory_gib']:>4} GiB  NVLink domain {g['nvlink_domain']}")
    return EXIT_CLEAN


def _measured_report(args: argparse.Namespace, build: Callable[[], dict], text: Callable[[dict], str]) -> int:
    """Run one of the measuring commands (diagnose, probe, tune): a positioned input problem exits 2 with its
    diagnostics, else the report prints as text or JSON."""
    try:
        report = build()
    except InputError as exc:
        emit_diagnostics(types.SimpleNamespace(format="text" if args.format == "auto" else args.format,
                                               verb="lint", no_color=True), exc.diagnostics)
        return EXIT_INPUT
    print(json_dump(report) if _fmtname(args) == "json" else text(report))
    return EXIT_CLEAN


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Read a run, name its dominant wall, rank the guidance's changes by predicted gain (mocompile.diagnose)."""
    from mocompile import diagnose
    return _measured_report(args, lambda: diagnose.diagnose(args.runs, args.lock, args.recipe, args.sets),
                            diagnose.text)


def cmd_probe(args: argparse.Namespace) -> int:
    """Measure this node through a generated launcher and write a cluster profile (mocompile.probe)."""
    from mocompile import probe
    if args.gpus_per_node < 1:
        raise UsageError("--gpus-per-node must be at least 1")
    launcher, targets = _launcher(args)
    return _measured_report(args, lambda: probe.probe(
        args.output, args.gpu, args.gpus_per_node, args.name, args.repeats, args.iterations, args.python, args.work,
        args.from_runs, launcher=launcher, quiet=_fmtname(args) == "json", kernel_probe=not args.no_kernels,
        targets=targets, overlap=args.overlap), probe.text)


def _launcher(args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    """The measuring launcher ``--launcher`` names (torchrun on this node, or the plan's Slurm batch script
    submitted with ``--sbatch-args``) and the launch targets the measured plans need for it."""
    import shlex

    from mocompile import measure
    if args.launcher == "slurm":
        try:
            extra = shlex.split(args.sbatch_args or "")
        except ValueError as exc:
            raise UsageError(f"--sbatch-args: {exc}") from None
        return measure.slurm_launcher(extra), ("torchrun", "slurm")
    if args.sbatch_args:
        raise UsageError("--sbatch-args goes with --launcher slurm")
    return measure.run_launcher, ("torchrun",)


def cmd_tune(args: argparse.Namespace) -> int:
    """Measure the plans inside the model's error band, keep the fastest (mocompile.tune)."""
    from mocompile import tune
    if args.band is not None and not 0 <= args.band <= 1:
        raise UsageError("--band is a share of the fastest predicted step, from 0 to 1 (e.g. 0.15)")
    if args.overlap and args.band is not None:
        raise UsageError("--overlap races the model's plan against its EP-overlap twin: --band does not apply")
    launcher, targets = _launcher(args)

    def build() -> dict:
        rep = tune.tune(args.recipe, args.sets, args.band, args.max_plans, args.iterations, args.repeats, args.work,
                        launcher=launcher, quiet=_fmtname(args) == "json", timeout=args.timeout,
                        needs_target=targets[-1], overlap_ab=args.overlap)
        tune.finish(rep, args.recipe, args.sets, args.write)
        return rep

    return _measured_report(args, build, tune.text)


def cmd_rankprobe(args: argparse.Namespace) -> int:
    """One rank of the plan at full size on this machine's GPU under a fake process group (mocompile.rankprobe):
    exit 0 when it ran and the estimate is within the tolerance, 1 when it failed or the estimate is outside."""
    from mocompile import rankprobe
    if (args.recipe is None) == (args.from_result is None):
        raise UsageError("rankprobe takes a recipe to run, or --from-result FILE to report (one of them)")
    if args.from_result is not None:
        result = rankprobe.read_result(args.from_result)
        rep = rankprobe.report(result["spec"], result)
    else:
        if args.timeout <= 0:
            raise UsageError("--timeout must be positive")
        try:
            rep = rankprobe.run(args.recipe, args.sets, args.unsets, args.rank, args.iterations, args.python, args.work,
                                args.timeout)
        except InputError as exc:
            emit_diagnostics(types.SimpleNamespace(format="text" if args.format == "auto" else args.format,
                                                   verb="lint", no_color=True), exc.diagnostics)
            return EXIT_INPUT if any(d.rule in ("INPUT", "SCHEMA") or d.rule.startswith("LIM")
                                     for d in exc.diagnostics) else EXIT_FINDINGS
    print(json_dump(rep) if _fmtname(args) == "json" else rankprobe.text(rep))
    s = rep["summary"]
    return EXIT_CLEAN if s and not rep["error"] and s["within_tolerance"] else EXIT_FINDINGS
