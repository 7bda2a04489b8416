"""Stage 9: the two documents of a run, one per audience (docs/privacy.md section 7).

- `build_internal_report` (`internal`): ONE self-contained HTML file for the data steward (figures
  embedded as base64 PNG). It holds real-data statistics, so it is marked INTERNAL and never published.
- `build_release_notes` / `build_release_notes_html` / `write_public_release_notes` (`notes`): the
  published notes, DP-covered or public content only.

The package: `document` (the block model, rendered to Markdown or through the Jinja2 templates in
`templates/` to HTML), `formatting`, `figures` (matplotlib), `levels` (vanished levels), `summary` (the
internal report's first screen), `sections` (each section of the documents). Fidelity figures come from
`dpsynth.models.evaluation.fidelity`. Every sample-quality metric comes from
`dpsynth.models.evaluation.quality`. Plain inputs only (DataFrames, dicts, paths): no Prefect or MLflow
here; a flow wires them.
"""

from dpsynth.tasks.report.figures import BASELINE_SETTING, REAL_SETTING
from dpsynth.tasks.report.formatting import format_number
from dpsynth.tasks.report.internal import INTERNAL_BANNER, build_internal_report
from dpsynth.tasks.report.levels import SHARE_PREFIX, flatten_level_shares, level_warnings, vanished_levels
from dpsynth.tasks.report.notes import (
    PUBLIC_SETTING_KEYS,
    build_release_notes,
    build_release_notes_html,
    write_public_release_notes,
)

__all__ = [
    "BASELINE_SETTING",
    "INTERNAL_BANNER",
    "PUBLIC_SETTING_KEYS",
    "REAL_SETTING",
    "SHARE_PREFIX",
    "build_internal_report",
    "build_release_notes",
    "build_release_notes_html",
    "flatten_level_shares",
    "format_number",
    "level_warnings",
    "vanished_levels",
    "write_public_release_notes",
]
