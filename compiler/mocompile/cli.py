"""Command line: compile, lint, check, explain, schema, rules, models."""

from __future__ import annotations

import gc
import json
import os
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from mocompile import __version__, formats
from mocompile.errors import EXIT_CLEAN, EXIT_INPUT, EXIT_INTERNAL, InputError, UsageError
from mocompile.ir import Diagnostic
from mocompile.textsafe import terminal

if TYPE_CHECKING:
    import argparse

VERBS = ("compile", "lint", "check", "explain", "schema", "rules", "models", "init", "diagnose", "probe", "tune",
         "rankprobe")
# verbs that finish in a second or two: the cyclic garbage collector stays off for them (see __main__.py)
SHORT_VERBS = frozenset({"compile", "lint", "check", "explain", "schema", "rules", "models", "init"})


def _parser(**kwargs: Any) -> argparse.ArgumentParser:
    """An ArgumentParser that reports errors as ``UsageError`` (exit 2 with our own wording); argparse is
    imported only when a command line needs the parser (``plain_lint``)."""
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"{self.prog}: {message}")

    return _Parser(**kwargs)


def plain_lint(argv: Sequence[str]) -> types.SimpleNamespace | None:
    """``lint FILE...`` with no option, what pre-commit runs, parsed as ``build_parser`` parses it; None for
    any other command line. Building the parser (eight verbs; argparse's help formatter imports shutil and
    asks for the terminal size on every argument, gettext imports locale) costs a cold ``lint`` about 8 ms."""
    if len(argv) < 2 or argv[0] != "lint" or any(a.startswith("-") for a in argv[1:]):
        return None
    return types.SimpleNamespace(verb="lint", recipes=list(argv[1:]), strict=False, sets=[], unsets=[],
                                 format="auto", no_color=False)


def _common(p: argparse.ArgumentParser, fmt: Sequence[str] = ("auto", "text", "json", "github", "sarif")) -> None:
    p.add_argument("--format", choices=fmt, default="auto", help="output format (auto: text, github on GitHub Actions)")
    p.add_argument("--no-color", action="store_true", help="never colour text output")


def _overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe value, e.g. --set parallelism.ep=16 (applied last, in order)")
    p.add_argument("--unset", dest="unsets", action="append", default=[], metavar="KEY",
                   help="remove a recipe value, e.g. --unset moe.overlap (applied before --set)")


