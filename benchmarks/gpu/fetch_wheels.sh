#!/usr/bin/env bash
# Download the pinned wheel set (benchmarks/gpu/wheels.txt) for the GPU test hosts
# (CPython 3.12, x86_64, glibc 2.39). Run on a machine WITH internet; the GPU hosts have none.
# Usage: benchmarks/gpu/fetch_wheels.sh [DEST]   (default DEST: <repo>/.whl, git-ignored)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
dest="${1:-${repo}/.whl}"
py="${PYTHON:-python3}"
list="${here}/wheels.txt"

mkdir -p "${dest}"

plat=()
for n in 17 24 27 28 31 34 35 36 38 39; do
  plat+=(--platform "manylinux_2_${n}_x86_64")
done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

binary=()
sdist_only=()
while IFS= read -r line; do
  line="${line%%#*}"
  line="${line//[[:space:]]/}"
  [[ -z "${line}" ]] && continue
  if [[ "${line}" == antlr4-python3-runtime==* ]]; then
    sdist_only+=("${line}")
  else
    binary+=("${line}")
  fi
done < "${list}"

"${py}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "${dest}" "${binary[@]}"

if ((${#sdist_only[@]})); then
  "${py}" -m pip wheel --no-deps -w "${dest}" "${sdist_only[@]}"
fi

# pulp ships CBC solver binaries for every platform (16 MB); modelopt only imports pulp, so drop them to keep
# one device call's carried files (repo + .whl + .te + .deepep) under 64 MiB. pip does not check RECORD hashes.
for w in "${dest}"/pulp-*.whl; do
  [[ -e "${w}" ]] || continue
  "${py}" - "${w}" <<'SLIM'
import os, sys, zipfile
src = sys.argv[1]
tmp = src + ".tmp"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        base = item.filename.rsplit("/", 1)[-1]
        if "/solverdir/" in item.filename and (base.startswith("cbc") or base.endswith(".exe")):
            continue
        zout.writestr(item, zin.read(item.filename))
os.replace(tmp, src)
print(f"fetch_wheels: {os.path.basename(src)} without solver binaries: {os.path.getsize(src) // 1024} KiB")
SLIM
done

count="$(find "${dest}" -maxdepth 1 -type f -name '*.whl' | wc -l)"
echo "fetch_wheels: ${count} wheels in ${dest} ($(du -sh "${dest}" | cut -f1))"
if [[ "${count}" -ne "$((${#binary[@]} + ${#sdist_only[@]}))" ]]; then
  echo "fetch_wheels: expected $((${#binary[@]} + ${#sdist_only[@]})) wheels; check for stale or duplicate versions in ${dest}" >&2
  exit 1
fi
