"""prefect.yaml end to end: a real Prefect server, the work pool, `prefect deploy --all`; one run of the
release deployment and one of the experiment deployment (on a local Dask cluster its profile names),
each picked up by a process worker, COMPLETED.

Everything runs in subprocesses against a server on a free local port with its own PREFECT_HOME, so it
touches neither the session's test harness nor the user's Prefect profile. The worker runs the flow in
DPSYNTH_PROJECT, a temporary folder whose code and configs link to this checkout, with DPSYNTH_HOME beside
it: the ledger, the stores and the run folders land in the home, not in the project. The server and the deployments
are made once for the
module (starting and deploying is most of a test's time).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from dpsynth.flows.cli import main
from tests.conftest import CARDIO_SCHEMA, ROOT, publishing_smoke

POOL = "dpsynth-pool"
RELEASE = ("release", "monthly-release")
EXPERIMENT = ("experiment", "thesis-experiment")
LINKED = (
    "dpsynth",
    "flows",
    "tasks",
    "models",
    "configs",
    "expectations",
    "prefect.yaml",
    "pyproject.toml",
    "setup.py",
)
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# Every wait below is a guard against a hang, not a claim of speed: long enough for a machine saturated by other
# work (the server's start, `prefect deploy`, a flow run on a worker each took minutes at load 15 and more).
HANG_GUARD_S = 1800.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(prefect_home: Path, api_url: str, project: Path, dpsynth_home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PREFECT_") and k not in ("MLFLOW_TRACKING_URI", "PYTHONPATH")
    }
    env.update(
        {
            "PREFECT_HOME": str(prefect_home),
            "PREFECT_API_URL": api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_CLI_PROMPT": "false",
            "DO_NOT_TRACK": "1",
            "GX_ANALYTICS_ENABLED": "false",
            "DPSYNTH_PROJECT": str(project),
            "DPSYNTH_HOME": str(dpsynth_home),
        }
    )
    return env


def _prefect(*args: str, env: dict, cwd: Path, timeout: float = HANG_GUARD_S) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        check=False,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _start(args: list[str], env: dict, cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as handle:
        # Own process group: stopping it stops the processes it started (uvicorn, the flow run).
        return subprocess.Popen(
            args,
            env=env,
            cwd=cwd,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_healthy(api: httpx.Client, server: subprocess.Popen, log: Path, timeout: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"prefect server exited:\n{log.read_text()[-3000:]}"
        try:
            if api.get("/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"prefect server not healthy after {timeout}s:\n{log.read_text()[-3000:]}")


def _tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A Prefect server on a free port with prefect.yaml deployed from a DPSYNTH_PROJECT linked to this
    checkout (deploying forecasts the monthly schedule against the home's empty ledger), and a demo table."""
    tmp = tmp_path_factory.mktemp("deployed")
    project, home = tmp / "project", tmp / "dpsynth-home"
    project.mkdir()
    for name in LINKED:
        if (ROOT / name).exists():
            (project / name).symlink_to(ROOT / name)
    data = tmp / "demo.csv"
    assert main(["demo-data", "--rows", "3000", "--out", str(data), "--config", str(CARDIO_SCHEMA)]) == 0

    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = _env(tmp / "prefect-home", api_url, project, home)
    server_log = tmp / "server.log"
    server = None
    api = httpx.Client(base_url=api_url, timeout=300)  # one request to a busy local server: a hang guard too
    try:
        # The API alone: the tests create their runs themselves, so the scheduler and other services can rest.
        server = _start(
            [
                sys.executable,
                "-m",
                "prefect",
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-ui",
                "--no-services",
            ],
            env,
            tmp,
            server_log,
        )
        _wait_healthy(api, server, server_log)
        _prefect("work-pool", "create", POOL, "--type", "process", env=env, cwd=project)
        _prefect("--no-prompt", "deploy", "--all", env=env, cwd=project)
        by_name = {d["name"]: d for d in api.post("/deployments/filter", json={}).json()}
        yield {
            "api": api,
            "env": env,
            "project": project,
            "home": home,
            "data": data,
            "tmp": tmp,
            "deployments": by_name,
        }
    finally:
        api.close()
        _stop(server)


def _run_deployment(deployed, name: str, parameters: dict, worker_log: Path) -> None:
    """Create a run of a deployment and let a one-shot process worker pick it up and complete it."""
    api = deployed["api"]
    created = api.post(
        f"/deployments/{deployed['deployments'][name]['id']}/create_flow_run", json={"parameters": parameters}
    )
    assert created.status_code in (200, 201), created.text
    run_id = created.json()["id"]
    assert created.json()["parameters"]["config"] == "configs/cardio.yaml"  # the deployment's default
    worker = None
    try:
        worker = _start(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--run-once", "--limit", "1"],
            deployed["env"],
            deployed["project"],
            worker_log,
        )
        state, deadline = None, time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            state = api.get(f"/flow_runs/{run_id}").json()["state"]["type"]
            if state in TERMINAL:
                break
            if worker.poll() is not None and state == "SCHEDULED":
                break  # the worker left without picking the run up
            time.sleep(0.5)  # one GET to the local server; every 2 s left the test idle 1 s on average after the run
        assert state == "COMPLETED", f"flow run ended {state}:\n{_tail(worker_log)}"
        worker.wait(timeout=HANG_GUARD_S)
        assert worker.returncode == 0, _tail(worker_log)
    finally:
        _stop(worker)


