"""A release's peak memory does not grow with the rows (issue 42): the stages of an `mst-eps1` release, in one
fresh process per table, on a generated census table and on the same table 4 times longer, peak within a
fixed buffer of each other. What reads the rows reads them in row groups, evaluation reads bounded subsamples,
and the rows' encoded file is written and read without holding its pages (tasks/encoded_rows.py).

Small sizes keep it fast: row groups of 5,000 rows and evaluation bounded at 1,500 rows a part, so that
both tables are past every bound, as a census of millions is past the shipped ones (65,536 and 100,000)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from tests.conftest import ROOT

CENSUS = ROOT / "configs" / "census-demo.yaml"

RELEASE_CHILD = textwrap.dedent(
    """
    import dataclasses, json, resource, sys
    from pathlib import Path
    from dpsynth.models.config import load_profile
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.models.privacy.secret import PrivacySecret, store
    from dpsynth.tasks import cell_counting, evaluate, preprocess, reporting, split, training, validate
    config, data, run = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cell_counting.ROW_GROUP_ROWS = 5_000
    split.EVALUATION_ROWS = 1_500
    schema = DatasetSchema.from_yaml(config)
    profile = load_profile("mst-eps1", config)
    # Few estimator iterations; a large budget, so that MST's domain reduction keeps every cell a row
    # fills in both tables (4 copies of the same rows fill the same cells): the model is the same size.
    profile = dataclasses.replace(
        profile,
        mst=profile.sections["mst"].replace(iterations=50),
        privacy=dataclasses.replace(profile.privacy, epsilon_budget=1000.0),
    )
    setting = profile.release_target()
    run.mkdir(mode=0o700)
    store(run, PrivacySecret(bytes(range(32))))
    peaks = {}
    def after(name):
        peaks[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    checked = validate.validate_stage(run, config, data)
    after("validate")
    table = checked["table"]
    parts = split.split_stage(run, schema, table, profile)["split"]
    after("split")
    prep = preprocess.preprocess_stage(run, schema, table, parts, profile)
    after("preprocess")
    prepared = training.prepare_stage(run, schema, table, prep["encoded"], prep["gan_rows"], profile, setting)
    after("prepare")
    trained = training.train_stage(run, schema, prepared.directory, profile, setting)
    after("train")
    n_rows = evaluate.synthetic_rows(profile, split.SplitFile(parts))
    samples = training.sample_stage(run, schema, trained["checkpoints"], trained["ledger"], n_rows, profile, setting)
    after("sample")
    selected = evaluate.evaluate_setting_stage(
        run, schema, prep["encoded"], parts, trained["ledger"], samples.directory, profile, setting.name
    )
    evaluate.evaluate_real_stage(run, schema, prep["encoded"], parts, profile, 1)
    after("evaluate")
    ledger = json.loads(Path(trained["ledger"]).read_text())["checkpoints"]
    chain = {"setting": setting.name, "generator": "mst", "ledger": trained["ledger"],
             "checkpoints": trained["checkpoints"], "samples": samples.directory}
    chosen = {setting.name: {"iteration": ledger[-1]["iteration"], "epsilon": ledger[-1]["epsilon"], "test_auc": 0.5}}
    paths = {"encoded": prep["encoded"], "split": parts, "gan_rows": prep["gan_rows"],
             "imputation": prep["imputation"], "validation_summary": checked["summary"]}
    reporting.report_stage(run, Path(config), schema, paths, [chain], selected["results"], chosen, profile, "memory")
    after("report")
    print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "stages": peaks,
                      "rows": len(split.SplitFile(parts)["rows"])}))
    """
)

# What a release may grow by from a table to one 4 times longer (kB of peak resident memory). The peak is
# training's (jax compiling MST's fit), which varies between two runs of the same fit by tens of MB
# (measured: the longer table's peak 34 MB below the shorter's); the arrays of 8 bytes or less a row (the
# split's parts, the rows counted, the complete-row mask) add about 2 MB. Holding the 60,000 extra rows as
# frames, as the stages did before they read row groups, grows by about 120 MB (2 kB a row).
MEMORY_BUFFER_KB = 60_000


@pytest.mark.slow
def test_a_release_peak_memory_does_not_grow_with_the_rows(tmp_path):
    schema = DatasetSchema.from_yaml(CENSUS)
    small = make_demo_table(schema, 20_000, seed=1)
    # Each child compiles MST's programs itself, as a release does: training's peak is that compiling, so neither
    # child reads the session's jax compilation cache (tests/conftest.py), which the other may be filling.
    env = {key: value for key, value in os.environ.items() if key != "JAX_COMPILATION_CACHE_DIR"}
    children = {}
    logs = contextlib.ExitStack()
    for copies in (1, 4):  # both at once: each child's own peak is measured
        path = tmp_path / f"table{copies}.csv"
        pd.concat([small] * copies, ignore_index=True).to_csv(path, sep=schema.separator, index=False)
        children[copies] = subprocess.Popen(
            [sys.executable, "-c", RELEASE_CHILD, str(CENSUS), str(path), str(tmp_path / f"run{copies}")],
            stdout=subprocess.PIPE, stderr=logs.enter_context((tmp_path / f"stderr{copies}").open("w")), text=True,
            env=env,
        )  # fmt: skip
    with logs:
        printed = {copies: child.communicate()[0] for copies, child in children.items()}
    results = {}
    for copies, child in children.items():
        out = printed[copies]
        assert child.returncode == 0, (tmp_path / f"stderr{copies}").read_text()[-3000:]
        results[copies] = json.loads(out.strip().splitlines()[-1])
        assert results[copies]["rows"] == len(small) * copies
    assert results[4]["peak"] - results[1]["peak"] < MEMORY_BUFFER_KB, results
