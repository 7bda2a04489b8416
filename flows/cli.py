"""The `dpsynth` command line: parses arguments, runs a flow or a small command, and is the one place
where user-caused errors become a readable paragraph and a non-zero exit status (no traceback)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from dpsynth.models.defaults import DEFAULT_RELEASE_PROFILE
from dpsynth.models.errors import DpsynthError, StorageError

DEFAULT_CONFIG = "configs/cardio.yaml"
# A published epsilon above this draws a warning: at that level differential privacy promises little.
HIGH_EPSILON = 10.0


def dpsynth_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dpsynth")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    # The registered generators' names: the registry imports only their packages' light `__init__.py`.
    from dpsynth.models.generator_registry import names

    generators = names()
    parser = argparse.ArgumentParser(prog="dpsynth", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--version", action="version", version=f"dpsynth {dpsynth_version()}", help="print dpsynth's version and exit"
    )
    parser.add_argument(
        "--home",
        default=None,
        metavar="DIR",
        help="the installation's home: privacy ledger, internal store, registry store, run folders "
        "(default: $DPSYNTH_HOME, else ~/.dpsynth)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check a table against its schema's expectation suite")
    p.add_argument("--config", required=True, help="dataset schema YAML (e.g. configs/cardio.yaml)")
    p.add_argument("--data", required=True, help="CSV or Parquet table")
    p.add_argument("--json", action="store_true", help="print the public summary as JSON on the last line")

    for name, default_profile, text in (
        ("release", DEFAULT_RELEASE_PROFILE, "train, evaluate and release one setting"),
        ("experiment", "thesis", "run the thesis grid of settings"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True, help="dataset schema YAML (e.g. configs/cardio.yaml)")
        p.add_argument("--data", required=True, help="the table: CSV or Parquet")
        p.add_argument(
            "--profile",
            default=default_profile,
            help=f"profile name under configs/profiles/ or a YAML path (default: {default_profile}; "
            "`dpsynth profiles` lists them)",
        )
        p.add_argument("--out", default=None, help="run folder (default <home>/runs/<kind>/<run id>)")
        p.add_argument(
            "--json",
            action="store_true",
            help="print the summary as JSON on the last line; no progress (warnings still on stderr)",
        )
        p.add_argument("--verbose", action="store_true", help="also show Prefect's, MLflow's and other libraries' logs")
        p.add_argument(
            "--generator",
            choices=generators,
            default=None,
            help="train every setting with this generator (default: the profile's `generator`)",
        )
        if name == "release":
            p.add_argument(
                "--no-publish",
                action="store_true",
                help="a trial: run every stage (training, selection, the DP choice, the internal "
                "report) and publish nothing: no registration, bundle, alias or ledger entry",
            )
            p.add_argument(
                "--cluster",
                default=None,
                metavar="ADDRESS",
                help="count a marginal generator's (MST, AIM) training rows, or pretrain GS-WGAN's critics, on "
                "this Dask scheduler's workers (e.g. tcp://10.0.0.5:8786; for the counting they read the run "
                "folder's Parquet from shared storage); the same result as here: the secret, the partition, the "
                "noise and the ledger stay on this machine",
            )
            p.add_argument(
                "--allow-same-input",
                action="store_true",
                help="release even if the input file is byte for byte the one the table's last "
                "release read (refused otherwise: the same rows again, budget spent again)",
            )
        if name == "experiment":
            p.add_argument("--dry-run", action="store_true", help="print the plan without running it")

    p = sub.add_parser(
        "epsilon",
        help="epsilon a profile's settings will spend (any generator), or of GS-WGAN training from its parameters",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="plan this profile's settings: training epsilon and the whole release's, per setting",
    )
    p.add_argument("--config", default=DEFAULT_CONFIG, help="the schema the profile sits beside")
    p.add_argument(
        "--generator", choices=generators, default=None, help="plan every setting with this generator (with --profile)"
    )
    p.add_argument("--discriminators", type=int, default=None, help="GS-WGAN's K (without --profile)")
    p.add_argument("--iterations", type=int, default=None, help="GS-WGAN's training iterations T (without --profile)")
    p.add_argument("--batch-size", type=int, default=32, help="B, generated rows per step (default 32)")
    p.add_argument("--noise-multiplier", type=float, default=1.07, help="sigma (default 1.07)")
    p.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    p.add_argument(
        "--critic-draw",
        choices=("per-row", "per-step"),
        default="per-row",
        help="per-row: each sanitised row draws its own critic (dpsynth); per-step: one critic for "
        "all B rows of a step (the thesis' Algorithm 2)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on the last line")

    p = sub.add_parser("ledger", help="a table's releases and the privacy budget they spent together")
    p.add_argument("--config", required=True, help="dataset schema YAML: the table is its schema name")
    p.add_argument(
        "--profile", default=None, help="take privacy.lifetime_budget from this profile (default: the latest release's)"
    )
    p.add_argument(
        "--forecast",
        type=int,
        default=None,
        metavar="N",
        help="N more releases of --profile (default: the table's last release's profile): for each, 'fits' "
        "or 'refused: RULE' by the rules release applies, and the lifetime spending after it",
    )
    p.add_argument("--json", action="store_true", help="print the ledger as JSON on the last line")

    p = sub.add_parser(
        "profiles", help="the shipped profiles and a schema's own: what each suits, generator, budgets, trial"
    )
    p.add_argument(
        "--config", default=None, help="also list this schema's own profiles (profiles/ beside it), which come first"
    )
    p.add_argument("--json", action="store_true", help="print the list as JSON on the last line")

    p = sub.add_parser("sample", help="sample rows from a registered generator")
    p.add_argument("--model-uri", required=True, help="e.g. models:/cardio-gswgan@champion")
    p.add_argument("--rows", type=int, required=True, help="how many synthetic rows to write")
    p.add_argument("--out", required=True, help="output .parquet or .csv")
    p.add_argument(
        "--seed", type=int, default=None, help="sampling seed: the same rows for the same seed (default: fresh rows)"
    )

    p = sub.add_parser("schema", help="draft a table's schema from its column names and types, or check one")
    schema_commands = p.add_subparsers(dest="schema_command", required=True)
    q = schema_commands.add_parser(
        "draft", help="write a schema from the table's column names and types, every value to fill marked"
    )
    q.add_argument("data", help="the table (CSV or Parquet): only its column names and types are read")
    q.add_argument("--out", required=True, help="the schema YAML to write (an existing file only with --force)")
    q.add_argument("--name", default=None, help="the table's name (default: the data file's name)")
    q.add_argument("--target", default=None, help="the binary column to predict (default: a placeholder)")
    q.add_argument("--id-column", default=None, help="a column that identifies rows: left out of training")
    q.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    q = schema_commands.add_parser(
        "check", help="what a schema still lacks (exit 2 while anything is) or which rule it breaks"
    )
    q.add_argument("schema", help="the schema YAML (e.g. one `dpsynth schema draft` wrote)")
    q.add_argument("--json", action="store_true", help="print the result as JSON on the last line")

    p = sub.add_parser("demo-data", help="write a schema-conformant table made by code (no real rows)")
    p.add_argument("--rows", type=int, required=True, help="how many rows to generate")
    p.add_argument(
        "--out", required=True, help="output .csv or .parquet; <out>.demo.json beside it marks it as a demo table"
    )
    p.add_argument(
        "--config", default=None, help="dataset schema YAML (default: configs/cardio.yaml in the working folder)"
    )
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument(
        "--shape",
        choices=("plain", "hard", "measured", "heaped"),
        default="plain",
        help="hard: most values at 0 in columns bounded below by 0, long-tailed level shares, a "
        "25/75 target that depends on them (dpsynth.models.data.demo.DemoShape); measured: a balanced "
        "target resting on one narrow measurement recorded at round numbers (MeasuredShape); heaped: half "
        "of a narrow column at one round value, ages heaped at 0 and 5, a long-tailed survey weight rising "
        "with age (HeapedShape)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    from dpsynth.tasks.private_files import owner_only

    owner_only()  # before any process starts: the server's files too are the owner's only
    argv = sys.argv[1:] if argv is None else argv
    if runs_a_flow(argv):
        # Prefect's server code takes seconds to load: its process starts now, before the arguments are
        # parsed (`preflight` takes it up); a command ending without a flow (a usage error, a refusal)
        # ends it having served nothing (flows/prefect_server.py).
        from dpsynth.flows import prefect_server

        prefect_server.prepared_server()
    args = build_parser().parse_args(argv)
    handler = {
        "validate": cmd_validate,
        "release": cmd_release,
        "experiment": cmd_experiment,
        "epsilon": cmd_epsilon,
        "ledger": cmd_ledger,
        "profiles": cmd_profiles,
        "sample": cmd_sample,
        "demo-data": cmd_demo_data,
        "schema": cmd_schema,
    }[args.command]
    try:
        if args.home:
            from dpsynth.tasks.home import set_home

            set_home(args.home)
        with command_console(args):
            handler(args)
    except DpsynthError as exc:
        print(f"dpsynth {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        # A file dpsynth had to write or read (the run folder, a checkpoint, the stores): say which and
        # why, in one paragraph; completed stages are on disk and a rerun resumes after them.
        where = f" {exc.filename!r}" if exc.filename else ""
        print(
            f"dpsynth {args.command}: cannot use{where}: {exc.strerror or exc}. Completed stages are kept; "
            "fix the cause (permissions, free disk space) and rerun the same command to resume.",
            file=sys.stderr,
        )
        return StorageError.exit_code
    except _tracking_errors() as exc:
        # The tracking store or registry failed mid-run (a server gone, a locked database).
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        print(
            f"dpsynth {args.command}: the MLflow tracking store failed ({reason}). Nothing was published from "
            "this attempt; completed stages are kept: once the store answers, rerun the same command to "
            "resume.",
            file=sys.stderr,
        )
        return StorageError.exit_code
    except KeyboardInterrupt:
        print(f"dpsynth {args.command}: interrupted; completed stages are kept and a rerun resumes.", file=sys.stderr)
        return 130
    finally:
        from dpsynth.tasks.run_lock import unlock_all

        unlock_all()  # a run the command held but never ran (a refusal after its preflight took the lock)
    return 0


FLOW_COMMANDS = ("release", "experiment")


def runs_a_flow(argv: list[str]) -> bool:
    """Whether `argv` names a command that runs a Prefect flow (not its help or its dry run), read before
    the parser: the first word that is no option, skipping the value of `--home`."""
    if any(word in ("-h", "--help", "--dry-run") for word in argv):
        return False
    words = iter(argv)
    for word in words:
        if word == "--home":
            next(words, None)
        elif not word.startswith("-"):
            return word in FLOW_COMMANDS
    return False


def _tracking_errors() -> tuple[type[BaseException], ...]:
    """MLflow's error types, imported only when an exception is being handled (MLflow loads slowly)."""
    from mlflow.exceptions import MlflowException

    return (MlflowException,)


