"""A smoke release end to end on generated data (the smoke profile made a publishing release: the shipped
one is a trial): every stage runs, MLflow records it, the generator is registered as champion, the bundle
holds no real row and publishes the whole release's epsilon, the same file again is refused unless asked
for, a second release draws new noise, a killed release resumes to the same result, and an over-budget,
unapproved or uncovered release is refused with the champion left in place."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.gswgan.devices import kernels_in_use
from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer
from dpsynth.models.privacy.secret import load as load_secret
from dpsynth.models.privacy.secret import store
from dpsynth.tasks.bundle import bundle_contains_no_real_rows
from dpsynth.tasks.decision import statement_for
from dpsynth.tasks.ledger import entries as ledger_entries
from dpsynth.tasks.registry import load_released_model, registry_as_default, registry_client
from tests.conftest import CARDIO_SCHEMA, ROOT, publishing_smoke


def _last_json(capfd):
    return json.loads(capfd.readouterr().out.strip().splitlines()[-1])


def _release_with(workdir, data, name: str, section: str, key: str, value, **more) -> int:
    """A publishing smoke release whose profile changes keys; returns the exit status. Runs in `<name>-run`."""
    profile = yaml.safe_load(Path(publishing_smoke(workdir / "publishing")).read_text())
    profile.setdefault(section, {})[key] = value
    for path, extra in more.items():
        section_, key_ = path.split("__")
        profile.setdefault(section_, {})[key_] = extra
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return main(
        [
            "release",
            "--allow-same-input",
            "--config",
            str(CARDIO_SCHEMA),
            "--data",
            str(data),
            "--profile",
            str(path),
            "--out",
            str(workdir / f"{name}-run"),
        ]
    )


def _generator_weights(bundle) -> dict:
    return torch.load(bundle / "generator.pt", weights_only=True)["state_dict"]


INLINE_IMAGE = re.compile(r"data:image/[\w+]+;base64,[A-Za-z0-9+/=]+")


def _published_texts(client, model_name: str, version: str, bundle, download_to) -> dict[str, str]:
    """Everything a release publishes, as text: the bundle's files (the generator file as its non-weight
    fields), the registered version's tags and description, the registered model's, the logged model's
    params, tags and metrics, and every artifact of the registered model."""
    texts = {}
    for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
        if path.suffix == ".pt":
            blob = torch.load(path, weights_only=True)
            texts[f"bundle/{path.name}"] = repr({k: v for k, v in blob.items() if k != "state_dict"})
        else:
            # Inlined images are drawn from the synthetic frame alone (tests/tasks/test_bundle_files.py
            # checks it); their base64 text could hold a row count's digits by chance.
            texts[f"bundle/{path.name}"] = INLINE_IMAGE.sub("data:image", path.read_text(errors="ignore"))
    mv = client.get_model_version(model_name, version)
    registered = client.get_registered_model(model_name)
    texts["version"] = json.dumps({"tags": mv.tags, "description": mv.description, "source": mv.source})
    texts["registered"] = json.dumps({"tags": registered.tags, "description": registered.description})
    logged = client.get_logged_model(mv.model_id or mv.source.removeprefix("models:/"))
    texts["logged_model"] = json.dumps(
        {"params": logged.params, "tags": logged.tags, "metrics": [(m.key, m.value) for m in logged.metrics or []]}
    )
    with registry_as_default():
        local = Path(mlflow.artifacts.download_artifacts(mv.source, dst_path=str(download_to)))
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        if path.suffix == ".pt":
            blob = torch.load(path, weights_only=True)
            texts[f"artifact/{path.name}"] = repr({k: v for k, v in blob.items() if k != "state_dict"})
        elif path.suffix not in (".pkl",):
            texts[f"artifact/{path.relative_to(local)}"] = path.read_text(errors="ignore")
    return texts


def _assert_published_is_dp_covered(
    texts: dict[str, str], *, data_hash: str, internal_paths: list[str], real_aucs: list[float], row_counts: list[int]
) -> None:
    """No hash of the private file, internal path, real-data AUC or exact row count in anything published
    (row counts are looked for outside the shipped code and the synthetic tables, where any number may
    appear; the tables' own sizes are checked against `release_rows`)."""
    for where, text in texts.items():
        for fragment in (data_hash, data_hash[:8], data_hash[:12]):
            assert fragment not in text, f"the private file's hash in {where}"
        for path in internal_paths:
            assert path not in text, f"internal path {path} in {where}"
        for auc in real_aucs:
            for shown in (repr(auc), f"{auc:.6f}", f"{auc:.5f}"):
                assert shown not in text, f"a real-data AUC ({shown}) in {where}"
        if not where.startswith("artifact/code/") and not where.endswith((".csv", ".parquet")):
            # A count is a number of its own, not digits inside a hash or an id (SHA256SUMS' digests, MLflow's
            # run ids, uuids): CI once found 2706 inside a file's digest.
            numbers = _HEX_IDENTIFIER.sub(" ", text)
            for count in row_counts:
                assert not re.search(rf"(?<![\w.]){count}(?![\w.])", numbers), f"the row count {count} in {where}"


_HEX_IDENTIFIER = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{12,}")


def _high_epsilon_warning(epsilon: float) -> str:
    return (
        f"dpsynth release: warning: this release's epsilon is {epsilon:.2f}, above 10: at that level "
        "differential privacy promises little for any one row; a smaller privacy.epsilon_budget protects "
        "the table better."
    )


def test_smoke_release_end_to_end(isolated_workdir, demo_csv, demo_frame, capfd, tmp_path, monkeypatch, smoke_release):
    monkeypatch.setenv("DPSYNTH_PROGRESS_SECONDS", "0")  # every progress update, for the refused run below
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", smoke_release, "--json"]
    loose = os.umask(0o022)  # the usual umask: internals must be owner-only anyway
    try:
        assert main(argv) == 0
    finally:
        os.umask(loose)
    captured = capfd.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    # --json: no progress, no libraries' output; errors and warnings only: smoke's epsilon (71.4) is above 10.
    assert captured.err.splitlines() == [_high_epsilon_warning(summary["epsilon"])]
    for key in ("release_id", "epsilon", "delta", "auc", "bundle_dir", "model_uri", "mlflow_run_id"):
        assert key in summary
    assert summary["published"] is True and summary["trial"] is False
    # The closing line says what was published, where, at what epsilon (2 decimals).
    assert captured.out.strip().splitlines()[-2] == (
        f"release {summary['release_id']}: published {summary['model_uri']} at epsilon {summary['epsilon']:.2f} "
        f"(delta 1e-05), bundle {summary['bundle_dir']}; AUC {summary['auc']:.3f} (real rows "
        f"{summary['real_auc']:.3f}; internal)"
    )
    assert summary["model_uri"] == "models:/cardio-gswgan/1" and summary["bundle_dir"].endswith("/bundle")
    out = isolated_workdir / summary["run_dir"]
    assert out.parent == isolated_workdir / "runs" / "release" and out.name == summary["release_id"]
    # The release pays for training to its last checkpoint and for the DP choice (max: disjoint rows),
    # whichever checkpoint was chosen; never the chosen checkpoint's training epsilon alone, never 0.
    ledger = json.loads((out / "train-k10" / "checkpoints" / "ledger.json").read_text())["checkpoints"]
    profile = load_profile(smoke_release, CARDIO_SCHEMA)
    last = ledger[-1]["epsilon"]
    assert ledger[-1]["iteration"] == profile.gan.iterations and last > 0
    assert summary["epsilon"] == max(last, profile.privacy.choice_epsilon) >= last + 0.0
    assert summary["epsilon_training"] == last and summary["epsilon_choice"] == profile.privacy.choice_epsilon
    assert summary["iteration"] in [e["iteration"] for e in ledger if e["iteration"] > 0]
    assert 0.0 <= summary["auc"] <= 1.0
    for stage in (
        "validate",
        "split",
        "preprocess",
        "pretrain-k10",
        "train-k10",
        "sample-k10",
        "evaluate-k10/000",
        "evaluate-real/000",
        "report",
    ):
        assert (out / stage / "manifest.json").exists(), stage
    # Membership inference against the released checkpoint, in the internal report only.
    membership = json.loads((out / "report" / "membership.json").read_text())["k10"]
    assert 0.0 <= membership["nearest_synthetic_auc"]["auc"] <= 1.0 and membership["rows_each"] > 100
    assert "Membership inference" in (out / "report" / "report.html").read_text()
    # Which code computed the critics (C kernels or tensor operations) is on record with the stages.
    expected = kernels_in_use(profile.gan, "cpu")
    assert json.loads((out / "pretrain-k10" / "manifest.json").read_text())["info"]["kernels"] == expected
    assert (
        json.loads((out / "train-k10" / "manifest.json").read_text())["info"]["critic_updates"]
        == expected["critic_updates"]
    )

    client, registry = MlflowClient(), registry_client()
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["dpsynth.data_sha256"]
    assert "profile.gan.batch_size" in run.data.params
    # As MLflow's UI shows it: a classic ML experiment, a name and a description with the epsilon to 2
    # decimals (the metric keeps it exact), the released generator as the run's logged model.
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.info.run_name == f"{summary['release_id']} gswgan k10 epsilon {summary['epsilon']:.2f} (release)"
    description = run.data.tags["mlflow.note.content"]
    assert (
        f"epsilon **{summary['epsilon']:.2f}** at delta 1e-05" in description
        and repr(summary["epsilon"]) not in description
    )
    assert summary["bundle_dir"] in description and summary["model_uri"] in description
    assert run.data.metrics["release.epsilon"] == summary["epsilon"]
    (logged,) = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    assert logged.name == "released-generator" and logged.tags["dpsynth.model_version"] == "cardio-gswgan/1"
    assert [o.model_id for o in run.outputs.model_outputs] == [logged.model_id]
    champion = registry.get_model_version_by_alias("cardio-gswgan", "champion")
    # The registry is a store apart: no link to the internal run, no run of its own; the internal store
    # registers nothing.
    assert not champion.run_id and "mlflow_run_id" not in champion.tags
    assert (
        registry.get_logged_model(champion.model_id or champion.source.removeprefix("models:/")).source_run_id is None
    )
    assert registry.search_runs([e.experiment_id for e in registry.search_experiments()]) == []
    assert client.search_registered_models() == []
    for tag in (
        "epsilon",
        "delta",
        "accountant",
        "sigma",
        "C",
        "K",
        "T",
        "batch_size",
        "schema_version",
        "code_version",
    ):
        assert tag in champion.tags, tag
    # Internal facts stay on the internal run; nothing published carries them (nor a real row).
    assert run.data.tags["dpsynth.report"].endswith("report.html") and "real.auc" in run.data.metrics
    split = np.load(out / "split" / "split.npz")
    texts = _published_texts(registry, "cardio-gswgan", champion.version, out / "bundle", tmp_path / "download")
    _assert_published_is_dp_covered(
        texts,
        data_hash=run.data.tags["dpsynth.data_sha256"],
        internal_paths=[str(isolated_workdir), str(out), str(tmp_path)],
        real_aucs=[summary["auc"], summary["real_auc"]],
        row_counts=[len(split["train"]), len(split["train"]) + len(split["val"]), len(demo_frame)],
    )
    assert json.loads(texts["bundle/release.json"])["synthetic_rows"] == profile.release_rows
    assert bundle_contains_no_real_rows(tmp_path / "download", demo_frame) == []
    # Everything but the bundle is owner-only; the bundle has shareable modes inside its private folder.
    internal = [isolated_workdir / "runs", isolated_workdir / "mlartifacts", isolated_workdir / "mlflow.db"]
    for top in internal:
        for path in [top, *top.rglob("*")]:
            if (out / "bundle") not in (path, *path.parents):
                assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"
    assert all(p.stat().st_mode & 0o777 == (0o755 if p.is_dir() else 0o644) for p in (out / "bundle").rglob("*"))
    rows = load_released_model("models:/cardio-gswgan@champion").predict(pd.DataFrame({"n_rows": [50], "seed": [3]}))
    assert len(rows) == 50 and list(rows.columns) == DatasetSchema.from_yaml(CARDIO_SCHEMA).column_names

    assert float(champion.tags["epsilon"]) == summary["epsilon"] and champion.tags["T"] == str(ledger[-1]["iteration"])
    statement = statement_for(profile, profile.release_target(), release=True)
    assert statement.covers in champion.description

    bundle = out / "bundle"
    release = json.loads((bundle / "release.json").read_text())
    assert release["epsilon"] == summary["epsilon"] and release["model_uri"] == summary["model_uri"]
    assert release["epsilon_parts"]["training_to_last_checkpoint"] == last
    assert release["epsilon_covers"] == statement.covers
    assert release["epsilon_does_not_cover"] == list(statement.does_not_cover)
    assert torch.load(bundle / "generator.pt", weights_only=True)["epsilon"] == summary["epsilon"]
    assert bundle_contains_no_real_rows(bundle, demo_frame) == []
    published = " ".join(p.read_text(errors="ignore") for p in bundle.glob("*.md"))
    assert statement.covers in published
    # The release notes' level shares are the synthetic rows' (multiples of 1/2000 here): one may equal an
    # AUC to four decimals by chance (smoke 0 at 0.7040 beside an AUC of 0.7040 in one run), so each such
    # row is checked against the released rows, and the AUC search reads the text without them.
    synthetic = pd.read_csv(bundle / "synthetic.csv")
    share_row = re.compile(r"^\| (\w+) \| ([^|]+?) \| (0\.\d{4}|1\.0000) \|$", re.M)
    for column, level, share in share_row.findall(published):
        observed = (synthetic[column].astype(str) == level).mean()
        assert abs(observed - float(share)) < 5e-5, (column, level, share, observed)
    searched = share_row.sub("", published)
    for value in (summary["auc"], summary["real_auc"]):  # AUCs are measured on real rows: never published
        for shown in (f"{value:.3f}", f"{value:.4f}"):  # as a number of its own (150.851 is not 0.851)
            assert not re.search(rf"(?<![\d.]){re.escape(shown)}(?!\d)", searched), shown
    # The secret sits in the run folder, owner-only, and nowhere in what was published or logged.
    secret_file = out / "privacy_secret"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    secret_hex = secret_file.read_text().strip()
    for path in list(bundle.rglob("*")) + list((isolated_workdir / "mlartifacts").rglob("*")):
        if path.is_file():
            assert secret_hex.encode() not in path.read_bytes(), path
    assert secret_hex not in json.dumps(run.data.params) + json.dumps(run.data.tags)

    # The same run folder again: every stage reused, nothing new tracked, registered or counted.
    runs_before = len(client.search_runs([run.info.experiment_id]))
    assert main(argv + ["--out", str(out)]) == 0
    reused = _last_json(capfd)
    assert reused["reused"] is True and reused["model_uri"] == summary["model_uri"]
    assert len(client.search_runs([run.info.experiment_id])) == runs_before
    assert len(registry.search_model_versions("name = 'cardio-gswgan'")) == 1

    # The same command on the very same file is refused before any work: the same rows again would spend
    # the table's budget for nothing new (a schedule whose extract nobody replaced).
    assert main(argv) == 5
    err = capfd.readouterr().err
    assert "byte for byte" in err and "--allow-same-input" in err and "Traceback" not in err
    assert len(registry.search_model_versions("name = 'cardio-gswgan'")) == 1 and len(ledger_entries("cardio")) == 1

    # With --allow-same-input it is a new release: a new id, a new secret, new noise, another split. In a
    # real process, where Prefect's console handler prints what it is given (under pytest it does not).
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": PREFECT_API_URL.value()}
    done = subprocess.run(
        [sys.executable, "-m", "dpsynth.flows.cli", *argv, "--allow-same-input"],
        cwd=isolated_workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    again = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.stderr.splitlines() == [_high_epsilon_warning(again["epsilon"])], done.stderr
    other = isolated_workdir / again["run_dir"]
    assert again["release_id"] != summary["release_id"] and other != out
    assert load_secret(other) != load_secret(out)
    first, second = _generator_weights(bundle), _generator_weights(other / "bundle")
    assert any(not torch.equal(first[k], second[k]) for k in first)
    assert not np.array_equal(
        np.load(out / "split" / "split.npz")["val"], np.load(other / "split" / "split.npz")["val"]
    )

    # Over budget: refused before anything runs; the champion stays.
    assert _release_with(isolated_workdir, demo_csv, "tight", "privacy", "epsilon_budget", 1.0) == 5
    assert "budget" in capfd.readouterr().err
    assert registry.get_model_version_by_alias("cardio-gswgan", "champion").version == again["model_version"]

    # Not approved (the DP approval test finds the AUC under the profile's floor): refused after evaluation,
    # nothing published, the run final ("refused": a rerun would not draw the decision again).
    assert (
        _release_with(
            isolated_workdir, demo_csv, "strict", "evaluation", "min_release_auc", 0.999, privacy__approval_epsilon=5.0
        )
        == 6
    )
    err = capfd.readouterr().err
    assert "approval floor" in err and "Traceback" not in err
    # Without --json, every long stage shows its progress on stderr, with a percentage and the time left.
    for stage, unit in (
        ("pretraining k10", "iterations"),
        ("training k10", "iterations"),
        ("sampling k10", "checkpoints"),
        ("model selection k10", "runs"),
    ):
        assert re.search(rf"^{stage}: \d+% \(\d+/\d+ {unit}\), .*, \d+:\d\d left", err, re.MULTILINE), stage
    assert not (isolated_workdir / "strict-run" / "bundle").exists()
    assert json.loads((isolated_workdir / "strict-run" / "run.json").read_text())["status"] == "refused"
    assert registry.get_model_version_by_alias("cardio-gswgan", "champion").version == again["model_version"]

    # The table's ledger: both releases and the refused one (its decision was drawn), not the release
    # refused before any work; retiring a version gives nothing back.
    assert main(["ledger", "--config", str(CARDIO_SCHEMA), "--json"]) == 0
    book = _last_json(capfd)
    assert {e["release_id"]: e["status"] for e in book["releases"]} == {
        summary["release_id"]: "published",
        again["release_id"]: "published",
        json.loads((isolated_workdir / "strict-run" / "run.json").read_text())["run_id"]: "refused",
    }
    assert max(summary["epsilon"], again["epsilon"]) < book["spent_epsilon"] <= book["basic_composition_epsilon"]
    assert (isolated_workdir / "privacy-ledger.sqlite").stat().st_mode & 0o077 == 0
    registry.delete_model_version("cardio-gswgan", summary["model_version"])
    assert main(["ledger", "--config", str(CARDIO_SCHEMA), "--json"]) == 0
    assert _last_json(capfd)["spent_epsilon"] == book["spent_epsilon"]
    # A release whose planned cost would take the table past its lifetime budget: refused before any work.
    code = _release_with(
        isolated_workdir,
        demo_csv,
        "lifetime",
        "privacy",
        "lifetime_budget",
        book["spent_epsilon"] + 0.5 * summary["epsilon"],
    )
    err = capfd.readouterr().err
    assert code == 5 and "lifetime_budget" in err and "Traceback" not in err
    assert not (isolated_workdir / "lifetime-run" / "validate").exists()
    assert main(["ledger", "--config", str(CARDIO_SCHEMA), "--profile", "smoke"]) == 0
    assert f"{len(book['releases'])} release(s)" in capfd.readouterr().out


@pytest.mark.parametrize(
    "section, key, value, fragment",
    [
        ("gan", "critic_draw", "per_step", "critic_draw"),
        ("gan", "critic_refresh", "drawn", "critic_refresh"),
        ("protocol", None, "thesis", "protocol"),
    ],
)
def test_release_refuses_what_epsilon_cannot_cover(isolated_workdir, demo_csv, capfd, section, key, value, fragment):
    profile = yaml.safe_load((ROOT / "configs" / "profiles" / "smoke.yaml").read_text())
    if key is None:
        profile[section] = value
    else:  # a generator's section may be absent from the file (smoke_sizing fills it in)
        profile.setdefault(section, {})[key] = value
    path = isolated_workdir / "uncovered.yaml"
    path.write_text(yaml.safe_dump(profile))
    code = main(
        [
            "release",
            "--config",
            str(CARDIO_SCHEMA),
            "--data",
            str(demo_csv),
            "--profile",
            str(path),
            "--out",
            str(isolated_workdir / "run"),
        ]
    )
    err = capfd.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err
    assert not (isolated_workdir / "run").exists()


def test_killed_release_resumes_to_the_result_of_an_uninterrupted_one(
    isolated_workdir, demo_csv, capfd, monkeypatch, smoke_release
):
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", smoke_release, "--json"]
    save = GeneratorTrainer._save_checkpoint
    killed = []

    def dies_after_the_first_checkpoint(self):
        save(self)
        if self.iteration == 20 and not killed:
            killed.append(self.iteration)
            raise KeyboardInterrupt  # stands in for a kill: the checkpoint is on disk, nothing after it

    monkeypatch.setattr(GeneratorTrainer, "_save_checkpoint", dies_after_the_first_checkpoint)
    assert main(argv) == 130 and killed == [20]
    capfd.readouterr()
    assert ledger_entries("cardio") == []  # killed before its decision: it costs nothing
    first_attempt = json.loads(next((isolated_workdir / "runs" / "release").glob("*/run.json")).read_text())
    (interrupted,) = (isolated_workdir / "runs" / "release").iterdir()
    assert not (interrupted / "train-k10" / "manifest.json").exists()
    assert (interrupted / "train-k10" / "checkpoints" / "generator_000020.pt").exists()

    # A release never takes a secret put into its folder beforehand.
    planted = isolated_workdir / "planted"
    store(planted, load_secret(interrupted))
    assert main(argv[:-1] + ["--out", str(planted), "--json"]) == 2
    assert "privacy secret" in capfd.readouterr().err

    # The reference: the same run (its record, its secret, its stages up to pretraining) trained without
    # interruption, from a copy of the folder without the interrupted training.
    reference = isolated_workdir / "reference"
    shutil.copytree(interrupted, reference)
    shutil.rmtree(reference / "train-k10")
    assert main(argv[:-1] + ["--out", str(reference), "--json"]) == 0
    whole = _last_json(capfd)

    # The same command resumes the interrupted run (same id, same secret) and ends where it would have.
    assert main(argv) == 0
    resumed = _last_json(capfd)
    assert resumed["mlflow_run_id"] == first_attempt["mlflow_run_id"]  # one MLflow run, resumed
    assert resumed["run_dir"] == str(interrupted)  # under the home, absolute
    assert json.loads((interrupted / "run.json").read_text())["status"] == "published"
    # The reference is a copy of the same run (same id): one entry, entered once, published.
    assert [(e.release_id, e.status) for e in ledger_entries("cardio")] == [(resumed["release_id"], "published")]
    for key in ("iteration", "epsilon", "auc"):
        assert resumed[key] == whole[key], key
    a, b = _generator_weights(interrupted / "bundle"), _generator_weights(reference / "bundle")
    assert all(torch.equal(a[k], b[k]) for k in a)
    pd.testing.assert_frame_equal(
        pd.read_parquet(interrupted / "bundle" / "synthetic.parquet"),
        pd.read_parquet(reference / "bundle" / "synthetic.parquet"),
    )
    shutil.rmtree(reference)
