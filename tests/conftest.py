"""Shared fixtures: generated (never real) tables, isolated MLflow stores and working folders."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.tier_listing import WHOLE_SUITE_TIERS, tier_of

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores (addopts' -n 2): torch, OpenMP and BLAS on one thread each, set before any of
    # them loads (and inherited by the processes a test starts), so the workers do not fight over the cores.
    for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_threads, "1")


def _temporary_files_in_memory(shm: Path = Path("/dev/shm"), min_free: int = 4 * 1024**3) -> None:
    """Temporary files (pytest's tmp_path, Prefect's test database, every temporary folder of the processes a
    test starts) in a memory-backed folder when the machine has one with room, unless TMPDIR names another.
    The SQLite stores a release writes (MLflow's, Prefect's, the ledger) commit with fsync, and on a disk each
    commit waits: a fresh MLflow store's migrations alone wait about 4 s on this machine's disk, next to
    nothing in memory. No test's claim depends on the disk (the full-disk faults are simulated)."""
    if "TMPDIR" in os.environ or not shm.is_dir() or not os.access(shm, os.W_OK):
        return
    if shutil.disk_usage(shm).free < min_free:
        return
    folder = shm / f"dpsynth-tests-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid():  # a folder someone else made: not ours to write in
        return
    os.environ["TMPDIR"] = str(folder)  # inherited by the xdist workers and every process a test starts
    tempfile.tempdir = str(folder)  # this process may have read TMPDIR already (pytest's capture files)


_temporary_files_in_memory()


JAX_CACHE_OWNER = "DPSYNTH_TESTS_JAX_CACHE_OWNER"  # the id of the process that made the session's jax cache


def _one_jax_compilation_cache_per_session() -> None:
    """One fresh jax compilation cache for the session (models/generators/graphical/jax_runtime.py), made by the
    first process (pytest, or the xdist controller) and named in the environment that the workers and every
    process a test starts inherit. Each MST or AIM fit, in a worker or in a release's process, compiled jax's
    programs anew (a stage's end drops them): the generator checks of MST and AIM alone took 35 CPU seconds,
    27 with the cache empty at their start, 21 with it full. With the cache a fit compiles only what no fit
    before it in the session compiled; the programs are the same, so are the results. Every program is kept
    (minimum compile time 0); a size limit makes jax lock the folder while it reads or writes an entry (the two
    workers, and the processes they start, share it)."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:  # a worker (the controller named it), or the caller's own
        return
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="dpsynth-tests-jax-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(1024**3)
    os.environ[JAX_CACHE_OWNER] = str(os.getpid())


_one_jax_compilation_cache_per_session()


BYTECODE_WRITTEN = "DPSYNTH_TESTS_BYTECODE_WRITTEN"


def _project_bytecode_written_once() -> None:
    """The project's own modules compiled to bytecode (their `__pycache__`, git-ignored) once, by the session's
    first process, even where PYTHONDONTWRITEBYTECODE is set (this machine sets it). With it set and no bytecode
    written, every process the suite starts (releases, kills, probes, a federation's ClientApps, Dask and pool
    workers: hundreds) compiled the 100-odd dpsynth modules it imports from source, about 0.2 CPU s each time;
    the installed packages' bytecode was written at install. Python checks each file against its source's
    modification time and size, so an edited module is compiled anew as usual."""
    if os.environ.get(BYTECODE_WRITTEN):
        return
    import compileall

    root = Path(__file__).resolve().parents[1]
    for folder in ("dpsynth", "models", "tasks", "flows", "tests", "bench"):
        if (root / folder).is_dir():
            compileall.compile_dir(root / folder, quiet=2)
    os.environ[BYTECODE_WRITTEN] = "1"  # the workers inherit it: done


_project_bytecode_written_once()


def pytest_unconfigure(config):
    """The process that made the session's jax compilation cache removes it at the end."""
    if os.environ.get(JAX_CACHE_OWNER) == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


ROOT = Path(__file__).resolve().parents[1]
CARDIO_SCHEMA = ROOT / "configs" / "cardio.yaml"
REAL_CARDIO = ROOT.parent / "shared" / "data" / "cardio_train.csv"
# Tests pass the privacy secret explicitly, for determinism; a release always draws its own.
TEST_SECRET_HEX = "5e" * 32
SMOKE_PROFILE = ROOT / "configs" / "profiles" / "smoke.yaml"
# The shipped smoke profile is a trial (it publishes nothing). Tests of publication use the same profile
# as a release that publishes, with a lifetime budget (privacy.lifetime_budget) no test reaches.
SMOKE_LIFETIME_BUDGET = 1.0e6