def command_console(args):
    """The flow commands show progress and keep libraries' output off the console (flows/console.py)."""
    if args.command not in ("release", "experiment"):
        return contextlib.nullcontext()
    from dpsynth.flows.console import flow_console

    return flow_console(args.json, args.verbose)


def emit_json(obj: dict) -> None:
    print(json.dumps(obj, default=str, allow_nan=False))


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def cmd_validate(args) -> None:
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.tasks.validate import check_table_chunks

    schema = DatasetSchema.from_yaml(args.config)
    report = check_table_chunks(schema, args.data)
    print(report.summary_text())
    if args.json:
        emit_json(report.to_public_dict())


def preflight(args, kind: str):
    """Every refusal first (`preflight_checks`): meanwhile a process loads Prefect's server code, serving
    nothing, and a refusal ends it unused. Once the preflight has passed, the server starts serving while
    this process opens the run folder and loads the flow (flows/prefect_server.py; bench/startup.py
    measures the gain). Returns the run's context and the server (None: a run that already finished, which
    runs no flow work, or a Prefect API the user configured), for `prefect_server.use` around the flow."""
    from dpsynth.flows import prefect_server
    from dpsynth.tasks.context import finished_summary

    server = prefect_server.prepared_server()
    try:
        ctx = preflight_checks(args, kind)
    except BaseException:
        prefect_server.discard(server)
        raise
    if finished_summary(ctx) is not None:
        prefect_server.discard(server)
        return ctx, None
    if server is not None:
        server.start()
    open_store_and_run(ctx)
    return ctx, server


