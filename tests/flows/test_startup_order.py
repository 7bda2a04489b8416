"""What a flow command does before its first stage, in order (flows/cli.py `preflight`,
flows/prefect_server.py): every refusal before any Prefect server serves, and without loading torch,
Prefect or MLflow; then the server, then the MLflow store and the run folder, then the flow."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from dpsynth.flows import cli, prefect_server
from tests.conftest import CARDIO_SCHEMA, ROOT, publishing_smoke

# Runs the command line in a fresh process (so that its imports are its own), with no Prefect API
# configured (so that the command prepares its own server), and reports what it loaded and what became of
# the server process it prepared.
REFUSAL_PROBE = """
import json, sys
from dpsynth.flows import cli, prefect_server
code = cli.main(sys.argv[1:])
servers = [{"serving": s.serving, "ended": s.process is None} for s in getattr(prefect_server, "_process_server", [])]
loaded = sorted(m for m in ("torch", "prefect", "mlflow") if m in sys.modules)
print(json.dumps({"code": code, "loaded": loaded, "servers": servers}))
"""


def refused_in_a_fresh_process(argv: list[str], home, prefect_home) -> dict:
    env = {**os.environ, "DPSYNTH_HOME": str(home), "PREFECT_HOME": str(prefect_home)}
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "DPSYNTH_LEDGER"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", REFUSAL_PROBE, *argv], capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


@pytest.mark.parametrize(
    "command, refusal, code",
    [
        # The lifetime budget: the accountant plans the release's cost (no torch needed for that).
        ("release", {"privacy": {"lifetime_budget": 0.001}}, 5),
        # The table fails its schema: `experiment` used to load its flow (Prefect, torch) before this.
        ("experiment", None, 4),
    ],
)
def test_a_refusal_loads_no_torch_prefect_or_mlflow_and_its_server_never_serves(
    tmp_path, demo_csv, command, refusal, code
):
    data = demo_csv
    if refusal is None:
        data = tmp_path / "bad.csv"
        data.write_text("age;gender\n1;2\n")
    profile = publishing_smoke(tmp_path / "profiles", **(refusal or {}))
    argv = [command, "--config", str(CARDIO_SCHEMA), "--data", str(data), "--profile", profile]
    prefect_home = tmp_path / "prefect-home"
    result = refused_in_a_fresh_process(argv, tmp_path / "home", prefect_home)
    assert result["code"] == code, result["stderr"]
    assert result["loaded"] == []
    # The server process prepared alongside the preflight was ended without serving: no Prefect database.
    assert result["servers"] == [{"serving": False, "ended": True}]
    assert not (prefect_home / "prefect.db").exists()
    assert not (tmp_path / "home" / "runs").exists()


class RecordingServer:
    """A stand-in for the temporary server that records, in `order`, what the command did to it."""

    def __init__(self, order: list[str]):
        self.order = order
        self.serving = False

    def start(self):
        self.order.append("server serves")
        self.serving = True
        return self

    def stop(self):
        self.order.append("server stopped")


@pytest.fixture
def recorded_order(monkeypatch):
    """The steps of a flow command, in order: the server's, the preflight's, the store's and the flow's."""
    order: list[str] = []
    server = RecordingServer(order)

    def prepared():
        order.append("server prepared")
        return server

    checks = cli.preflight_checks

    def preflight_checks(args, kind):
        ctx = checks(args, kind)
        order.append("preflight passed")
        return ctx

    @contextlib.contextmanager
    def use(used):
        assert used is server
        order.append("flow uses the server")
        yield

    monkeypatch.setattr(prefect_server, "prepared_server", prepared)
    monkeypatch.setattr(prefect_server, "use", use)
    monkeypatch.setattr(cli, "preflight_checks", preflight_checks)
    monkeypatch.setattr(cli, "open_store_and_run", lambda ctx: order.append("store and run folder opened"))
    return order


def flow_stub(order: list[str], summary: dict):
    def run(**kwargs):
        order.append("flow called")
        return summary

    return run


def test_the_experiment_command_serves_prefect_after_its_preflight_and_runs_its_flow_on_it(
    isolated_workdir, demo_csv, recorded_order, monkeypatch, tmp_path
):
    from dpsynth.flows import experiment

    summary = {"experiment_id": "x", "selection_runs": 0, "run_dir": "r"}
    monkeypatch.setattr(experiment, "experiment_for_profile", flow_stub(recorded_order, summary))
    profile = publishing_smoke(tmp_path / "profiles")
    assert cli.main(["experiment", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", profile]) == 0
    assert recorded_order == [
        "server prepared",
        "preflight passed",
        "server serves",
        "store and run folder opened",
        "flow uses the server",
        "flow called",
    ]


def test_the_python_api_serves_prefect_after_its_preflight_and_runs_its_flow_on_it(
    isolated_workdir, demo_csv, recorded_order, monkeypatch, tmp_path
):
    import dpsynth.api.release as api
    from dpsynth.flows import release

    monkeypatch.setattr(release, "release", flow_stub(recorded_order, {}))
    monkeypatch.setattr(api, "_release_of", lambda ctx, summary: SimpleNamespace(ctx=ctx))
    api.release(str(demo_csv), CARDIO_SCHEMA, publishing_smoke(tmp_path / "profiles"), publish=False)
    assert recorded_order == [
        "server prepared",
        "preflight passed",
        "server serves",
        "store and run folder opened",
        "flow uses the server",
        "flow called",
    ]


def test_a_run_already_finished_stops_its_prepared_server_unused(monkeypatch, recorded_order):
    monkeypatch.setattr(cli, "preflight_checks", lambda args, kind: SimpleNamespace())
    monkeypatch.setattr("dpsynth.tasks.context.finished_summary", lambda ctx: {"reused": True})
    ctx, server = cli.preflight(SimpleNamespace(), "release")
    assert server is None and recorded_order == ["server prepared", "server stopped"]
