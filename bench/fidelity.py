"""The fidelity summary on a census-sized table (`python -m bench.fidelity`): seconds of one
`fidelity_summary` call (every figure of the internal report: 1-way and 2-way TVDs on the public cells and
on the shape cells, lost levels, point-mass gaps, KS, Spearman), and its pairwise TVD against a naive
baseline in the same process.

Tables: the census demo schema (configs/census-demo.yaml, 15 columns: 105 pairs) with its money columns'
0 declared a point mass, two generated tables of `--rows` rows (32,561 by default, the census table's)
in the "hard" shape (heaps, skewed levels): one plays the real table, the other the synthetic one.

Naive: each pair's 2-way TVD as users of pandas write it, `pd.crosstab` of the two columns' public cells
(normalised) in each table, aligned on the union of their cells. Now: `pairwise_tvd` (one `np.bincount` of
the pair's joint cell codes per table). Both score the same cells: the summary checks that their figures
agree. The last line printed is JSON: {"summary_seconds", "naive_pairwise_seconds", "pairwise_seconds"
(wall), the same three as "..._cpu_seconds" (this process's CPU), "ratio" (naive over now, CPU),
"max_abs_diff", "pairs", "rows", "load_average"}. A machine shared with other work gives larger figures than an
idle one: say which it was.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from dpsynth.models.data.binning import DEFAULT_BINS, frame_cells
from dpsynth.models.data.demo import SHAPES, make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.fidelity import fidelity_summary, pairwise_tvd

CENSUS = Path(__file__).resolve().parent.parent / "configs" / "census-demo.yaml"
CENSUS_ROWS = 32_561


def census_schema() -> DatasetSchema:
    """The census demo schema with its money columns' 0 declared a point mass (a cell of its own)."""
    raw = yaml.safe_load(CENSUS.read_text())
    for name in ("capital_gain", "capital_loss"):
        raw["columns"][name]["point_masses"] = [0.0]
    return DatasetSchema.from_dict(raw)


def naive_pairwise_tvd(schema: DatasetSchema, real: pd.DataFrame, synth: pd.DataFrame) -> pd.Series:
    """Every pair's 2-way TVD by `pd.crosstab` of the pair's public cells (missing values a cell of their own)."""
    columns = list(schema.columns)
    names = [col.name for col in columns]
    cells = [pd.DataFrame(frame_cells(columns, frame, DEFAULT_BINS), columns=names) for frame in (real, synth)]
    values = {}
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            shares = [pd.crosstab(c[first], c[second], normalize="all").stack() for c in cells]
            real_shares, synth_shares = shares[0].align(shares[1], fill_value=0.0)
            values[(first, second)] = 0.5 * float(np.abs(real_shares - synth_shares).sum())
    return pd.Series(values, dtype=np.float64)


def _seconds(call):
    """Wall and CPU seconds of `call()` (CPU: this process's, what a busy machine inflates least), its result."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=CENSUS_ROWS, help="rows of each generated table")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    args = ap.parse_args(argv)

    schema = census_schema()
    real = make_demo_table(schema, args.rows, seed=1, shape=SHAPES["hard"])
    synth = make_demo_table(schema, args.rows, seed=2, shape=SHAPES["hard"])
    summary_s, summary_cpu, summary = _seconds(lambda: fidelity_summary(schema, real, synth))
    naive_s, naive_cpu, naive = _seconds(lambda: naive_pairwise_tvd(schema, real, synth))
    now_s, now_cpu, now = _seconds(lambda: pairwise_tvd(schema, real, synth).tvd)
    diff = max(abs(naive[pair] - value) for pair, value in now.items())
    result = {
        "summary_seconds": summary_s,
        "summary_cpu_seconds": summary_cpu,
        "naive_pairwise_seconds": naive_s,
        "naive_pairwise_cpu_seconds": naive_cpu,
        "pairwise_seconds": now_s,
        "pairwise_cpu_seconds": now_cpu,
        "ratio": naive_cpu / max(now_cpu, 1e-9),  # a tiny table's call may round to no CPU time
        "max_abs_diff": diff,
        "pairs": int(summary["pairs_scored"]),
        "rows": args.rows,
        "load_average": os.getloadavg()[0],
    }
    if not args.json:
        print(f"fidelity_summary: {summary_s:.2f} s ({summary_cpu:.2f} s CPU), {args.rows:,} rows")
        print(f"pairwise TVD, CPU: naive (pd.crosstab) {naive_cpu:.2f} s, now {now_cpu:.3f} s: {result['ratio']:.1f}x")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