def preflight_checks(args, kind: str):
    """The refusals a run can meet before any work (the profile, the budgets and the ledger, the table
    and how much of it needs repair), with nothing started: no server, no store, no run folder."""
    from dpsynth.flows.import_pause import collection_paused
    from dpsynth.tasks.progress import status

    status("reading the profile")
    with collection_paused():  # the accountant's SciPy, pandas
        from dpsynth.tasks.context import finished_summary, load_context
        from dpsynth.tasks.decision import planned_cost

    ctx = load_context(
        args.config,
        args.data,
        args.profile,
        args.out,
        kind,
        generator=args.generator,
        publish=not getattr(args, "no_publish", False),
    )
    if finished_summary(ctx) is not None:
        return ctx  # already published, tried or completed: the flow reuses everything and starts nothing
    from dpsynth.tasks.run_lock import refuse_if_running

    refuse_if_running(ctx.run_dir, ctx.run_id)  # before the table is read: a run in progress is refused fast
    prof = ctx.profile
    if kind == "release":
        from dpsynth.tasks.ledger import require_lifetime_budget

        require_lifetime_budget(prof)  # only a profile with a lifetime budget publishes
    settings = [prof.release_target()] if kind == "release" else prof.settings
    for setting in settings:  # the generator's and the budget's refusals, before reading the table
        planned_cost(prof, setting, release=kind == "release", schema=ctx.schema)
    status("checking the table")
    # Great Expectations (seconds to import) only now: a refusal by the profile or the budget needs none.
    with collection_paused():
        from dpsynth.tasks.validate import check_table_file

    report = check_table_file(ctx.schema, ctx.data_path)
    from dpsynth.tasks.validate import check_repairs, repairs_text

    check_repairs(report, prof.input.max_repaired_share)
    repaired = repairs_text(report.repairs(), report.rows)
    if repaired is not None:  # the steward's own screen (internal), under --json too
        print(f"dpsynth {kind}: {repaired}", file=sys.stderr, flush=True)
    if kind == "release" and not prof.trial:  # a trial enters nothing in the ledger: nothing to check
        from dpsynth.tasks.decision import planned_release_cost
        from dpsynth.tasks.ledger import check_lifetime, check_new_input, check_release_window

        check_lifetime(
            ctx.schema.name, planned_release_cost(prof, settings[0]), prof.privacy.lifetime_budget, ctx.run_id
        )
        check_release_window(ctx.schema.name, prof, ctx.run_id)
        if not args.allow_same_input:
            check_new_input(ctx.schema.name, ctx.data_hash, ctx.run_id)
    return ctx


