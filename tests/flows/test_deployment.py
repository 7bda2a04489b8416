"""prefect.yaml end to end: a real Prefect server, the work pool, `prefect deploy --all`, one run of the
release deployment picked up by a process worker, COMPLETED.

Everything runs in subprocesses against a server on a free local port with its own PREFECT_HOME, so it
touches neither the session's test harness nor the user's Prefect profile. The worker runs the flow in
DPSYNTH_HOME, a temporary folder whose code and configs link to this checkout: run folders, mlflow.db
and mlartifacts/ land there, not in the project.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from flows.cli import main
from tests.conftest import CARDIO_SCHEMA, ROOT

POOL = "dpsynth-pool"
RELEASE = ("release", "monthly-release")
EXPERIMENT = ("experiment", "thesis-experiment")
LINKED = ("flows", "tasks", "models", "configs", "expectations", "prefect.yaml", "pyproject.toml")
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(prefect_home: Path, api_url: str, dpsynth_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k not in ("MLFLOW_TRACKING_URI", "PYTHONPATH")}
    env.update({
        "PREFECT_HOME": str(prefect_home),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_CLI_PROMPT": "false",
        "DO_NOT_TRACK": "1",
        "GX_ANALYTICS_ENABLED": "false",
        "DPSYNTH_HOME": str(dpsynth_home),
    })
    return env


def _prefect(*args: str, env: dict, cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "-m", "prefect", *args], check=False, env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _start(args: list[str], env: dict, cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as handle:
        # Own process group: stopping it stops the processes it started (uvicorn, the flow run).
        return subprocess.Popen(args, env=env, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


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


def _wait_healthy(api: httpx.Client, server: subprocess.Popen, log: Path, timeout: float = 120) -> None:
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


def test_prefect_yaml_deploys_and_a_worker_completes_a_release(tmp_path):
    started = time.monotonic()
    home = tmp_path / "dpsynth-home"
    home.mkdir()
    for name in LINKED:
        if (ROOT / name).exists():
            (home / name).symlink_to(ROOT / name)
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployments = {(d["entrypoint"].split(":")[1], d["name"]): d for d in spec["deployments"]}
    assert set(deployments) == {RELEASE, EXPERIMENT}
    assert deployments[RELEASE]["schedules"][0]["cron"] == "0 2 1 * *"
    assert not deployments[EXPERIMENT].get("schedules")

    data = tmp_path / "demo.csv"
    assert main(["demo-data", "--rows", "3000", "--out", str(data), "--config", str(CARDIO_SCHEMA)]) == 0

    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = _env(tmp_path / "prefect-home", api_url, home)
    server_log, worker_log = tmp_path / "server.log", tmp_path / "worker.log"
    server = worker = None
    api = httpx.Client(base_url=api_url, timeout=30)
    try:
        # The API alone: the test creates its run itself, so the scheduler and other services can rest.
        server = _start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                         "--port", str(port), "--no-ui", "--no-services"], env, tmp_path, server_log)
        _wait_healthy(api, server, server_log)

        _prefect("work-pool", "create", POOL, "--type", "process", env=env, cwd=home)
        _prefect("--no-prompt", "deploy", "--all", env=env, cwd=home, timeout=240)

        found = api.post("/deployments/filter", json={}).json()
        by_name = {(d["name"]): d for d in found}
        assert set(by_name) == {RELEASE[1], EXPERIMENT[1]}, by_name.keys()
        release = by_name[RELEASE[1]]
        assert release["work_pool_name"] == POOL and release["parameters"]["profile"] == "default"
        assert [s["schedule"]["cron"] for s in release["schedules"]] == ["0 2 1 * *"]
        assert by_name[EXPERIMENT[1]]["schedules"] == []
        # The pull step changes into DPSYNTH_HOME; the placeholder resolves from the environment.
        assert release["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(home)

        out = tmp_path / "run"
        created = api.post(f"/deployments/{release['id']}/create_flow_run",
                           json={"parameters": {"data": str(data), "profile": "smoke", "out": str(out)}})
        assert created.status_code in (200, 201), created.text
        run_id = created.json()["id"]
        assert created.json()["parameters"]["config"] == "configs/cardio.yaml"  # the deployment's default

        worker = _start([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--run-once",
                         "--limit", "1"], env, home, worker_log)
        state, deadline = None, time.monotonic() + 300
        while time.monotonic() < deadline:
            state = api.get(f"/flow_runs/{run_id}").json()["state"]["type"]
            if state in TERMINAL:
                break
            if worker.poll() is not None and state == "SCHEDULED":
                break  # the worker left without picking the run up
            time.sleep(2)
        assert state == "COMPLETED", f"flow run ended {state}:\n{_tail(worker_log)}"

        # It ran in DPSYNTH_HOME (relative config resolved there, default MLflow store created there).
        assert (out / "train-k10" / "checkpoints" / "ledger.json").is_file()
        assert (home / "mlflow.db").is_file()
        assert not (ROOT / "configs" / "mlflow.db").exists()
        worker.wait(timeout=60)
        assert worker.returncode == 0, _tail(worker_log)
    finally:
        api.close()
        _stop(worker)
        _stop(server)
    print(f"deployment test: {time.monotonic() - started:.0f}s")
