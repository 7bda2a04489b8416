#!/usr/bin/env bash
# A short (< 5 minutes) check for a machine with a CUDA GPU, run from the project root without edits:
# installs the project, runs the smoke experiment and the pretraining and training benchmarks on CUDA,
# and prints their figures. Usage: bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export GX_ANALYTICS_ENABLED=false PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
. .venv/bin/activate
pip install -q -e . >/dev/null
python - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("device:", torch.cuda.get_device_name(0))
PY
work=$(mktemp -d)
dpsynth demo-data --rows 3000 --out "$work/demo.csv"
( cd "$work" && MLFLOW_TRACKING_URI="sqlite:///$work/mlflow.db" timeout 180 \
    dpsynth experiment --config "$OLDPWD/configs/cardio.yaml" --data "$work/demo.csv" --profile smoke --json \
    | tail -n 1 | sed 's/^/smoke experiment: /' )
timeout 120 python bench/pretrain.py --json --device cuda | tail -n 1 | sed 's/^/pretrain: /'
timeout 60 python bench/train.py --json --device cuda | tail -n 1 | sed 's/^/train: /'