def open_store_and_run(ctx) -> None:
    """The MLflow store must answer; then the run folder (its record and its secret) exists from here on.
    A release in the home's own store (no MLFLOW_TRACKING_URI) asks nothing here: its flow imports MLflow
    and creates the store alongside its first stages, before anything is logged (flows/release.py), since
    that takes seconds and a local file cannot be down. A store the user named may be, and is asked now."""
    from dpsynth.tasks.context import open_run
    from dpsynth.tasks.tracking import named_store

    if ctx.kind != "release" or named_store():
        check_store_now()
    open_run(ctx)


def check_store_now() -> None:
    """Ask the MLflow store whether it answers (StorageError if not), with MLflow's own logs off."""
    from dpsynth.flows.console import quiet_mlflow
    from dpsynth.tasks.progress import status
    from dpsynth.tasks.tracking import check_store

    status("opening the MLflow store")
    quiet_mlflow()
    check_store()


def cmd_release(args) -> None:
    from dpsynth.flows import prefect_server
    from dpsynth.tasks.context import REAL_TABLE_TRIAL, finished_summary, is_demo_table
    from dpsynth.tasks.progress import close_display, status

    ctx, server = preflight(args, "release")
    if ctx.profile.trial and finished_summary(ctx) is None and not is_demo_table(ctx.data_path, ctx.data_hash):
        print(f"dpsynth release: {REAL_TABLE_TRIAL}", file=sys.stderr, flush=True)
    status("loading the flow")
    from dpsynth.flows.import_pause import collection_paused

    with collection_paused():
        from dpsynth.flows.release import release

    status("starting Prefect")
    with prefect_server.use(server):
        summary = release(
            config=str(args.config),
            data=str(args.data),
            profile=args.profile,
            out=str(ctx.run_dir),
            generator=args.generator,
            publish=not args.no_publish,
            allow_same_input=args.allow_same_input,
            cluster=args.cluster,
        )
    close_display()  # the result goes to standard output, after the display
    if summary.get("reused"):
        from dpsynth.tasks.progress import note

        what = (
            f"was already published as {summary['model_uri']}"
            if summary.get("published", True)
            else "had already finished as a trial (nothing published)"
        )
        note(f"release {summary['release_id']} {what}: every stage reused, nothing new trained, tracked or registered")
    line, warnings = closing_lines(summary)
    print(line)
    for warning in warnings:
        print(f"dpsynth release: warning: {warning}", file=sys.stderr, flush=True)
    if args.json:
        emit_json({k: _json_safe(v) for k, v in summary.items()})