def build_parser() -> argparse.ArgumentParser:
    parser = _parser(prog="mocompile", description="Compile MoE training intents into checked Megatron-Bridge recipes.")
    parser.add_argument("--version", action="version", version=f"mocompile {__version__}")
    sub = parser.add_subparsers(dest="verb", parser_class=type(parser))
    p = sub.add_parser("compile", help="compile recipes into generated/<name>/")
    p.add_argument("recipes", nargs="+")
    p.add_argument("-o", "--output", default=None, help="output folder (default: [tool.mocompile] output or generated/)")
    p.add_argument("--force", action="store_true", help="overwrite generated files that were edited by hand")
    _overrides(p)
    _common(p)
    p = sub.add_parser("lint", help="validate and check recipes; write nothing")
    p.add_argument("recipes", nargs="+")
    p.add_argument("--strict", action="store_true", help="warnings fail too")
    _overrides(p)
    _common(p)
    p = sub.add_parser("check", help="fail when generated/ is stale or edited by hand")
    p.add_argument("recipes", nargs="*", help="default: [tool.mocompile] recipes")
    p.add_argument("-o", "--output", default=None)
    p.add_argument("--diff", action="store_true", help="show a diff for stale files")
    _common(p, ("auto", "text", "json"))
    p = sub.add_parser("explain", help="show every resolved setting with its reason, or a rule's page")
    p.add_argument("target", help="a recipe file or a rule ID")
    _overrides(p)
    _common(p, ("auto", "text", "json"))
    p = sub.add_parser("schema", help="print the intent JSON Schema (for editors)")
    p.add_argument("-o", "--output", default=None, help="write to this file instead of stdout")
    p = sub.add_parser("rules", help="list the rule catalogue")
    _common(p, ("auto", "text", "json", "markdown"))
    sub.add_parser("models", help="list the model and GPU catalogues")
    p = sub.add_parser("init", help="write an intent pinned to one of Bridge's tuned perf recipes")
    p.add_argument("--from", dest="recipe", help="the Bridge perf recipe, e.g. qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")
    p.add_argument("--gpus", type=int, default=None, help="weak-scale to this many GPUs (DP and global batch grow)")
    p.add_argument("-o", "--output", default=None, help="write the intent here (default: stdout); never overwrites")
    p.add_argument("--list", action="store_true", help="list the recipes mocompile knows")
    p.add_argument("--benchmark", action="store_true",
                   help="pin force-balanced routing as NVIDIA measures the recipe (the model does not learn routing)")
    p = sub.add_parser("diagnose", help="a run's step breakdown, its dominant wall, and the changes the model ranks")
    p.add_argument("runs", nargs="+", help="the run's output folder(s) or files: metrics *.jsonl, profiler traces, "
                                           "mocompile.lock.json")
    p.add_argument("--lock", default=None, help="the run's mocompile.lock.json (default: found in RUN)")
    p.add_argument("--recipe", default=None, help="the intent to re-plan with each change (default: the lock's source)")
    _overrides(p)
    _common(p, ("auto", "text", "json"))
    p = sub.add_parser("probe", help="measure this node's GPUs through a generated launcher; write a cluster profile")
    p.add_argument("-o", "--output", required=True, help="the profile to write, e.g. clusters/my-cluster.yaml")
    p.add_argument("--gpu", required=True, help="the GPU type, as an intent's hardware.gpu names it (e.g. h100)")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs on this node the probe runs on")
    p.add_argument("--name", default=None, help="the cluster's name in the profile (default: the file's)")
    p.add_argument("--repeats", type=int, default=3, help="probe runs (the median is fitted; default 3)")
    p.add_argument("--iterations", type=int, default=25, help="iterations per run (default 25; 5 warm-up)")
    p.add_argument("--python", default="python3", help="the Python the launcher runs (default python3)")
    p.add_argument("--work", default=None, help="where the probe compiles and logs (default .mocompile/probe)")
    p.add_argument("--from-runs", default=None, help="fit from a probe's recorded metrics in this folder; run nothing")
    p.add_argument("--overlap", action="store_true", help="run the probe plan again with EP overlap on (needs 2+ "
                                                          "GPUs): a pair measured apart sets overlap_host_factor")
    p.add_argument("--launcher", choices=("torchrun", "slurm"), default="torchrun",
                   help="run the plans with the generated torchrun.sh on this node (default), or submit their "
                        "slurm.sbatch and wait (from a login node, in a folder the compute nodes see)")
    p.add_argument("--sbatch-args", default=None, help="more sbatch options with --launcher slurm, e.g. "
                                                         "\"--partition gpu --account me\"")
    p.add_argument("--no-kernels", action="store_true", help="skip the kernel probe (GEMMs, launch time, "
                                                             "all-to-all): the model's reference kernels stay")
    _common(p, ("auto", "text", "json"))
    p = sub.add_parser("tune", help="run the plans the model cannot tell apart; keep the measured fastest")
    p.add_argument("recipe")
    p.add_argument("--band", type=float, default=None, help="plans predicted within this share of the fastest "
                                                             "(default: the model's trust margin)")
    p.add_argument("--max-plans", type=int, default=4, help="at most this many plans (default 4)")
    p.add_argument("--iterations", type=int, default=20, help="iterations per run (default 20; 5 warm-up)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each of the last two plans (default 3)")
    p.add_argument("--work", default=None, help="state, generated plans and logs (default .mocompile/tune/<recipe>)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take (default 900)")
    p.add_argument("--launcher", choices=("torchrun", "slurm"), default="torchrun",
                   help="run the plans with the generated torchrun.sh on this node (default), or submit their "
                        "slurm.sbatch and wait (from a login node, in a folder the compute nodes see)")
    p.add_argument("--sbatch-args", default=None, help="more sbatch options with --launcher slurm, e.g. "
                                                         "\"--partition gpu --account me\"")
    p.add_argument("--write", action="store_true", help="pin the measured fastest plan's knobs in the recipe")
    p.add_argument("--overlap", action="store_true",
                   help="race only the model's plan and the same plan with EP overlap flipped, --repeats runs each: "
                        "a pair measured apart sets the cluster profile's overlap_host_factor")
    _overrides(p)
    _common(p, ("auto", "text", "json"))
    p = sub.add_parser("rankprobe", help="run one rank of the plan at full size on this machine's GPU (fake process "
                                         "group); measured peak memory beside the estimate")
    p.add_argument("recipe", nargs="?", default=None, help="the intent (its plan's most-loaded rank runs)")
    p.add_argument("--rank", type=int, default=None, help="the rank to impersonate (default: the one the memory "
                                                          "estimate calls most loaded)")
    p.add_argument("--iterations", type=int, default=None, help="iterations to run (default 6)")
    p.add_argument("--python", default="python3", help="the Python the launcher runs (default python3)")
    p.add_argument("--work", default=None, help="where it compiles and logs (default .mocompile/rankprobe)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds the probe may take (default 1800)")
    p.add_argument("--from-result", default=None, help="report a result rankprobe.sh wrote; run nothing")
    _overrides(p)
    _common(p, ("auto", "text", "json"))
    return parser