def publishing_smoke(folder: Path, **sections) -> str:
    """The shipped smoke profile as a publishing release profile (`trial: false`, a lifetime budget),
    with `sections` (top-level keys, mappings merged one level deep) over it, written as `folder/smoke.yaml`
    (a profile that `extends: smoke` beside it starts from it). Returns the path, for --profile."""
    profile = yaml.safe_load(SMOKE_PROFILE.read_text())
    profile["trial"] = False
    profile.setdefault("privacy", {})["lifetime_budget"] = SMOKE_LIFETIME_BUDGET
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(profile.get(key), dict):
            profile[key] = {**profile[key], **value}
        else:
            profile[key] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "smoke.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return str(path)


@pytest.fixture(scope="session")
def test_secret():
    from dpsynth.models.privacy.secret import PrivacySecret

    return PrivacySecret.from_hex(TEST_SECRET_HEX)


@pytest.fixture(scope="session")
def cardio_schema():
    from dpsynth.models.data.schema import DatasetSchema

    return DatasetSchema.from_yaml(CARDIO_SCHEMA)


@pytest.fixture(scope="session")
def demo_frame(cardio_schema):
    from dpsynth.models.data.demo import make_demo_table

    return make_demo_table(cardio_schema, 3000, seed=1)


@pytest.fixture
def demo_csv(tmp_path, demo_frame, cardio_schema):
    path = tmp_path / "demo.csv"
    demo_frame.to_csv(path, sep=cardio_schema.separator, index=False)
    return path


@pytest.fixture
def smoke_release(tmp_path) -> str:
    """A publishing smoke profile (see `publishing_smoke`), as a --profile path."""
    return publishing_smoke(tmp_path / "publishing")