def _epsilon_text(epsilon) -> str:
    return "inf (not private)" if epsilon is None or not math.isfinite(epsilon) else f"{epsilon:.2f}"


def _auc_text(summary: dict) -> str:
    """The synthetic rows' AUC on the real test rows beside the real training rows' own (both internal:
    they read real rows), so that the steward sees what the synthetic copy loses."""
    real = summary.get("real_auc")
    beside = "" if real is None else f" (real rows {real:.3f}; internal)"
    return f"AUC {summary['auc']:.3f}{beside}"


def closing_lines(summary: dict) -> tuple[str, list[str]]:
    """A release's closing line (standard output) and its warnings (standard error): what was published,
    where, at what epsilon; or, for a trial, that nothing was."""
    epsilon = summary["epsilon"]
    if not summary.get("published", True):
        return (
            f"trial {summary['release_id']}: nothing published (nothing registered, no bundle, no alias "
            f"moved, nothing entered in the privacy ledger); a release would have spent epsilon "
            f"{_epsilon_text(epsilon)} at delta {summary['delta']:g}; {_auc_text(summary)}; internal "
            f"report {summary['report']}"
        ), []
    line = (
        f"release {summary['release_id']}: published {summary['model_uri']} at epsilon "
        f"{_epsilon_text(epsilon)} (delta {summary['delta']:g}), bundle {summary['bundle_dir']}; "
        f"{_auc_text(summary)}"
    )
    warnings = []
    if epsilon is None or not math.isfinite(epsilon) or epsilon > HIGH_EPSILON:
        warnings.append(
            f"this release's epsilon is {_epsilon_text(epsilon)}, above {HIGH_EPSILON:g}: at that "
            "level differential privacy promises little for any one row; a smaller "
            "privacy.epsilon_budget protects the table better."
        )
    return line, warnings


def cmd_experiment(args) -> None:
    if args.dry_run:
        from dpsynth.flows.experiment import plan
        from dpsynth.tasks.context import load_context

        ctx = load_context(args.config, args.data, args.profile, args.out, "experiment", generator=args.generator)
        summary = plan(ctx.profile)
        print(f"experiment {ctx.run_id}: {summary['selection_runs']} selection runs planned")
    else:
        from dpsynth.flows import prefect_server
        from dpsynth.tasks.progress import close_display, status

        # As `release`: the server starts once every refusal has had its say, and loads while the
        # store opens (its worker processes inherit the server's address from `use`).
        ctx, server = preflight(args, "experiment")
        status("loading the flow")
        from dpsynth.flows.import_pause import collection_paused

        with collection_paused():
            from dpsynth.flows.experiment import experiment_for_profile

        status("starting Prefect")
        with prefect_server.use(server):
            summary = experiment_for_profile(
                config=str(args.config),
                data=str(args.data),
                profile=args.profile,
                out=str(ctx.run_dir),
                generator=args.generator,
            )
        close_display()
        print(
            f"experiment {summary['experiment_id']}: {summary['selection_runs']} selection runs, "
            f"report in {summary['run_dir']}"
        )
    if args.json:
        emit_json({k: _json_safe(v) for k, v in summary.items()})


def cmd_epsilon(args) -> None:
    if args.profile is not None:
        return epsilon_of_profile(args)
    from dpsynth.models.errors import ConfigError
    from dpsynth.models.privacy.accountant import epsilon_for

    if args.discriminators is None or args.iterations is None:
        raise ConfigError(
            "dpsynth epsilon needs --profile (any generator), or GS-WGAN's --discriminators and --iterations."
        )
    draw = args.critic_draw.replace("-", "_")
    eps = epsilon_for(args.discriminators, args.iterations, args.batch_size, args.noise_multiplier, args.delta, draw)
    print(
        f"epsilon = {eps:.4f} at delta = {args.delta:g} (K = {args.discriminators}, T = {args.iterations}, "
        f"B = {args.batch_size}, sigma = {args.noise_multiplier}, critic draw {args.critic_draw}; training "
        "only: a release adds its DP choice of the checkpoint)"
    )
    if args.json:
        emit_json({"epsilon": _json_safe(eps), "delta": args.delta, "critic_draw": draw})


