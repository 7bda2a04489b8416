"""What a flow command does before its first stage, in order (flows/cli.py `preflight`,
flows/prefect_server.py): every refusal before any Prefect server serves, and without loading torch,
Prefect or MLflow; then the server, then the MLflow store and the run folder, then the flow."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from dpsynth.flows import cli, prefect_server, stages
from tests.conftest import CARDIO_SCHEMA, ROOT, publishing_smoke

# Runs the command line in a fresh process (so that its imports are its own), with no Prefect API
# configured (so that the command prepares its own server), and reports what it loaded and what became of
# the server process it prepared.
# Counts the cycle collections that run while a module of the given packages executes its top level (is
# being imported): flows/import_pause.py pauses the collector there.
COLLECTIONS_PROBE = """
import gc, sys
collections_in_imports = []
def _count(phase, info, packages={packages!r}):
    frame = sys._getframe().f_back
    while phase == "start" and frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__", "").split(".")[0] in packages:
            collections_in_imports.append(frame.f_globals["__name__"])
            return
        frame = frame.f_back
gc.callbacks.append(_count)
"""

REFUSAL_PROBE = (
    COLLECTIONS_PROBE.format(packages=("great_expectations", "scipy"))
    + """
import json, sys
from dpsynth.flows import cli, prefect_server
code = cli.main(sys.argv[1:])
servers = [{"serving": s.serving, "ended": s.process is None} for s in getattr(prefect_server, "_process_server", [])]
loaded = sorted(m for m in ("torch", "prefect", "mlflow", "sklearn") if m in sys.modules)
gx = "great_expectations" in sys.modules
print(json.dumps({"code": code, "loaded": loaded, "servers": servers, "great_expectations": gx,
                  "collections_in_imports": len(collections_in_imports)}))