@pytest.fixture(scope="session")
def prefect_backend():
    """One temporary Prefect API (SQLite) for the session's releases (every flow test's, tests/flows/conftest.py,
    and tests/test_api.py's), started and stopped inside the session: a worker starts it once, not once per
    module that releases (seconds each start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    """Every test gets its own dpsynth home (ledger, stores, run folders): none touches ~/.dpsynth."""
    home = tmp_path / "dpsynth-home"
    monkeypatch.setenv("DPSYNTH_HOME", str(home))
    monkeypatch.delenv("DPSYNTH_LEDGER", raising=False)
    return home


@pytest.fixture(scope="session")
def empty_mlflow_store(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store at MLflow's latest schema, made once per session (per worker) by MLflow itself,
    as a release's first use makes one: `isolated_workdir` starts each test from a copy. Making a store runs every
    one of MLflow's schema migrations, about 2.4 CPU seconds in a warm process (3.8 in a new one), once per test
    that releases. The claims about a store's making use homes without one: test_startup_order.py's, the session's
    smoke trial's, and the two releases at once of test_faults.py that race to make it."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    folder = tmp_path_factory.mktemp("empty-mlflow-store")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    # MLflow's default experiment (unused: dpsynth logs to experiments of its own) keeps its artifacts here.
    for store in (TrackingStore(uri, str(folder / "mlruns")), RegistryStore(uri)):
        store.engine.dispose()  # every connection closed: the file is complete
    assert {p.name for p in folder.iterdir()} <= {"mlflow.db", "mlruns"}  # no journal left beside it
    return folder / "mlflow.db"


@pytest.fixture
def isolated_workdir(tmp_path, monkeypatch, empty_mlflow_store):
    """Run in an empty folder that is also the home, with its own MLflow stores, each a copy of
    `empty_mlflow_store`: the internal one, group- and world-readable as a store another tool made (what dpsynth
    must make owner-only itself), and the registry (`<home>/registry/registry.db`, tasks/registry.py), owner-only
    as a release under dpsynth's umask makes it. The registry's copy spares each publishing test MLflow's schema
    migrations (1.7 CPU seconds in a warm process); the tests of a store's making remove it."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(empty_mlflow_store, work / "mlflow.db")
    os.chmod(work / "mlflow.db", 0o644)
    (work / "registry").mkdir(mode=0o700)
    shutil.copyfile(empty_mlflow_store, work / "registry" / "registry.db")
    os.chmod(work / "registry" / "registry.db", 0o600)
    monkeypatch.chdir(work)
    monkeypatch.setenv("DPSYNTH_HOME", str(work))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    return work


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test (tiny models, where thread hand-offs cost more than they save)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The tiers (README, "Run the tests"). `python -m pytest` runs everything, CI's suite. `-m fast`, the tier for
# development (at most 3 minutes on 2 cores), still runs every stage once: one smoke trial, shared by the tests that
# read its run folder (`smoke_trial`, tests/flows/conftest.py), and the generator checks of the default generator
# and of the toy generator (tests/flows/test_toy_generator.py). Everything else is `slow`: the flows (every test
# under tests/flows/ is also `flow`) but those named in FAST_FLOWS, the other generators' checks, and the tests in
# SLOW_TESTS, which take seconds each on 2 cores (reduced privacy audits, trainings, subprocess loads).
FAST_FLOWS = (
    "tests/flows/test_bad_config_catalogue.py",  # refusals before any flow runs
    "tests/flows/test_cli.py",
    "tests/flows/test_console.py",
    "tests/flows/test_experiment_runner.py",
    "tests/flows/test_trial_release.py::test_the_sessions_smoke_trial_ran_every_stage_and_published_nothing",
    "tests/flows/test_toy_generator.py::test_the_toy_is_registered_by_its_entry_point_only",
    "tests/flows/test_toy_generator.py::test_without_its_distribution_the_toy_is_gone",
    "tests/flows/test_toy_generator.py::test_the_toy_passes_the_generator_conformance_checks",
)
SLOW_TESTS = (
    "tests/models/test_audit.py::test_reduced_step_audit_refutes_the_old_accounting_and_not_the_current_one",
    "tests/models/test_audit.py::test_reduced_calibration_audit_has_power_and_refutes_half_the_noise",
    "tests/models/test_audit.py::test_reduced_generator_calibration_audit_has_power_and_refutes_half_the_noise",
    "tests/models/test_audit.py::test_the_release_audit_runs_end_to_end_at_a_tiny_size",
    "tests/models/test_audit.py::test_critic_draws_are_uniform_and_independent_across_rows_steps_and_a_resume",
    "tests/models/test_mechanism.py::test_sanitised_rows_are_the_gaussian_mechanism_claimed",
    "tests/models/test_release_marginals.py::test_zero_noise_is_refused_and_negligible_noise_costs_next_to_nothing",
    "tests/tasks/test_registry.py::test_registered_model_loads_in_a_fresh_process_without_dpsynth",
    # 20 s or more each where they were measured, on the 2 cores beside four other sessions' work (load 15-30).
    "tests/models/test_aim.py",  # jax compiles and fits of the other generators
    "tests/models/test_mst.py",
    "tests/models/test_marginal_shapes.py::test_a_heaped_value_survives_msts_sampling",
    "tests/models/test_mechanism.py::test_accountant_bounds_the_exact_per_row_loss_over_several_steps",
    "tests/models/test_audit.py::test_the_draw_tests_reject_repeated_rows_a_restarted_stream_and_a_restart_on_resume",
    "tests/models/test_audit.py::test_calibration_audit_catches_clipping_each_parameter_on_its_own",
    "tests/models/test_dpcgan.py::test_training_learns_the_planted_label_dependency",
    "tests/models/test_config_validation.py::test_any_value_at_any_profile_key_is_a_profile_or_a_config_error",
    "tests/models/test_fidelity.py::test_sdmetrics_quality_reads_a_deterministic_subsample_beyond_its_cap",
    "tests/models/test_gswgan.py::test_tiny_multi_critic_run_produces_both_target_classes_and_learns_the_label",
    "tests/models/test_gswgan.py::test_resume_after_interruption_equals_uninterrupted_run",
    "tests/models/test_native_kernels.py::test_the_library_is_built_once_per_cache",
    "tests/models/test_native_kernels.py::test_an_unusable_cache_folder_builds_in_a_private_temporary_one",
    "tests/models/test_demo.py::test_heaped_shape_heaps_one_narrow_column_rounds_ages_and_gives_the_weight_a_tail_rising_with_age",
    "tests/tasks/test_registry.py::test_models_package_imports_mlflow_only_in_pyfunc",  # fresh processes
    "tests/models/test_release_marginals.py::test_calibrated_sampling_imports_no_accountant",
    "tests/tasks/test_ledger.py::test_two_releases_entering_at_once_are_both_counted",
    "tests/tasks/test_table_properties.py::test_a_table_is_refused_with_a_readable_error_or_preprocessed_into_the_unit_range",
    "tests/tasks/test_bundle_files.py::test_the_summary_is_drawn_from_the_synthetic_rows_it_is_given_only",
    "tests/tasks/test_bundle.py::test_rewriting_replaces_the_bundle_and_refuses_other_rows",
    "tests/tasks/test_registry.py::test_over_budget_release_is_refused_and_champion_stays",
    "tests/tasks/test_report.py::test_the_untrained_checkpoint_is_labelled_wherever_it_shows",
    "tests/tasks/test_report.py::test_no_warning_without_a_vanished_level",
    "tests/test_api.py::test_pyfunc_seed_is_optional_and_a_given_seed_keeps_its_rows",
)
CONFORMANCE = "tests/models/test_generator_conformance.py"