def test_prefect_yaml_deploys_and_a_worker_completes_a_release(deployed):
    started = time.monotonic()
    project, home, tmp = deployed["project"], deployed["home"], deployed["tmp"]
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    # Entrypoints are a file and a function (path/file.py:function) or a module path (package.module.function).
    deployments = {(d["entrypoint"].replace(":", ".").rsplit(".", 1)[1], d["name"]): d for d in spec["deployments"]}
    assert set(deployments) == {RELEASE, EXPERIMENT}
    assert deployments[RELEASE]["schedules"][0]["cron"] == "0 2 1 * *"
    assert not deployments[EXPERIMENT].get("schedules")

    by_name = deployed["deployments"]
    assert set(by_name) == {RELEASE[1], EXPERIMENT[1]}, by_name.keys()
    release = by_name[RELEASE[1]]
    assert release["work_pool_name"] == POOL and release["parameters"]["profile"] == "default"
    assert [s["schedule"]["cron"] for s in release["schedules"]] == ["0 2 1 * *"]
    assert by_name[EXPERIMENT[1]]["schedules"] == []
    # The pull step changes into DPSYNTH_PROJECT; the placeholder resolves from the environment.
    assert release["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(project)

    out = tmp / "release-run"
    profile = publishing_smoke(tmp / "release-profiles")  # the shipped smoke is a trial: it publishes nothing
    _run_deployment(
        deployed,
        RELEASE[1],
        {"data": str(deployed["data"]), "profile": profile, "out": str(out)},
        tmp / "release-worker.log",
    )
    # It ran in DPSYNTH_PROJECT (relative config resolved there) and kept its stores and ledger in the home.
    assert (out / "train-k10" / "checkpoints" / "ledger.json").is_file()
    assert json.loads((out / "run.json").read_text())["status"] == "published"
    assert json.loads((out / "bundle" / "release.json").read_text())["model_uri"] == "models:/cardio-gswgan/1"
    assert (home / "mlflow.db").is_file() and (home / "privacy-ledger.sqlite").is_file()
    assert (home / "registry" / "registry.db").is_file() and not list(project.glob("*.db"))
    assert not (ROOT / "configs" / "mlflow.db").exists()
    print(f"release deployment test: {time.monotonic() - started:.0f}s")


def _tiny_dask_profile(folder: Path, address: str) -> Path:
    """Smoke, cut to one private setting of three checkpoints (three selection runs), on `address`."""
    folder.mkdir()
    (folder / "smoke.yaml").symlink_to(ROOT / "configs" / "profiles" / "smoke.yaml")
    path = folder / "smoke-dask.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "extends": "smoke",
                "dask_address": address,
                "release_setting": None,
                "settings": [{"name": "k2", "discriminators": 2, "private": True}],
                "gan": {"pretrain_iterations": 10, "iterations": 20, "checkpoint_every": 10},
                "evaluation": {"real_baseline": False},
            }
        )
    )
    return path


def test_the_experiment_deployment_runs_its_selection_runs_on_the_profiles_dask_cluster(deployed):
    """The deployed experiment reads `dask_address` from its profile, as the command line does. Evidence:
    the scheduler's own task stream, which only records tasks its workers executed (a process pool that
    ignored the address leaves it empty)."""
    from dask.utils import key_split
    from distributed import Client, LocalCluster

    started = time.monotonic()
    tmp = deployed["tmp"]
    out = tmp / "experiment-run"
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        client.get_task_stream()  # installs the scheduler's task-stream recorder before the run
        # The Dask worker imports the project (torch, Prefect) while the Prefect worker starts the flow run.
        warm = client.submit(importlib.import_module, "dpsynth.flows.experiment", pure=False)
        profile = _tiny_dask_profile(tmp / "profiles", cluster.scheduler_address)
        _run_deployment(
            deployed,
            EXPERIMENT[1],
            {"data": str(deployed["data"]), "profile": str(profile), "out": str(out)},
            tmp / "experiment-worker.log",
        )
        warm.result()
        stream = client.get_task_stream()
        workers = set(client.scheduler_info()["workers"])

    summary = json.loads((out / "summary.json").read_text())
    assert summary["selection_runs"] == summary["planned_selection_runs"] == 3
    ran = [r for r in stream if r["status"] == "OK"]
    assert {r["worker"] for r in ran} <= workers
    # Dask names a task by its function: the selection runs' tasks/evaluate.selection_run_stage and the
    # setting's training, flows/experiment.run_training.
    prefixes = [key_split(r["key"]) for r in ran]
    assert prefixes.count("selection_run_stage") == summary["selection_runs"], prefixes
    assert prefixes.count("run_training") == 1, prefixes
    print(f"experiment deployment test: {time.monotonic() - started:.0f}s")
