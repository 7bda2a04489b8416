"""bench/startup.py at its smallest: one run of each ordering reaches its first stage, and the summary
holds both times and their ratio (the figure itself is measured by running the benchmark)."""

from __future__ import annotations

import json

from bench.startup import main


def test_startup_bench_times_both_orderings_to_the_first_stage(capsys):
    summary = main(["--repeats", "1", "--rows", "300", "--json"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary
    assert len(summary["naive_seconds"]) == len(summary["now_seconds"]) == 1
    assert summary["naive_median"] > 0 and summary["now_median"] > 0
    assert summary["speedup"] == summary["naive_median"] / summary["now_median"]
