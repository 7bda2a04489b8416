"""What a run shows in Prefect's UI: facts that are public or covered by epsilon, never a real-data figure.

Prefect keeps artifacts in its own database, which sits outside dpsynth's owner-only home and may be a
shared server, so these artifacts carry each setting's checkpoints, their training epsilon and the chosen
checkpoint, and point to the internal report (owner-only, in the run folder and the internal MLflow run)
for every AUC and statistic measured on real rows.
"""

from __future__ import annotations

import math

import pandas as pd

from dpsynth.tasks.report import REAL_SETTING, format_number

# Columns of a selection run that depend on no real row: its place in the grid, training's epsilon at the
# checkpoint, and whether the checkpoint's synthetic rows were degenerate (one class).
PUBLIC_COLUMNS = ("setting", "iteration", "index", "epsilon", "degenerate")


def _public_value(value: object) -> object:
    if isinstance(value, float):
        return None if math.isnan(value) else ("inf" if math.isinf(value) else value)
    if hasattr(value, "item"):  # numpy scalars
        return _public_value(value.item())
    return value


def public_selection_records(results: pd.DataFrame) -> list[dict]:
    """One JSON-safe record per checkpoint of each private or baseline setting, public columns only."""
    if results is None or results.empty:
        return []
    table = results[results["setting"] != REAL_SETTING]
    table = table[[c for c in PUBLIC_COLUMNS if c in table.columns]].sort_values(["setting", "iteration"])
    return [{k: _public_value(v) for k, v in row.items()} for row in table.to_dict(orient="records")]


def public_summary_markdown(results: pd.DataFrame, chosen: dict, report: str, dp_choice: bool) -> str:
    """Each setting's checkpoints and, where the choice was the release's DP choice (`dp_choice`), the
    chosen one and the whole release's epsilon; where the real-data figures are. An experiment's internal
    choice reads real AUCs without noise: it is not shown."""
    lines = ["### dpsynth run", ""]
    settings = (
        [] if results is None or results.empty else [s for s in dict.fromkeys(results["setting"]) if s != REAL_SETTING]
    )
    if not settings:
        lines.append("No selection run recorded.")
    else:
        lines += ["| setting | checkpoints | chosen iteration | epsilon |", "| --- | --- | --- | --- |"]
        for setting in settings:
            pick = (chosen.get(setting) or {}) if dp_choice else {}
            lines.append(
                f"| {setting} | {int((results['setting'] == setting).sum())} | "
                f"{format_number(pick.get('iteration')) if dp_choice else 'internal'} | "
                f"{format_number(pick.get('epsilon'), 3) if dp_choice else '-'} |"
            )
    lines += [
        "",
        (
            "AUCs and statistics measured on real rows are internal: they are in the owner-only report "
            f"`{report}` and the internal MLflow run, never here."
        ),
    ]
    return "\n".join(lines) + "\n"