def epsilon_of_profile(args) -> None:
    """Per setting: the generator, the last checkpoint the budget allows and training's epsilon there,
    and the whole release's epsilon (with the DP choice), from the one accountant of each generator."""
    from dpsynth.models.generators import generator_for
    from dpsynth.models.privacy.release_choice import whole_release_epsilon
    from dpsynth.models.profiles import load_named

    prof = load_named(args.profile, args.config)
    if args.generator:
        prof = prof.with_generator(args.generator)
    rows = []
    for setting in prof.settings:
        plan = generator_for(prof, setting).plan(prof, setting)
        whole = whole_release_epsilon(prof, plan.epsilon)
        rows.append(
            {
                "setting": setting.name,
                "generator": prof.generator_of(setting),
                "last_iteration": plan.last,
                "epsilon_training": _json_safe(plan.epsilon),
                "epsilon_release": _json_safe(whole),
                "delta": prof.privacy.delta,
            }
        )
        print(
            f"{setting.name}: {prof.generator_of(setting)}, trains to iteration {plan.last}, epsilon "
            f"{plan.epsilon:.4f} (training) and {whole:.4f} (whole release, with the DP choice) at delta "
            f"{prof.privacy.delta:g}"
        )
    if args.json:
        emit_json({"profile": prof.name, "settings": rows})


def cmd_ledger(args) -> None:
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.models.profiles import load_named
    from dpsynth.tasks.ledger import summary

    schema = DatasetSchema.from_yaml(args.config)
    # The forecast's profile is settled before anything is printed: a missing one is an error, not a ledger.
    forecast_profile = _forecast_profile(schema.name, args) if args.forecast is not None else None
    budget = load_named(args.profile, args.config).privacy.lifetime_budget if args.profile else None
    report = summary(schema.name, budget)

    def text(value, digits=4):
        return "inf" if value is None else f"{value:.{digits}g}"

    print(f"privacy ledger of {schema.name!r} ({report['ledger']}): {len(report['releases'])} release(s)")
    for entry in report["releases"]:
        print(
            f"  {entry['created'][:19]}  {entry['release_id']}  {entry['status']:<10}  epsilon "
            f"{text(entry['epsilon'])}  delta {entry['delta']:g}  {entry['model_version'] or ''}".rstrip()
        )
    print(
        f"spent: epsilon {text(report['spent_epsilon'])} at delta {report['spent_delta']:g} over "
        f"{report['counted']} release(s) (sequential composition; the plain sum is "
        f"{text(report['basic_composition_epsilon'])})"
    )
    if report["lifetime_budget"] is None:
        print("lifetime budget: none set (privacy.lifetime_budget in the release profile)")
    else:
        print(f"lifetime budget: {report['lifetime_budget']:g}, remaining epsilon {text(report['remaining_epsilon'])}")
    if forecast_profile is not None:
        report["forecast"] = _print_forecast(schema, forecast_profile, args.forecast)
    if args.json:
        emit_json(report)


def _forecast_profile(dataset: str, args):
    """The profile `--forecast` forecasts: --profile, else the one the table's last release named."""
    from dpsynth.models.errors import ConfigError
    from dpsynth.models.profiles import load_named
    from dpsynth.tasks.ledger import last_release_profile

    if args.forecast < 1:
        raise ConfigError(f"dpsynth ledger --forecast N needs N >= 1 (got {args.forecast}).")
    if args.profile is not None:
        return load_named(args.profile, args.config)
    last = last_release_profile(dataset)
    if last is None:
        raise ConfigError(
            f"dpsynth ledger --forecast N forecasts releases of one profile, and table {dataset!r} has no release "
            "in the ledger to take it from: pass --profile NAME (the profile the releases will use)."
        )
    try:
        return load_named(last, args.config)
    except ConfigError:
        raise ConfigError(
            f"Table {dataset!r}'s last release used profile {last!r}, which is neither beside the schema nor "
            "shipped with dpsynth: pass --profile NAME or the profile's YAML path."
        ) from None


