#!/usr/bin/env bash
# Mutation testing of the modules users rely on (issue 25): the loader, input limits, schema, model
# catalogue, emission (render, header, python_recipe, writer, textsafe), the rules (checks, engine,
# layout) and the planner (steptime, search, decide, reference, memory); not part of CI.
#   benchmarks/mutation/run_modules.sh [SCRATCH]          # N mutants per module (default 25), one CPU
#   MODULES="load limits" N=0 benchmarks/mutation/run_modules.sh   # a subset, every mutant
# Each module's session works on a `git archive HEAD` copy WITHOUT generated/ (cosmic-ray edits files in
# place), so no kill can come from comparing with committed output: a test that reads generated/ fails
# on the unmutated copy, is listed in baseline_failures.txt and deselected for every mutant (a golden
# comparison never counts as a kill). Each module runs a fixed random sample (sample.py, seed 13).
# Templates are not Python: templates.py (beside this script) mutates them line by line instead.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv-stack/bin/python}"
N="${N:-25}"
SEED="${SEED:-13}"
SCRATCH="${1:-$(mktemp -d -t mocompile-mutation-modules-XXXXXX)}"
"$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/benchmarks/mutation/requirements.txt"
CR="$(dirname "$PY")/cosmic-ray"
FILTER="$(dirname "$PY")/cr-filter-operators"

INPUT_TESTS="tests/test_untrusted_input.py tests/test_load_positions.py tests/test_schema_details.py tests/test_inputs.py tests/test_limits.py tests/test_runaway_values.py tests/test_rules.py tests/test_training_io.py"
EMIT_TESTS="tests/test_launchers.py tests/test_untrusted_input.py tests/test_header.py tests/test_python_recipe.py tests/test_emit_requirements.py tests/test_output_dir.py tests/test_emit.py tests/test_kubernetes.py tests/test_training_io.py tests/test_cli.py tests/test_hostile_values.py tests/test_writes.py"
RULE_TESTS="tests/test_rule_boundaries.py tests/test_rules.py tests/test_memory_truth.py"
PLANNER_TESTS="tests/test_resolve.py tests/test_steptime.py tests/test_plancache.py tests/test_reference.py tests/test_memory_truth.py"
declare -A MODULE=(
  [load]=compiler/mocompile/load.py [limits]=compiler/mocompile/limits.py [schema]=compiler/mocompile/schema.py
  [catalogue]=compiler/mocompile/catalogue.py [render]=compiler/mocompile/emit/render.py
  [header]=compiler/mocompile/emit/header.py [python_recipe]=compiler/mocompile/emit/python_recipe.py
  [writer]=compiler/mocompile/emit/writer.py [textsafe]=compiler/mocompile/textsafe.py
  [checks]=compiler/mocompile/rules/checks.py [engine]=compiler/mocompile/rules/engine.py
  [layout]=compiler/mocompile/layout.py [steptime]=compiler/mocompile/steptime.py
  [search]=compiler/mocompile/resolve/search.py [decide]=compiler/mocompile/resolve/decide.py
  [reference]=compiler/mocompile/resolve/reference.py [memory]=compiler/mocompile/memory.py
  [mounts]=compiler/mocompile/resolve/mounts.py [stages]=compiler/mocompile/rules/stages.py
  [init]=compiler/mocompile/init.py [datafiles]=compiler/mocompile/datafiles.py
)
declare -A TESTS=(
  [load]="$INPUT_TESTS" [limits]="$INPUT_TESTS" [schema]="$INPUT_TESTS tests/test_editor_schema.py"
  [catalogue]="$INPUT_TESTS tests/test_resolve.py" [render]="$EMIT_TESTS" [header]="$EMIT_TESTS"
  [python_recipe]="$EMIT_TESTS" [writer]="$EMIT_TESTS" [textsafe]="$EMIT_TESTS"
  [checks]="$RULE_TESTS" [engine]="$RULE_TESTS" [layout]="$RULE_TESTS" [steptime]="$PLANNER_TESTS"
  [search]="$PLANNER_TESTS" [decide]="$PLANNER_TESTS" [reference]="$PLANNER_TESTS"
  [memory]="$PLANNER_TESTS tests/test_lint_fast_paths.py tests/test_memory_te.py"
  [mounts]="tests/test_container_mounts.py tests/test_trainjob_v2.py tests/test_kubernetes.py"
  [stages]="tests/test_explain_ids.py tests/test_cli.py" [init]="tests/test_init.py tests/test_memory_truth.py"
  [datafiles]="tests/test_cache_hygiene.py tests/test_datafiles.py tests/test_lintcache.py tests/test_plancache.py"
)
MODULES="${MODULES:-load limits schema catalogue render header python_recipe writer textsafe}"

