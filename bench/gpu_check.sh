#!/usr/bin/env bash
# A short (< 8 minutes) check for a machine with a CUDA GPU, run from the project root without edits:
# installs the project, runs the smoke experiment and the pretraining and training benchmarks on CUDA
# (Cardio's width and a 128-column census-like table),
# and prints their figures. Usage: bash bench/gpu_check.sh
#
# Install. With a project .venv already there it is used as is. Otherwise a fresh .venv-gpu is made
# that sees python3's own packages, so a GPU image's CUDA build of torch (and numpy, pandas, ...) is
# reused, and the project goes in without its torch pin taking over:
#   * online:  pip install -e . (missing dependencies come from the package index);
#   * offline (GPU images often reach no index): set DPSYNTH_WHEELHOUSE to a folder of wheels made
#     by bench/make_wheelhouse.sh for that machine's Python; everything installs from there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export GX_ANALYTICS_ENABLED=false PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 MLFLOW_ENABLE_TELEMETRY=false
if [ -x .venv/bin/python ]; then
    . .venv/bin/activate
else
    # The image's python3 may itself live in a venv (--system-site-packages would not reach it): a
    # .pth file puts its site-packages, with its CUDA torch, behind the new venv's own.
    image_site=$(python3 -c 'import site, torch; print(site.getsitepackages()[0])' 2>/dev/null || true)
    python3 -m venv .venv-gpu
    . .venv-gpu/bin/activate
    if [ -n "$image_site" ]; then
        echo "$image_site" > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_gpu_image.pth"
    fi
    if [ -n "${DPSYNTH_WHEELHOUSE:-}" ]; then
        pip install -q --no-index --no-deps "$DPSYNTH_WHEELHOUSE"/*.whl
        # The image's Python may be newer than the one the project is pinned to and tested on (3.11).
        pip install -q --no-index --no-deps --no-build-isolation --ignore-requires-python -e . >/dev/null
    else
        pip install -q -e . "torch==$(python -c 'import torch; print(torch.__version__.split("+")[0])')" >/dev/null
    fi
fi
python - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PY
timeout 150 python -m bench.pretrain --json --device cuda | tail -n 1 | sed 's/^/pretrain: /'
# Per-row critics on CUDA run the tensor code's per-critic refresh (about 80 ms an iteration on an H200):
# a few hundred iterations keep the whole check within its time.
timeout 200 python -m bench.train --json --device cuda --iterations 300 --naive-iterations 20 | tail -n 1 \
    | sed 's/^/train: /'
# The census-like table 128 encoded columns wide (bench/_layout.py), K = 1000 like the default release.
timeout 150 python -m bench.pretrain --json --device cuda -k 1000 --width 128 | tail -n 1 | sed 's/^/pretrain, 128 columns: /'
timeout 150 python -m bench.train --json --device cuda -k 1000 --width 128 --iterations 200 --naive-iterations 10 \
    | tail -n 1 | sed 's/^/train, 128 columns: /'
work=$(mktemp -d)
dpsynth demo-data --rows 3000 --out "$work/demo.csv"
start=$(date +%s)
( cd "$work" && DPSYNTH_HOME="$work" MLFLOW_TRACKING_URI="sqlite:///$work/mlflow.db" timeout 240 \
    dpsynth experiment --config "$root/configs/cardio.yaml" --data "$work/demo.csv" --profile smoke --json \
    > "$work/experiment.log" 2>&1 ) || { tail -n 30 "$work/experiment.log"; exit 1; }
echo "smoke experiment ($(( $(date +%s) - start )) s): $(tail -n 1 "$work/experiment.log")"