def _print_forecast(schema, prof, releases: int) -> dict:
    """`dpsynth ledger --forecast N`: what release would say to each of N more releases of the profile,
    each at its planned (largest) cost: the release's own rules (tasks/ledger.py `release_refusal`)."""
    from dpsynth.models.errors import BudgetExceededError, ConfigError
    from dpsynth.tasks.decision import planned_cost, planned_release_cost
    from dpsynth.tasks.ledger import forecast_releases, require_lifetime_budget

    if prof.trial:
        print(f"forecast: profile {prof.name!r} is a trial: it publishes nothing and enters nothing in the ledger")
        return {"profile": prof.name, "trial": True, "verdicts": []}
    try:  # the profile's own refusals, the same for every release (exit 2 or 5 at release)
        setting = prof.release_target()
        require_lifetime_budget(prof)
        planned_cost(prof, setting, release=True, schema=schema)
    except (ConfigError, BudgetExceededError) as exc:
        print(f"forecast: every release of profile {prof.name!r} would be refused before any work: {exc}")
        return {"profile": prof.name, "verdicts": [], "stops_at": 1, "stopping_rule": "profile", "reason": str(exc)}
    result = forecast_releases(schema.name, prof, planned_release_cost(prof, setting), releases)
    per = result["planned_release_epsilon"]
    print(
        f"forecast: {releases} more release(s) of profile {prof.name!r}, each at most epsilon "
        f"{'inf' if per is None else f'{per:.2f}'}, as release would judge them today ({result['as_of']}):"
    )
    for verdict in result["verdicts"]:
        total = "inf" if verdict["lifetime_epsilon"] is None else f"{verdict['lifetime_epsilon']:.2f}"
        said = "fits" if verdict["fits"] else f"refused: {verdict['rule']}"
        print(f"  release {verdict['release']:>3}: {said}; lifetime epsilon {total}")
    if result["stops_at"] is None:
        print(f"  every one fits ({_forecast_rules(result)})")
    else:
        print(
            f"  release {result['stops_at']} and every one after it would be refused ({result['stopping_rule']}; "
            f"{_forecast_rules(result)})"
        )
    if prof.privacy.releases_until is not None:
        print(f"  each only if made by {prof.privacy.releases_until} (privacy.releases_until)")
    print("  each needs a new input file: the last release's file again is refused (--allow-same-input)")
    return result


def _forecast_rules(result: dict) -> str:
    budget, planned = result["lifetime_budget"], result["planned_releases"]
    return (
        f"lifetime budget {'none' if budget is None else f'{budget:g}'}, "
        f"planned releases {'none' if planned is None else planned}"
    )


def cmd_profiles(args) -> None:
    """Every profile a name can resolve to: the schema's own (beside it, with --config) and the ones shipped
    with dpsynth; for each its generator(s), the release's epsilon budget, the table's lifetime budget,
    whether it is a trial, the table it was tuned on (if any), and what `dpsynth release --profile NAME` does."""
    from dpsynth.models.config import profile_tuned_for, shipped_profiles_folder
    from dpsynth.models.errors import ConfigError
    from dpsynth.models.profiles import load_named, profile_files, profiles_folder

    rows: list[dict[str, Any]] = []
    for found in profile_files(args.config):
        source = "shipped" if found.shipped else "own"
        try:
            prof = load_named(str(found.path), args.config)
            tuned_for = profile_tuned_for(found.path)
        except ConfigError as exc:
            rows.append({"name": found.name, "source": source, "error": str(exc)})
            continue
        try:
            target = prof.release_target()
        except ConfigError:
            target = None
        if target is None:
            release = f"experiment only ({len(prof.settings)} settings, no release_setting)"
        elif prof.trial:
            release = "trial: publishes nothing"
        elif prof.privacy.lifetime_budget is None:
            release = "refused (no lifetime budget; --no-publish runs a trial)"
        else:
            release = "publishes"
        rows.append(
            {
                "name": found.name,
                "source": source,
                "tuned_for": tuned_for,
                "generator": ", ".join(dict.fromkeys(prof.generator_of(s) for s in prof.settings)),
                "epsilon_budget": prof.budget_for(target) if target else prof.privacy.epsilon_budget,
                "lifetime_budget": prof.privacy.lifetime_budget,
                "trial": prof.trial,
                "release": release,
            }
        )

    def text(value) -> str:
        return "none" if value is None else f"{value:g}"

    header = ("name", "source", "tuned for", "generator", "epsilon budget", "lifetime budget", "trial", "release")
    table = [header] + [
        (
            r["name"],
            r["source"],
            r["tuned_for"] or "any schema",
            r["generator"],
            text(r["epsilon_budget"]),
            text(r["lifetime_budget"]),
            "yes" if r["trial"] else "no",
            r["release"],
        )
        for r in rows
        if "error" not in r
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    own = f"own in {profiles_folder(args.config)}, " if any(r["source"] == "own" for r in rows) else ""
    print(f"profiles ({len(rows)}: {own}shipped with dpsynth in {shipped_profiles_folder()}):")
    for row in table:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip())
    for r in rows:
        if "error" in r:
            print(f"  {r['name']} ({r['source']}): invalid: {r['error']}")
    print(
        "  A name is looked up beside the schema first, then among the shipped profiles. A profile tuned for "
        "one table runs on any schema, but its settings were chosen on that table; the others are generic."
    )
    if args.json:
        emit_json(
            {
                "folder": str(profiles_folder(args.config)) if args.config else None,
                "shipped_folder": str(shipped_profiles_folder()),
                "profiles": rows,
            }
        )


