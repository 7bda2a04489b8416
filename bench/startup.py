"""Start-up of `dpsynth release`: seconds from the command to its first stage (`validate`), today's way
against the naive ordering it replaced (`python -m bench.startup --repeats 3`).

Naive (the ordering before flows/prefect_server.py): Prefect and MLflow imported first, then the
preflight, the MLflow store and the run folder, then the flow, whose first call starts Prefect's temporary
server and waits for it; the flow loaded torch (as the naive child still does). Now: a process loading
Prefect's server code and building its app (serving nothing) while the preflight runs, so that a refusal
starts nothing and loads neither torch, Prefect nor MLflow; once the preflight has passed, that process
serves while this one loads the flow, without torch, scikit-learn or MLflow (flows/stages.py); the flow
opens the MLflow run, and a new home's store, in a thread beside its first stages (flows/release.py).

Each run is a fresh process with its own home (a new MLflow store, as a first release has) on a generated
table with the smoke trial profile, run until its first stage starts and then stopped (its process group:
the server too). The two orderings alternate, run after run, so that a machine busy with other work
slows both alike; the summary gives each one's median and their ratio, and the CPU seconds the command's
processes used until the first stage (the server's included). A machine shared with other work gives
larger figures than an idle one, its wall times much more than its CPU seconds: say which it was.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "cardio.yaml"
FIRST_STAGE = "validate..."


def naive_release(argv: list[str]) -> None:
    """`dpsynth release` in the naive ordering (see the module's docstring), run in a child process."""
    import mlflow  # noqa: F401  (the console imported both libraries before anything else)
    import prefect  # noqa: F401
    import torch  # noqa: F401  (and the flow loaded torch, before its first stage)

    from dpsynth.flows.cli import build_parser, check_store_now, preflight_checks
    from dpsynth.flows.console import flow_console, quiet_mlflow
    from dpsynth.tasks.context import open_run

    args = build_parser().parse_args(["release", *argv])
    with flow_console(json_output=False, verbose=False):
        quiet_mlflow()
        ctx = preflight_checks(args, "release")
        check_store_now()  # the store was always asked, and made, before the flow
        open_run(ctx)
        from dpsynth.flows.release import release

        # Prefect starts its temporary server here, on the flow's first call, and waits for it.
        release(config=args.config, data=args.data, profile=args.profile, out=str(ctx.run_dir), publish=False)


def command(ordering: str, data: Path) -> list[str]:
    argv = ["--config", str(CONFIG), "--data", str(data), "--profile", "smoke", "--no-publish"]
    if ordering == "naive":
        return [sys.executable, "-m", "bench.startup", "--naive-child", *argv]
    return [sys.executable, "-m", "dpsynth.flows.cli", "release", *argv]


def cpu_seconds_of_tree(root: int) -> float:
    """User and system CPU seconds of process `root` and all its descendants so far (Linux's /proc; 0
    elsewhere): on a machine busy with other work, wall time grows with the load and this much less."""
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])  # after the command's name: state, ppid, ... utime (12th), stime (13th)
        used[pid] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(used.get(pid, 0.0) for pid in tree)


def seconds_to_first_stage(ordering: str, data: Path, timeout: float) -> tuple[float, float]:
    """Seconds from starting the command to its first stage's line, and the CPU seconds its processes
    (the command's and the server's) used until then; the process group is then stopped."""
    home = Path(tempfile.mkdtemp(prefix=f"startup-{ordering}-"))
    env = {
        **os.environ,
        "DPSYNTH_HOME": str(home),
        "DPSYNTH_PROGRESS": "lines",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        # dpsynth's own allowance for the server (flows/__init__.py), which the naive ordering, importing
        # Prefect first, would otherwise miss: on a busy machine its server then timed out at Prefect's 20 s.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_API_URL", None)
    started = time.monotonic()
    process = subprocess.Popen(
        command(ordering, data),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the server it starts is stopped with it
    )
    seen: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if line.strip() == FIRST_STAGE:
                return time.monotonic() - started, cpu_seconds_of_tree(process.pid)
            seen.append(line.rstrip())
            if time.monotonic() - started > timeout:
                break
        raise RuntimeError(
            f"{ordering}: no first stage within {timeout:g} s; its standard error ended with: {seen[-5:]}"
        )
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each ordering (alternating)")
    ap.add_argument("--rows", type=int, default=3000, help="rows of the generated table")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take to reach its first stage")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    args = ap.parse_args(argv)

    from dpsynth.models.data.demo import make_demo_table
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.tasks.context import write_demo_sidecar
    from dpsynth.tasks.table_io import write_table

    schema = DatasetSchema.from_yaml(CONFIG)
    table = make_demo_table(schema, args.rows, 0)
    data = write_table(table, Path(tempfile.mkdtemp()) / "demo.csv", separator=schema.separator)
    write_demo_sidecar(data, {"schema": schema.name, "rows": args.rows, "seed": 0, "shape": "plain"})
    times: dict[str, list[float]] = {"naive": [], "now": []}
    cpu: dict[str, list[float]] = {"naive": [], "now": []}
    for _ in range(args.repeats):
        for ordering in times:
            wall, used = seconds_to_first_stage(ordering, data, args.timeout)
            times[ordering].append(wall)
            cpu[ordering].append(used)
            if not args.json:
                print(f"{ordering}: {wall:.1f} s to the first stage, {used:.1f} CPU seconds", flush=True)
    naive, now = statistics.median(times["naive"]), statistics.median(times["now"])
    summary = {
        "naive_seconds": times["naive"],
        "now_seconds": times["now"],
        "naive_median": naive,
        "now_median": now,
        "speedup": naive / now,
        "naive_cpu_seconds": cpu["naive"],
        "now_cpu_seconds": cpu["now"],
        "naive_cpu_median": statistics.median(cpu["naive"]),
        "now_cpu_median": statistics.median(cpu["now"]),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
    }
    if not args.json:
        print(f"median: naive {naive:.1f} s, now {now:.1f} s: {naive / now:.2f}x faster to the first stage")
        print(
            f"median CPU seconds (command and server): naive {summary['naive_cpu_median']:.1f}, "
            f"now {summary['now_cpu_median']:.1f}"
        )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    if sys.argv[1:2] == ["--naive-child"]:
        naive_release(sys.argv[2:])
    else:
        main()