def _fmt(args: argparse.Namespace | types.SimpleNamespace) -> str:
    if args.format != "auto":
        return args.format
    return "github" if os.environ.get("GITHUB_ACTIONS") == "true" and args.verb in ("lint", "compile") else "text"


def _colour(args: argparse.Namespace | types.SimpleNamespace) -> bool:
    return not getattr(args, "no_color", False) and sys.stdout.isatty() and "NO_COLOR" not in os.environ


def emit_diagnostics(args: argparse.Namespace | types.SimpleNamespace, diags: list[Diagnostic]) -> None:
    fmt = _fmt(args)
    if fmt == "json":
        print(formats.as_json(diags))
    elif fmt == "github":
        if diags:
            print(formats.github(diags))
    elif fmt == "sarif":
        from mocompile.rules.engine import rules  # the catalogue only where SARIF describes rules
        print(formats.sarif(diags, list(rules())))
    elif diags:
        print(formats.text(diags, _colour(args)))


def _exit_now(code: int) -> None:
    """End the process of a command-line ``lint`` here, with everything written and flushed: tearing the
    interpreter down (every module and object freed one by one) costs a cold 1024-GPU ``lint`` about 12 ms.
    Returns, for the usual exit, when a flush fails or something still waits for the exit (an atexit
    handler such as coverage's, another thread)."""
    import atexit

    pending = getattr(atexit, "_ncallbacks", lambda: 1)()
    threading = sys.modules.get("threading")
    if pending or (threading is not None and threading.active_count() > 1):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


class _TerminalSafe:
    """A text stream that escapes control and bidi characters on their way out
    (:func:`mocompile.textsafe.terminal`): whatever a message builder forgot to escape,
    no recipe value drives the user's terminal or forges lines in a CI log."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(terminal(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _TerminalSafe(sys.stdout), _TerminalSafe(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _main(argv: Sequence[str] | None = None) -> int:
    program = argv is None  # the real command line (an in-process caller passes argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in VERBS and not argv[0].startswith("-"):
        argv.insert(0, "compile")
    try:
        args = plain_lint(argv) or build_parser().parse_args(argv)
        if args.verb is None:
            build_parser().print_help()
            return EXIT_INPUT
        if program and args.verb in SHORT_VERBS:
            gc.disable()  # one short run whose garbage reference counting frees (see __main__.py)
        elif program:
            gc.enable()  # probe, measure, tune, ... run for minutes: collect as usual
        from mocompile import commands, lintcache, plancache
        # re-plan and re-lint only what changed (pre-commit runs lint on every commit)
        plancache.ENABLED = lintcache.ENABLED = True
        try:
            code = getattr(commands, "cmd_" + args.verb)(args)
        finally:
            plancache.ENABLED = lintcache.ENABLED = False  # an in-process caller (tests, tools) always searches
        if program and args.verb == "lint":
            _exit_now(code)
        return code
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except InputError as exc:  # pragma: no cover - commands handle per-file input errors
        print(formats.text(exc.diagnostics), file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_CLEAN
    except Exception as exc:  # noqa: BLE001 - last line of defence: no traceback for users
        if os.environ.get("MOCOMPILE_DEBUG"):
            raise
        print(f"mocompile: internal error: {exc.__class__.__name__}: {exc}\n"
              "This is a bug in mocompile; rerun with MOCOMPILE_DEBUG=1 for the traceback.", file=sys.stderr)
        return EXIT_INTERNAL


def json_dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str)
