"""Census-size releases: wall time and peak memory per stage, and the cost per row of each
(`python -m bench.scale --rows 100000 1000000 --profiles mst-eps1`).

For each number of rows a census-shape table is generated (`dpsynth demo-data --shape hard`, made by
code, no real row), then each profile's `dpsynth release` runs on it in a child process with a scratch
home. The memory of the release's whole process tree (the sum of its processes' proportional set sizes,
PSS: shared pages counted once) is sampled every `--interval` seconds, and each process's own peak is
listed; each stage's wall time and start come from its manifest in the run folder, and its peak is the
largest sample inside it. "preflight" is the time before the first stage, "decision, report, bundle" the time
after the last stage's end (the DP decision, the report, the bundle and the registration).

The counting pass (what the marginal generators read of the rows) is also measured both ways, each in a
fresh child process: `naive` reads the whole validated table into memory and counts it (what the stages
did before the row-group pass), `row groups` counts the same Parquet file one row group at a time
(tasks/cell_counting.py). Their ratio is printed, with a check that the counts are equal.

A machine busy with other work gives longer times than an idle one: the load average is printed with
the table, say which it was.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "census-demo.yaml"
MB = 1024 * 1024


@dataclass
class MemorySampler:
    """Memory of a process and all its descendants, sampled in a thread: (time, bytes). Each sample sums
    the processes' proportional set size (PSS: a page shared by k processes counts 1/k in each), the
    memory the tree takes from the machine; summing their resident sizes (RSS) would count the shared
    libraries and the pages a fork shares once per process. Each process's own largest PSS is kept too,
    by its command line (`by_process`): what each holds."""

    pid: int
    interval: float
    samples: list[tuple[float, int]] = field(default_factory=list)
    by_process: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            total = 0
            try:
                for proc in [root, *root.children(recursive=True)]:
                    try:
                        pss = proc.memory_full_info().pss
                        label = f"{proc.pid} {' '.join(proc.cmdline()[:4])[:90]}"
                    except psutil.Error:
                        continue  # a child that ended between the listing and the reading
                    total += pss
                    self.by_process[label] = max(self.by_process.get(label, 0), pss)
            except psutil.NoSuchProcess:
                break
            self.samples.append((time.time(), total))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float = 0.0, end: float = float("inf")) -> int:
        inside = [rss for t, rss in self.samples if start <= t <= end]
        return max(inside, default=0)


def demo_table(rows: int, folder: Path) -> Path:
    """The generated census-shape table of `rows` rows (made once per folder)."""
    path = folder / f"census-{rows}.csv"
    if not path.exists():
        subprocess.run(
            [sys.executable, "-m", "dpsynth.flows.cli", "demo-data", "--config", str(CONFIG), "--shape", "hard",
             "--rows", str(rows), "--out", str(path)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return path


def stage_times(run_dir: Path) -> list[tuple[str, float, float]]:
    """(stage, start, seconds) of every stage the run folder records, in the order they started."""
    out = []
    for manifest in run_dir.rglob("manifest.json"):
        record = json.loads(manifest.read_text())
        if "started" not in record:
            continue
        from datetime import datetime

        started = datetime.fromisoformat(record["started"]).timestamp()
        out.append((str(record["stage"]), started, float(record["seconds"])))
    return sorted(out, key=lambda row: row[1])


def run_release(data: Path, profile: str, interval: float, extra: list[str]) -> dict:
    """One `dpsynth release` in a child process with a scratch home (removed after): its stages' times and peaks."""
    home = Path(tempfile.mkdtemp(prefix="dpsynth-scale-"))
    try:
        return _timed_release(home, data, profile, interval, extra)
    finally:
        shutil.rmtree(home, ignore_errors=True)  # a run folder of a census-size table: hundreds of MB


def _timed_release(home: Path, data: Path, profile: str, interval: float, extra: list[str]) -> dict:
    out = home / "run"
    env = {**os.environ, "DPSYNTH_HOME": str(home)}
    command = [sys.executable, "-m", "dpsynth.flows.cli", "release", "--config", str(CONFIG), "--data", str(data),
               "--profile", profile, "--out", str(out), "--json", *extra]  # fmt: skip
    started = time.time()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = MemorySampler(child.pid, interval)
    stdout, stderr = child.communicate()
    ended = time.time()
    sampler.stop()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds (user + system) of the release and every process it waited for: on a shared machine a
    # steadier figure than the wall time.
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    if child.returncode != 0:
        raise SystemExit(f"release {profile} on {data.name} failed ({child.returncode}):\n{stderr[-3000:]}")
    summary = json.loads(stdout.strip().splitlines()[-1])
    stages = stage_times(out)
    rows: list[dict] = []
    first = stages[0][1] if stages else ended
    rows.append({"stage": "preflight", "seconds": first - started, "peak": sampler.peak(started, first)})
    for name, start, seconds in stages:
        # One sampling interval either side: a stage shorter than the interval still gets its samples.
        window = (start - interval, start + seconds + interval)
        rows.append({"stage": name, "seconds": seconds, "peak": sampler.peak(*window)})
    last = max((start + seconds for _, start, seconds in stages), default=ended)
    rows.append({"stage": "decision, report, bundle", "seconds": ended - last, "peak": sampler.peak(last, ended)})
    return {
        "profile": profile,
        "stages": rows,
        "seconds": ended - started,
        "peak": sampler.peak(),
        "epsilon": summary.get("epsilon"),
        "auc": summary.get("auc"),
        "cpu_seconds": cpu,
        "processes": dict(sorted(sampler.by_process.items(), key=lambda item: -item[1])),
    }