"""
)


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
    "command, refusal, code, reads_table",
    [
        # The lifetime budget: the accountant plans the release's cost (no torch needed for that).
        ("release", {"privacy": {"lifetime_budget": 0.001}}, 5, True),
        # The table fails its schema: `experiment` used to load its flow (Prefect, torch) before this.
        ("experiment", None, 4, True),
        # The profile's own budget, checked before the table is read.
        ("release", {"privacy": {"epsilon_budget": 0.01}}, 5, False),
    ],
)
def test_a_refusal_loads_no_torch_prefect_mlflow_or_scikit_learn_and_its_server_never_serves(
    tmp_path, demo_csv, command, refusal, code, reads_table
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
    # Refused before its table is read, a command loads no Great Expectations (seconds to import).
    assert result["great_expectations"] is reads_table
    # Great Expectations and the accountant's SciPy load with the cycle collector paused (a fifth of their
    # CPU seconds otherwise went to scanning their new objects again and again).
    assert result["collections_in_imports"] == 0


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
        if "server prepared" not in order:  # as `prepared_server`: a second call gets the process's server
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


@pytest.mark.parametrize(
    "argv, prepared",
    [
        (["release", "--config", "c.yaml", "--data", "d.csv"], True),
        (["--home", "h", "experiment", "--config", "c.yaml", "--data", "d.csv"], True),
        (["--home", "release", "validate", "--config", "c.yaml", "--data", "d.csv"], False),  # a home named release
        (["experiment", "--config", "c.yaml", "--data", "d.csv", "--dry-run"], False),
        (["ledger", "--config", "c.yaml"], False),
    ],
)
def test_a_flow_command_prepares_its_server_before_its_arguments_are_parsed(
    recorded_order, monkeypatch, tmp_path, argv, prepared
):
    """The server's process loads Prefect's server code from the command's first moment, not after the
    parser (and what its choices import) has run; a command that runs no flow prepares none."""
    parser = cli.build_parser

    def build_parser():
        recorded_order.append("arguments parsed")
        return parser()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "build_parser", build_parser)
    for name in ("cmd_release", "cmd_experiment", "cmd_validate", "cmd_ledger"):
        monkeypatch.setattr(cli, name, lambda args: recorded_order.append("command ran"))
    assert cli.main(argv) == 0
    expected = ["arguments parsed", "command ran"]
    assert recorded_order == (["server prepared", *expected] if prepared else expected)


def test_a_run_already_finished_stops_its_prepared_server_unused(monkeypatch, recorded_order):
    monkeypatch.setattr(cli, "preflight_checks", lambda args, kind: SimpleNamespace())
    monkeypatch.setattr("dpsynth.tasks.context.finished_summary", lambda ctx: {"reused": True})
    ctx, server = cli.preflight(SimpleNamespace(), "release")
    assert server is None and recorded_order == ["server prepared", "server stopped"]


# What loading the release flow imports, in a fresh process; then the stage tasks it makes on first use.
FLOW_LOAD_PROBE = """
import json, sys
from dpsynth.flows import release, stages
loaded = sorted(m for m in ("torch", "sklearn", "matplotlib", "mlflow", "opacus") if m in sys.modules)
tasks = {name: getattr(stages, name).name for name in stages.STAGE_FUNCTIONS}
print(json.dumps({"loaded": loaded, "tasks": tasks, "after": "torch" in sys.modules}))
"""


def test_loading_the_release_flow_loads_no_torch_scikit_learn_matplotlib_or_mlflow():
    """Its first stage (validate) needs none of them: each later stage imports its own module as it starts,
    and MLflow loads in the background (bench/startup.py measures the seconds this saves)."""
    proc = subprocess.run([sys.executable, "-c", FLOW_LOAD_PROBE], capture_output=True, text=True, cwd=ROOT, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    # Every stage task is made on first use, with its Prefect task name; training's module brings torch.
    assert result["tasks"]["validate_table"] == "validate" and result["tasks"]["train_generator"] == "train-generator"
    assert set(result["tasks"]) == set(stages.STAGE_FUNCTIONS) and result["after"] is True


STORE_PROBE = """
import json, os, sys
from types import SimpleNamespace
import dpsynth.tasks.context
from dpsynth.flows import cli
opened = []
dpsynth.tasks.context.open_run = lambda ctx: opened.append(ctx.kind)
cli.open_store_and_run(SimpleNamespace(kind=sys.argv[1]))
print(json.dumps({"mlflow": "mlflow" in sys.modules, "opened": opened}))
"""


@pytest.mark.parametrize(
    "kind, named_store, asked",
    [
        ("release", False, False),  # the home's own store: made by the flow, alongside its first stages
        ("release", True, True),  # a store the user named may be down: asked before any work
        ("experiment", False, True),
    ],
)
def test_only_a_release_in_the_homes_own_store_leaves_the_store_to_its_flow(tmp_path, kind, named_store, asked):
    env = {**os.environ, "DPSYNTH_HOME": str(tmp_path / "home")}
    env.pop("MLFLOW_TRACKING_URI", None)
    if named_store:
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'named.db'}"
    proc = subprocess.run(
        [sys.executable, "-c", STORE_PROBE, kind], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"mlflow": asked, "opened": [kind]}
    created = (tmp_path / "named.db") if named_store else (tmp_path / "home" / "mlflow.db")
    assert created.exists() is asked


def test_the_mlflow_run_opens_alongside_the_first_stages_and_a_store_failure_stops_before_training(
    isolated_workdir, demo_csv, capfd, monkeypatch
):
    from mlflow.exceptions import MlflowException

    from dpsynth.tasks import tracking
    from dpsynth.tasks.ledger import entries as ledger_entries

    validating = threading.Event()
    real_stage = stages.stage

    @contextlib.contextmanager
    def stage(label):
        if label == "validate":
            validating.set()
        with real_stage(label):
            yield

    waited: list[bool] = []

    def start_run(*args, **kwargs):
        # Run before the first stage (in the flow's own thread), this would wait in vain.
        waited.append(validating.wait(timeout=60))
        raise MlflowException("API request to http://tracking:5000 failed: connection refused")

    monkeypatch.setattr(stages, "stage", stage)
    monkeypatch.setattr(tracking, "start_run", start_run)
    profile = publishing_smoke(demo_csv.parent / "profiles")
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", profile]
    assert cli.main(argv) == 7
    err = capfd.readouterr().err
    assert waited == [True]
    assert "tracking store failed" in err and "connection refused" in err and "Traceback" not in err
    (run,) = (isolated_workdir / "runs" / "release").iterdir()
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    assert not list(run.glob("train-*")) and not (run / "bundle").exists() and ledger_entries("cardio") == []


def test_the_prepared_server_builds_prefects_app_before_it_is_told_to_serve(monkeypatch):
    """Building the app (routes, middleware; no database) happens while the preflight runs, not after."""
    import io

    import prefect.server.api.server

    built: list[str] = []
    monkeypatch.setattr(prefect.server.api.server, "create_app", lambda *a, **k: built.append("app"))
    monkeypatch.setattr(prefect_server, "load_serving_code", lambda: built.append("serving code"))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # the command was refused: told nothing
    prefect_server.serve_when_told()
    assert built == ["app", "serving code"]


def test_the_prepared_server_serves_the_app_it_built(monkeypatch):
    """uvicorn gets the app built while the preflight ran, not Prefect's factory to call again (which sets
    up logging and hashes every setting before finding the same app in its cache)."""
    import io

    import prefect.server.api.server
    import uvicorn

    app = object()
    built: list[str] = []
    served: list[tuple] = []

    def create_app(*args, **kwargs):
        built.append("app")
        return app

    monkeypatch.setattr(prefect.server.api.server, "create_app", create_app)
    monkeypatch.setattr(prefect_server, "load_serving_code", lambda: built.append("serving code"))
    monkeypatch.setattr(uvicorn, "run", lambda served_app, **kwargs: served.append((served_app, kwargs["port"])))
    monkeypatch.setattr(sys, "stdin", io.StringIO("4242\n"))  # the preflight passed: told a port
    prefect_server.serve_when_told()
    assert built == ["app", "serving code"] and served == [(app, 4242)]


# The prepared server's process, told nothing (a refusal): what it had loaded, and whether a database exists.
PREPARED_PROBE = (
    COLLECTIONS_PROBE.format(packages=("prefect", "uvicorn", "fastapi", "sqlalchemy"))
    + """
