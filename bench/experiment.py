"""Projection of the whole thesis profile (287 selection runs) on this machine: fast path vs naive.

What is measured, in this process: the per-unit cost of each part of the experiment, by the component
benchmarks (each times its naive baseline and its fast path on the same work):
- pretraining, per critic-iteration (bench/pretrain.py: batched ensemble vs a per-critic Python loop);
- generator training, per iteration (bench/train.py: the trainer vs a plain nn.Module implementation);
- model selection, per run (bench/model_selection.py: the fast solver vs the per-candidate liblinear loop);
- sampling and decoding 63,000 rows of one checkpoint (the same code on both sides).
The projection multiplies these by the thesis grid: 4,001 critics x 2,000 pretraining iterations
(K = 250 + 500 + 750 + 1,000 + 1,500, and the baseline's one), 6 settings x 40,000 generator
iterations, 246 sampled checkpoints, and 287 selection runs. Parts measured on one thread (generator
training, both selection paths, the naive per-critic pretraining loop) run `--workers` at a time in the
flow's process pool, so their totals are divided by it; the batched pretraining already uses every core
and sampling is counted whole.

Usage: python -m bench.experiment [--json] [--device auto|cpu|cuda]
The last line printed is JSON: {"naive_projected_min", "projected_full_min", "ratio", ...}.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CRITICS = 1 + 250 + 500 + 750 + 1000 + 1500
PRETRAIN_ITERATIONS = 2000
SETTINGS = 6
TRAIN_ITERATIONS = 40000
CHECKPOINTS = SETTINGS * 41
SELECTION_RUNS = 7 * 41
SAMPLE_ROWS = 63000


def _quiet(fn, argv):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(argv)


def sampling_seconds(device: str, profile: str) -> float:
    """Sample, decode and write one checkpoint's 63,000 rows (identical for both paths)."""
    import tempfile

    import torch

    from dpsynth.models.config import load_profile
    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.models.generators.gswgan.generator_files import (
        generator_spec,
        sample_encoded,
        target_condition,
    )

    schema = DatasetSchema.from_yaml(ROOT / "configs" / "cardio.yaml")
    encoder = TableEncoder(schema)
    gan = load_profile(profile, ROOT / "configs" / "cardio.yaml").gan
    condition = target_condition(gan, encoder.target_index, "binary")
    gen = generator_spec(gan, encoder.width, encoder.head_groups(), condition).build()
    gen.to("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        encoder.decode(sample_encoded(gen, SAMPLE_ROWS, seed=0)).to_parquet(Path(tmp) / "s.parquet")
        return time.perf_counter() - started


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--workers", type=int, default=2, help="parallel one-thread workers of the experiment flow")
    ap.add_argument("--profile", default="thesis", help="the profile whose GAN settings are timed")
    args = ap.parse_args(argv)

    from bench import pretrain, select, train

    profile = ["--profile", args.profile]
    pre = _quiet(pretrain.main, ["--json", "--device", args.device] + profile)
    tr = _quiet(
        train.main, ["--json", "--device", args.device, "--iterations", "600", "--naive-iterations", "150"] + profile
    )
    sel = _quiet(select.main, ["--json", "--runs", "2", "--width", "cardio"])["tables"][0]
    sample_s = sampling_seconds(args.device, args.profile)

    fast = {
        "pretrain": CRITICS * PRETRAIN_ITERATIONS * pre["fast_ms_per_critic_iteration"] / 1e3
        + SETTINGS * pre.get("fast_setup_s", 0.0),
        "train": SETTINGS * TRAIN_ITERATIONS * tr["fast_ms_per_iteration"] / 1e3 / args.workers,
        "sample": CHECKPOINTS * sample_s,
        "select": SELECTION_RUNS * sel["fast_s"] / 2 / args.workers,
    }
    naive = {
        "pretrain": CRITICS * PRETRAIN_ITERATIONS * pre["naive_ms_per_critic_iteration"] / 1e3 / args.workers,
        "train": SETTINGS * TRAIN_ITERATIONS * tr["naive_ms_per_iteration"] / 1e3 / args.workers,
        "sample": CHECKPOINTS * sample_s,
        "select": SELECTION_RUNS * sel["naive_s"] / 2 / args.workers,
    }
    summary = {
        "naive_projected_min": round(sum(naive.values()) / 60, 1),
        "projected_full_min": round(sum(fast.values()) / 60, 1),
        "ratio": round(sum(naive.values()) / sum(fast.values()), 1),
        "fast_components_min": {k: round(v / 60, 1) for k, v in fast.items()},
        "naive_components_min": {k: round(v / 60, 1) for k, v in naive.items()},
        "max_auc_diff": sel["max_auc_diff"],
        "measured": {
            "pretrain_ms_per_critic_iteration": pre["fast_ms_per_critic_iteration"],
            "naive_pretrain_ms_per_critic_iteration": pre["naive_ms_per_critic_iteration"],
            "train_ms_per_iteration": tr["fast_ms_per_iteration"],
            "naive_train_ms_per_iteration": tr["naive_ms_per_iteration"],
            "select_s_per_run": sel["fast_s"] / 2,
            "naive_select_s_per_run": sel["naive_s"] / 2,
            "sample_s_per_checkpoint": round(sample_s, 3),
        },
    }
    if not args.json:
        print(
            f"thesis profile projected: {summary['projected_full_min']} min "
            f"(naive {summary['naive_projected_min']} min)"
        )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