def cmd_sample(args) -> None:
    from dpsynth.tasks.registry import sample_from_registry

    path = sample_from_registry(args.model_uri, args.rows, Path(args.out), args.seed)
    print(f"wrote {args.rows} synthetic rows to {path}")


def cmd_schema(args) -> None:
    if args.schema_command == "draft":
        return schema_draft(args)
    return schema_check(args)


def schema_draft(args) -> None:
    """`dpsynth schema draft DATA --out FILE`: `dpsynth.Schema.draft` from the shell (names and types only)."""
    import re

    from dpsynth.api.schema import Schema
    from dpsynth.models.errors import ConfigError
    from dpsynth.tasks.table_io import read_for_draft

    out = Path(args.out)
    if out.exists() and not args.force:
        raise ConfigError(f"{str(out)!r} exists: pass --force to overwrite it, or choose another --out.")
    frame, separator = read_for_draft(args.data)
    name = args.name or re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(args.data).stem)[:64] or "table"
    draft = Schema.draft(frame, name=name, target=args.target, id_column=args.id_column, separator=separator)
    draft.to_yaml(out)
    missing = draft.placeholders()
    print(
        f"wrote {out}: schema {name!r}, {len(draft.columns)} column(s) from the table's names and types only, "
        f"{len(missing)} value(s) to fill from public knowledge (marked 'fill from public knowledge'); "
        f"`dpsynth schema check {out}` lists what is left"
    )


def schema_check(args) -> None:
    """`dpsynth schema check FILE`: every value still to fill (exit 2 while any is), else the schema's rules."""
    from dpsynth.api.schema import Schema
    from dpsynth.models.errors import ConfigError

    schema = Schema.from_yaml(args.schema)  # a schema with nothing left to fill is validated here
    missing = schema.placeholders()
    if args.json:
        emit_json({"schema": str(args.schema), "name": schema.name, "missing": missing, "complete": not missing})
    if missing:
        listed = "".join(f"\n  {item}" for item in missing)
        raise ConfigError(
            f"{args.schema} still lacks {len(missing)} value(s), each to fill from public knowledge (a code "
            f"book, the questionnaire, physical limits), never from the rows:{listed}"
        )
    print(
        f"{args.schema}: schema {schema.name!r} is complete ({len(schema.columns)} columns, target "
        f"{schema.target!r}); `dpsynth validate --config {args.schema} --data TABLE` checks a table against it"
    )


def _demo_schema(config: str | None) -> str:
    """The schema a demo table follows: --config, else the checkout's Cardio schema when run in a checkout."""
    from dpsynth.models.errors import ConfigError

    if config is not None:
        return config
    if Path(DEFAULT_CONFIG).is_file():
        return DEFAULT_CONFIG
    import dpsynth.configs

    cardio = Path(dpsynth.configs.__file__).resolve().parent / "cardio.yaml"
    raise ConfigError(
        f"a demo table follows a schema: pass --config SCHEMA.yaml (there is no {DEFAULT_CONFIG} "
        f"in this folder). The Cardio schema shipped with dpsynth is {str(cardio)!r}; `dpsynth schema draft` "
        "drafts one for your own table."
    )


def cmd_demo_data(args) -> None:
    from dpsynth.models.data.demo import SHAPES, make_demo_table
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.models.errors import ConfigError
    from dpsynth.tasks.table_io import write_table

    if args.rows < 1:
        raise ConfigError("--rows must be at least 1.")
    schema = DatasetSchema.from_yaml(_demo_schema(args.config))
    table = make_demo_table(schema, args.rows, args.seed, SHAPES[args.shape])
    path = write_table(table, args.out, separator=schema.separator)
    from dpsynth.tasks.context import write_demo_sidecar

    # Marks the table as made by code, so that a trial on it is known not to read real rows.
    sidecar = write_demo_sidecar(
        path,
        {
            "schema": schema.name,
            "schema_version": schema.version,
            "rows": args.rows,
            "seed": args.seed,
            "shape": args.shape,
        },
    )
    print(f"wrote {args.rows} demo rows (made by code, no real data) to {path} (and {sidecar.name} beside it)")


if __name__ == "__main__":
    sys.exit(main())