import io, json, sys
from dpsynth.flows import prefect_server
sys.stdin = io.StringIO("")
prefect_server.serve_when_told()
wanted = ("alembic.command", "aiosqlite", "prefect_dask", "uvicorn.protocols.http.auto", "uvicorn.lifespan.on")
print(json.dumps({"loaded": sorted(m for m in wanted if m in sys.modules), "collections": len(collections_in_imports)}))
"""
)


def test_the_prepared_server_loads_what_serving_imports_and_opens_no_database(tmp_path):
    """The modules the app's start imports (migrations, block registration, Prefect's collections) and
    uvicorn's protocols load before the command tells the server to serve: serving, after the preflight,
    is left its database work (bench/startup.py); a refusal still leaves no Prefect database."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), **prefect_server.SERVER_ENVIRONMENT}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [sys.executable, "-c", PREPARED_PROBE], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == [
        "aiosqlite",
        "alembic.command",
        "prefect_dask",
        "uvicorn.lifespan.on",
        "uvicorn.protocols.http.auto",
    ]
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()
    # Prefect's server code loads with the cycle collector paused (flows/import_pause.py).
    assert result["collections"] == 0


def test_collection_is_paused_for_the_block_and_what_it_loaded_is_frozen():
    import gc

    from dpsynth.flows.import_pause import collection_paused

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with collection_paused():
            assert not gc.isenabled()
            kept = [[object()] for _ in range(100)]
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(kept)
        gc.disable()  # a caller's own choice is kept
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