# The scheduling units (below) that take longest: seconds on one worker in a run of the whole suite on 2 workers
# (`--durations=0`, setup and teardown included, commit 8c659ee; the machine shared, load 10-20, about 3x a quiet
# run's). They go out first, longest first (LPT), so the units left for the end are short and both workers end
# together; the units not listed follow, in collection order. Rough figures do: the order moves idle time only.
LONGEST_UNITS = {
    "tests/flows/test_faults.py": 679,
    "tests/models/test_audit.py": 473,
    "tests/flows/test_experiment_flow.py": 393,
    "tests/flows/test_dpfedctgan_release.py": 315,
    "tests/flows/test_scale_bench.py": 292,
    "tests/flows/test_startup_order.py": 232,
    "tests/flows/test_deployment.py": 229,
    "tests/test_api.py": 209,
    "tests/flows/test_wide_release.py": 202,
    "tests/flows/test_trial_release.py": 191,
    "tests/flows/test_release_flow.py": 183,
    f"{CONFORMANCE}::dpfedctgan": 172,  # 278 before its fits ran side by side (x0.62, measured alone, loaded)
    "tests/flows/test_generators_release.py": 157,
}


def scheduling_unit(nodeid: str) -> str:
    """The unit of work a worker takes whole (addopts' `--dist loadscope`): the test's module (or class), its
    module-scoped fixtures made once; the generator checks split further, one unit per generator (its checks share
    one training, the module-scoped `trained`): one module of every generator's trainings would keep one worker
    busy alone."""
    scope = nodeid.rsplit("::", 1)[0]
    if scope == CONFORMANCE and nodeid.endswith("]"):  # test_generator_check[CHECK-GENERATOR]
        return f"{scope}::{nodeid[:-1].rsplit('-', 1)[1]}"
    return scope


def longest_first(units: list[str]) -> list[str]:
    """`units` (in collection order) in the order they are handed out: LONGEST_UNITS' longest first, then the rest
    in collection order (tests/flows/ first: few tests, each a release or more; the many short tests last)."""
    return sorted(units, key=lambda unit: -LONGEST_UNITS.get(unit, 0))  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook (absent under -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """addopts' `--dist loadscope --no-loadscope-reorder`: each `scheduling_unit` goes to one worker whole, the
    units in the order `longest_first` gives (xdist's default order, the units with the most tests first, would
    hand the releases out last)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            # The queue is built in collection order (--no-loadscope-reorder) just before the first unit goes out.
            if not getattr(self, "_ordered", False):
                for unit in longest_first(list(self.workqueue)):
                    self.workqueue.move_to_end(unit)
                self._ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


def _in_tier(path: str, name: str, listed: tuple[str, ...]) -> bool:
    return path in listed or f"{path}::{name.split('[')[0]}" in listed


def _is_slow(item, path: str) -> bool:
    if item.get_closest_marker("slow") is not None or _in_tier(path, item.name, SLOW_TESTS):
        return True
    if item.get_closest_marker("flow") is not None:  # a release outside tests/flows/ (test_api.py) too
        return not _in_tier(path, item.name, FAST_FLOWS)
    if path == CONFORMANCE:
        from dpsynth.models.generator_registry import DEFAULT_GENERATOR

        return item.callspec.params["trained"] != DEFAULT_GENERATOR
    return False


def _collects_the_whole_suite(config) -> bool:
    """No paths given (the testpaths: the whole suite) and nothing that leaves a test module uncollected. Tests
    deselected (-k, -m, --deselect, --last-failed) are deselected after the tiers are given (the hook below)."""
    return (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not config.getoption("ignore")
        and not config.getoption("ignore_glob")
        and not config.getoption("lf", False)
        and not config.getoption("continue_on_collection_errors")
    )


def pytest_collection_modifyitems(config, items):
    tiers = {}
    for item in items:
        path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
        if path.startswith("tests/flows/"):
            item.add_marker(pytest.mark.flow)
        item.add_marker(pytest.mark.slow if _is_slow(item, path) else pytest.mark.fast)
        tiers[item.nodeid] = tier_of(item)
    if _collects_the_whole_suite(config):
        config.stash[WHOLE_SUITE_TIERS] = tiers