session() {  # NAME
  local name="$1" dir="$SCRATCH/$1" tests="${TESTS[$1]}"
  mkdir -p "$dir"
  git -C "$ROOT" archive HEAD compiler tests recipes schemas pyproject.toml README.md docs benchmarks clusters \
    | tar -x -C "$dir"
  local base="$PY -m pytest -q -p no:cacheprovider -p no:randomly -m 'not stack' $tests"
  # the unmutated copy: whatever fails here reads generated/ (absent) or needs a tool: deselected
  (cd "$dir" && XDG_CACHE_HOME="$dir/.cache" bash -c "$base -rf" > baseline.log 2>&1) || true
  grep -oE '^FAILED [^ ]+' "$dir/baseline.log" | sed 's/^FAILED //' | sort -u > "$dir/baseline_failures.txt" || true
  local deselect=""
  while read -r t; do [[ -n "$t" ]] && deselect+=" --deselect '$t'"; done < "$dir/baseline_failures.txt"
  (cd "$dir" && XDG_CACHE_HOME="$dir/.cache" bash -c "$base -x $deselect" > baseline2.log 2>&1) \
    || { echo "$name: tests still fail on the unmutated copy after deselecting (see $dir/baseline2.log)" >&2; return 1; }
  cat > "$dir/cr.toml" <<EOF
[cosmic-ray]
module-path = ["${MODULE[$name]}"]
timeout = 300.0
excluded-modules = []
test-command = "$base -x $deselect"

[cosmic-ray.distributor]
name = "local"

[cosmic-ray.filters.operators-filter]
exclude-operators = ["core/ReplaceBinaryOperator_.*_(Pow|RShift|LShift|BitOr|BitAnd|BitXor)",
                     "core/ReplaceBinaryOperator_(Pow|RShift|LShift|BitOr|BitAnd|BitXor)_.*",
                     "core/ReplaceComparisonOperator_(Eq|NotEq|Lt|LtE|Gt|GtE)_(Is|IsNot|In|NotIn)",
                     "core/ReplaceComparisonOperator_(Is|IsNot)_(Eq|NotEq|Lt|LtE|Gt|GtE|In|NotIn)",
                     "core/ReplaceComparisonOperator_(In|NotIn)_(Eq|NotEq|Lt|LtE|Gt|GtE|Is|IsNot)",
                     "core/RemoveDecorator"]
EOF
  (cd "$dir" && "$CR" init cr.toml session.sqlite && "$FILTER" session.sqlite cr.toml \
    && { [[ "$N" == 0 ]] || "$PY" "$ROOT/benchmarks/mutation/sample.py" session.sqlite "$N" --seed "$SEED"; } \
    && XDG_CACHE_HOME="$dir/.cache" "$CR" exec cr.toml session.sqlite > exec.log 2>&1)
  echo "$name: done ($dir/session.sqlite)"
}

for m in $MODULES; do session "$m"; done
sessions=()
for m in $MODULES; do sessions+=("$SCRATCH/$m/session.sqlite"); done
"$PY" "$ROOT/benchmarks/mutation/report.py" --modules --commit "$(git -C "$ROOT" rev-parse --short HEAD)" \
  "${sessions[@]}" > "$SCRATCH/report_modules.md"
echo "wrote $SCRATCH/report_modules.md"