COUNTING_CHILD = """
import json, resource, sys, time
import numpy as np
import pandas as pd
from dpsynth.models.data.cell_counts import count_frame, one_and_two_way
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.tasks.cell_counting import count_training_cells, publicly_filled_rows
schema = DatasetSchema.from_yaml(sys.argv[1])
path, bins, way = sys.argv[2], int(sys.argv[3]), sys.argv[4]
cliques = one_and_two_way(len(schema.columns))
started = time.perf_counter()
if way == "naive":
    table = pd.read_parquet(path)
    counts = count_frame(publicly_filled_rows(schema, table, 5), tuple(schema.columns), bins, cliques)
else:
    import pyarrow.parquet as pq
    rows = np.arange(pq.ParquetFile(path).metadata.num_rows)
    counts = count_training_cells(schema, path, rows, 5, bins, cliques)
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "peak": peak, "digest": counts.digest()}))
"""


def counting_pass(parquet: Path, bins: int) -> dict[str, dict]:
    """The counting pass both ways, each in a fresh process (its own peak memory)."""
    out = {}
    for label, way in (("naive", "naive"), ("row groups", "row-groups")):
        done = subprocess.run(
            [sys.executable, "-c", COUNTING_CHILD, str(CONFIG), str(parquet), str(bins), way],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        out[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def write_parquet(csv: Path) -> Path:
    """The table as Parquet (what a run's validate stage writes), for the counting pass."""
    import pandas as pd

    path = csv.with_suffix(".parquet")
    if not path.exists():
        from dpsynth.tasks.cell_counting import ROW_GROUP_ROWS

        pd.read_csv(csv).to_parquet(path, index=False, row_group_size=ROW_GROUP_ROWS)
    return path


def table(n_rows: int, result: dict) -> str:
    lines = [
        f"\n{result['profile']}, {n_rows:,} rows: {result['seconds']:.1f} s wall, {result['cpu_seconds']:.1f} s CPU, "
        f"peak {result['peak'] / MB:.0f} MB, "
        f"epsilon {result['epsilon']}, AUC {result['auc']}",
        "| stage | seconds | microseconds per row | peak MB | peak bytes per row |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in result["stages"]:
        lines.append(
            f"| {row['stage']} | {row['seconds']:.1f} | {row['seconds'] / n_rows * 1e6:.1f} | "
            f"{row['peak'] / MB:.0f} | {row['peak'] / n_rows:.0f} |"
        )
    lines.append("each process's largest PSS (MB):")
    lines.extend(f"  {pss / MB:6.0f}  {label}" for label, pss in result["processes"].items())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000])
    ap.add_argument("--profiles", nargs="+", default=["mst-eps1"])
    ap.add_argument("--folder", default=None, help="where the generated tables go (default: a scratch folder)")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between memory samples")
    ap.add_argument("--bins", type=int, default=32, help="bins per continuous column in the counting pass")
    ap.add_argument("--no-counting", action="store_true", help="skip the counting pass's naive comparison")
    ap.add_argument("--json", default=None, help="also write every figure to this JSON file")
    ap.add_argument("release_args", nargs=argparse.REMAINDER, help="after --: extra `dpsynth release` arguments")
    args = ap.parse_args(argv)
    folder = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="dpsynth-scale-data-"))
    folder.mkdir(parents=True, exist_ok=True)
    extra = [a for a in args.release_args if a != "--"]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    figures: list[dict] = []
    for n_rows in args.rows:
        data = demo_table(n_rows, folder)
        if not args.no_counting:
            counted = counting_pass(write_parquet(data), args.bins)
            naive, grouped = counted["naive"], counted["row groups"]
            same = "equal" if naive["digest"] == grouped["digest"] else "DIFFERENT"
            print(
                f"\ncounting pass, {n_rows:,} rows: naive (whole table in memory) {naive['seconds']:.1f} s, peak "
                f"{naive['peak'] / MB:.0f} MB; row groups {grouped['seconds']:.1f} s, peak {grouped['peak'] / MB:.0f} "
                f"MB; memory ratio {naive['peak'] / grouped['peak']:.2f}x, time ratio "
                f"{naive['seconds'] / grouped['seconds']:.2f}x; counts {same}",
                flush=True,
            )
            figures.append({"rows": n_rows, "counting": counted})
            if same != "equal":
                return 1
        for profile in args.profiles:
            result = run_release(data, profile, args.interval, extra)
            print(table(n_rows, result), flush=True)
            figures.append({"rows": n_rows, **result})
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
