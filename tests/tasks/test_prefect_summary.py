"""Prefect's artifacts carry no figure measured on real rows."""

import json

import numpy as np
import pandas as pd

from dpsynth.tasks.evaluate import RESULT_COLUMNS
from dpsynth.tasks.prefect_summary import PUBLIC_COLUMNS, public_selection_records, public_summary_markdown


def _results() -> pd.DataFrame:
    rows = []
    for it, eps in ((1000, 1.5), (2000, 3.25)):
        rows.append(
            {
                "setting": "k10",
                "iteration": it,
                "index": 0,
                "epsilon": eps,
                "penalty": "l2",
                "C": 1.0,
                "val_auc": 0.6123,
                "test_auc": 0.6522,
                "test_auprc": 0.5,
                "real_val_auc": 0.7001,
                "real_val_share_gap": 0.03,
                "real_val_pairs": 10,
                "real_val_gap_rows": 100,
                "degenerate": False,
                "seconds": 1.0,
            }
        )
    rows.append({**rows[0], "setting": "real", "epsilon": np.inf, "test_auc": 0.7811})
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def test_no_real_figure_reaches_prefect():
    results = _results()
    records = public_selection_records(results)
    assert [r["iteration"] for r in records] == [1000, 2000] and all(set(r) <= set(PUBLIC_COLUMNS) for r in records)
    text = json.dumps(records, allow_nan=False) + public_summary_markdown(
        results, {"k10": {"iteration": 2000, "epsilon": 3.4}}, "runs/x/report.html", dp_choice=True
    )
    for real in ("0.6522", "0.6123", "0.7001", "0.7811", "0.03"):
        assert real not in text, real
    assert "| k10 | 2 | 2000 | 3.400 |" in text and "runs/x/report.html" in text


def test_an_internal_choice_is_not_shown():
    text = public_summary_markdown(_results(), {"k10": {"iteration": 2000, "epsilon": 3.25}}, "r.html", dp_choice=False)
    assert "| k10 | 2 | internal | - |" in text and "2000" not in text
