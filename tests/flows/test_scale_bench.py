"""bench/scale.py at its smallest: a generated census-shape table of a few thousand rows, the counting pass
both ways (the same counts) and one `mst-eps1` release, with every stage's wall time and peak memory in
the table (the figures themselves are measured by running the benchmark)."""

from __future__ import annotations

import json

from bench.scale import main


def test_scale_bench_times_every_stage_and_compares_the_counting_pass(tmp_path, capsys, monkeypatch):
    from prefect.settings import PREFECT_API_URL

    # The release's child process uses the session's Prefect API (tests/flows/conftest.py), as the smoke trial's
    # does, instead of starting a server of its own: what the test checks is the bench's table, not that start.
    monkeypatch.setenv("PREFECT_API_URL", str(PREFECT_API_URL.value()))
    figures = tmp_path / "figures.json"
    # Memory sampled every second, not every 0.2 s (the default): each sample reads every process's memory map
    # (the test's own CPU: 11.0 s at 0.2 s in a whole-suite run, 6.2 s at 1 s alone, that including the session's
    # Prefect API start). A stage's peak is read from the samples within one interval either side of it, so every
    # stage, however short, still has one.
    argv = ["--rows", "3000", "--profiles", "mst-eps1", "--interval", "1", "--folder", str(tmp_path)]
    assert main([*argv, "--json", str(figures)]) == 0
    printed = capsys.readouterr().out
    assert "counts equal" in printed and "memory ratio" in printed
    counting, release = json.loads(figures.read_text())
    assert counting["counting"]["naive"]["digest"] == counting["counting"]["row groups"]["digest"]
    assert release["profile"] == "mst-eps1" and release["epsilon"] <= 1.0
    stages = [row["stage"] for row in release["stages"]]
    assert stages[0] == "preflight" and stages[-1] == "decision, report, bundle"
    assert {"validate", "split", "preprocess", "prepare-mst-eps1", "train-mst-eps1"} <= set(stages)
    assert all(row["seconds"] >= 0 and row["peak"] > 0 for row in release["stages"])
    assert release["peak"] >= max(row["peak"] for row in release["stages"])
    assert "| train-mst-eps1 |" in printed
