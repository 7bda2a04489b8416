"""Fingerprint of a release's outputs for a fixed secret: the regression check that a refactoring left
every number unchanged (`python -m bench.release_fingerprint --profile default --profile eps1`).

It runs the release's stages (validate, split, preprocess, measure marginals, prepare, train, attach,
sample, select) in one process on a generated Cardio-like table with an explicit secret, the profile's
training shortened by `--scale` so that a run takes a minute or two, and prints the SHA-256 of every
file the stages wrote that a release derives its outputs from (samples, ledgers, selection results).
Run it before and after a change: the printed digests must be identical.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.models.config import load_profile
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.privacy.secret import PrivacySecret, store
from dpsynth.tasks import evaluate, marginals, preprocess, split, training, validate

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "cardio.yaml"
SECRET = PrivacySecret(bytes(range(32)))


def _replace(section, **changes):
    if hasattr(section, "model_copy"):
        return section.model_copy(update=changes)
    return dataclasses.replace(section, **changes)


def shortened(profile, scale: int):
    """The profile with every long loop cut by `scale` (same code paths, fewer steps)."""
    gan = profile.gan
    gan = _replace(
        gan,
        iterations=max(gan.iterations // scale, 2 * (gan.checkpoint_every // scale or 1)),
        checkpoint_every=max(gan.checkpoint_every // scale, 1),
        pretrain_iterations=max(gan.pretrain_iterations // scale, 1),
    )
    gan = _replace(gan, iterations=gan.iterations - gan.iterations % gan.checkpoint_every)
    settings = tuple(
        _replace(s, discriminators=min(s.discriminators, 100)) if getattr(s, "discriminators", None) else s
        for s in profile.settings
    )
    d = profile.dpautogan
    dpa = _replace(
        d,
        autoencoder_steps=max(d.autoencoder_steps // scale, 10),
        generator_steps=max(d.generator_steps // scale, 10),
        moment_steps=max(d.moment_steps // scale, 5),
    )
    return _replace(profile, gan=gan, dpautogan=dpa, settings=settings[:1])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def fingerprint(profile_name: str, scale: int, rows: int) -> dict:
    schema = DatasetSchema.from_yaml(CONFIG)
    profile = shortened(load_profile(profile_name, CONFIG), scale)
    setting = profile.settings[0]
    with tempfile.TemporaryDirectory(prefix="dpsynth-fingerprint-") as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir(mode=0o700)
        store(run_dir, SECRET)
        data = Path(tmp) / "table.csv"
        make_demo_table(schema, rows, seed=7).to_csv(data, sep=schema.separator, index=False)
        validated = validate.validate_stage(run_dir, CONFIG, data)
        sp = split.split_stage(run_dir, schema, validated["table"], profile)
        prep = preprocess.preprocess_stage(run_dir, schema, validated["table"], sp["split"], profile)
        measured = (
            marginals.measure_stage(run_dir, schema, validated["table"], prep["gan_rows"], profile)
            if profile.marginals.enabled
            else None
        )
        pre = training.prepare_stage(
            run_dir, schema, validated["table"], prep["encoded"], prep["gan_rows"], profile, setting
        )
        trained = training.train_stage(run_dir, schema, pre.directory, profile, setting)
        released = trained
        if measured is not None:
            released = marginals.attach_stage(
                run_dir, schema, trained["checkpoints"], trained["ledger"], measured["marginals"], profile, setting
            )
        n_rows = evaluate.synthetic_rows(profile, dict(np.load(sp["split"])))
        samples = training.sample_stage(
            run_dir, schema, released["checkpoints"], released["ledger"], n_rows, profile, setting
        )
        selected = evaluate.evaluate_setting_stage(
            run_dir, schema, prep["encoded"], sp["split"], released["ledger"], samples.directory, profile, setting.name
        )
        ledger = json.loads(Path(released["ledger"]).read_text())["checkpoints"]
        results = pd.read_parquet(selected["results"])
        return {
            "profile": profile_name,
            "epsilons": [round(c["epsilon"], 10) for c in ledger],
            "split": digest(Path(sp["split"])),
            "encoded": digest(Path(prep["encoded"])),
            "samples": {
                p.name: digest(p)
                for p in sorted(Path(samples.directory).rglob("*"))
                if p.is_file() and p.suffix in (".parquet", ".npy", ".csv")
            },
            "test_auc": [round(float(a), 10) for a in results["test_auc"]],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", default=None)
    parser.add_argument("--scale", type=int, default=20, help="divide every long loop by this (default 20)")
    parser.add_argument("--rows", type=int, default=4000)
    args = parser.parse_args()
    out = [fingerprint(p, args.scale, args.rows) for p in (args.profile or ["default", "eps1"])]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
