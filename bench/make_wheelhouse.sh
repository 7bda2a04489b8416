#!/usr/bin/env bash
# Wheels of the project's dependencies for an offline GPU machine (see bench/gpu_check.sh):
#   bash bench/make_wheelhouse.sh PYTHON_VERSION OUT_DIR [PRESENT_FILE]
# e.g. `bash bench/make_wheelhouse.sh 3.12 .wheels`. Run from the project's .venv (it lists what to
# fetch: every installed distribution). Left out: torch and the CUDA libraries (the GPU image brings its
# own build), the packages named in PRESENT_FILE (one per line: what the image already holds), opacus
# (only the tests use it), and the full `mlflow` wheel (mlflow-skinny holds all the code the project
# runs; the full wheel adds the UI's JavaScript). autodp ships no wheel: one is built here.
set -euo pipefail
pyver=${1:?python version of the GPU machine, e.g. 3.12}
out=${2:?output folder}
present=${3:-}
mkdir -p "$out"
list=$(mktemp)
frozen=$(mktemp)
pip freeze --exclude-editable > "$frozen"
python - "$frozen" "$present" > "$list" <<'PY'
import sys
norm = lambda n: n.lower().replace("_", "-").replace(".", "-")
present = set()
if sys.argv[2]:
    present = {norm(line.strip()) for line in open(sys.argv[2]) if line.strip() and not line.startswith("#")}
skip = {"torch", "triton", "opacus", "mlflow", "ruff", "pytest", "autodp"}
for line in open(sys.argv[1]):
    name = line.split("==")[0].strip()
    if not name or line.startswith("#") or norm(name) in present or norm(name) in skip or norm(name).startswith("nvidia-"):
        continue
    print(line.strip())
PY
pip download -q -d "$out" --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -r "$list"
pip wheel -q --no-deps -w "$out" "autodp==$(pip show autodp | sed -n 's/^Version: //p')"
echo "$(ls "$out" | wc -l) wheels, $(du -sh "$out" | cut -f1), in $out"
