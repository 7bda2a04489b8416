"""Benchmark of one DP-SGD step's clipped sum: ghost norms (what DP-CGAN, DP-auto-GAN and DP-Fed-CTGAN train
with, models/generators/ghost_clipping.py) against per-row gradients (vmap of grad, then
`dpsgd.clipped_sum`: what they trained with before, and RDP-CGAN still does).

Measured on DP-auto-GAN's autoencoder as `eps1` builds it for the generated census table (108 encoded
columns, hidden widths 64, latent 16, the "typed" head over the census groups), for Poisson batches of
the sizes a million-row table draws at `eps1`'s rate 0.01 (8,000 rows) and smaller ones. For each batch:
CPU and wall seconds a step (the mean over `--repeats` steps after one untimed step), the process's
peak resident memory growth during the per-row run (the ghost run goes first), the ratio, and the
largest relative difference between the two sums (float rounding only). One intra-op thread by default:
with two on a busy machine, the threads' spin-waiting inflates both CPU figures several times. The last
line of standard output is the JSON object.

Usage: ``python -m bench.clipping [--rows 1000 8000] [--repeats 5] [--json]``
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
import yaml

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.dpautogan.autoencoder import autoencoder_clipped_sum, autoencoder_per_example
from dpsynth.models.generators.dpautogan.networks import Autoencoder
from dpsynth.models.generators.dpsgd import clipped_sum

CENSUS = Path(__file__).resolve().parent.parent / "configs" / "census-demo.yaml"
WIDTH = 108  # the census schema's encoded width
CLIP = 0.1  # eps1's autoencoder_clip


def census_groups() -> list[tuple[int, int, str]]:
    """The encoder's groups for configs/census-demo.yaml (its 108 encoded columns)."""
    raw = yaml.safe_load(CENSUS.read_text())
    groups = [tuple(g) for g in TableEncoder(DatasetSchema.from_dict(raw)).head_groups()]
    assert max(g[1] for g in groups) == WIDTH, groups
    return groups  # type: ignore[return-value]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(step, repeats: int) -> tuple[float, float, dict[str, torch.Tensor]]:
    out = step()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(repeats):
        out = step()
    return (time.process_time() - cpu) / repeats, (time.perf_counter() - wall) / repeats, out


def measure(rows: int, repeats: int, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    ae = Autoencoder(WIDTH, 16, (64,), (64,), "typed", census_groups())
    batch = torch.rand(rows, WIDTH, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    weights = torch.ones(WIDTH)
    before = _peak_mb()
    ghost_cpu, ghost_wall, ghost = _timed(lambda: autoencoder_clipped_sum(ae, batch, CLIP, weights), repeats)
    ghost_peak = _peak_mb()
    naive_cpu, naive_wall, naive = _timed(
        lambda: clipped_sum(autoencoder_per_example(ae, batch, weights), CLIP), repeats
    )
    naive_peak = _peak_mb()
    difference = max(float((ghost[k] - naive[k]).abs().max() / naive[k].abs().max().clamp(min=1e-12)) for k in naive)
    return {
        "rows": rows,
        "ghost_cpu_s": ghost_cpu,
        "ghost_wall_s": ghost_wall,
        "naive_cpu_s": naive_cpu,
        "naive_wall_s": naive_wall,
        "ratio_cpu": naive_cpu / ghost_cpu,
        "ghost_peak_growth_mb": ghost_peak - before,
        "naive_peak_growth_mb": naive_peak - ghost_peak,
        "largest_relative_difference": difference,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1000, 8000], help="Poisson batch sizes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (one: comparable on a busy machine)")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = [measure(rows, args.repeats) for rows in args.rows]
    if not args.json:
        print(
            "| batch rows | ghost CPU s / step | per-row CPU s / step | ratio | per-row peak growth MB | sums differ |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in results:
            print(
                f"| {r['rows']:,} | {r['ghost_cpu_s']:.3f} | {r['naive_cpu_s']:.3f} | {r['ratio_cpu']:.1f}x "
                f"| {r['naive_peak_growth_mb']:.0f} | {r['largest_relative_difference']:.1e} |"
            )
    summary = {"benchmark": "clipping", "threads": args.threads, "results": results}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
