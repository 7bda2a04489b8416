"""The two documents: the INTERNAL report (self-contained HTML, warnings) and the published release
notes, which must hold no real-data statistic."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.config import load_profile
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.fidelity import fidelity_summary, fidelity_verdicts, sdmetrics_quality
from dpsynth.models.evaluation.quality import feature_stats, level_frequencies, quality_summary, subsample
from dpsynth.tasks.decision import statement_for
from dpsynth.tasks.evaluate import RESULT_COLUMNS
from dpsynth.tasks.report import (
    INTERNAL_BANNER,
    build_internal_report,
    build_release_notes,
    build_release_notes_html,
    flatten_level_shares,
    format_number,
    level_warnings,
    vanished_levels,
)
from dpsynth.tasks.report.document import Table
from dpsynth.tasks.report.notes import FIDELITY_NOT_PUBLISHED
from dpsynth.tasks.report.summary import LIGHT_WORDS, SUMMARY_HEADING, SUMMARY_ID, plain_coverage

CARDIO_YAML = Path(__file__).resolve().parents[2] / "configs" / "cardio.yaml"
_DEFAULT = load_profile("default", CARDIO_YAML)
STATEMENT = statement_for(_DEFAULT, _DEFAULT.release_target(), release=True)
INF = float("inf")
NAN = float("nan")

REAL_AUCS = [0.7912345, 0.7923456, 0.7934567]
BASELINE_AUCS = [0.7811111, 0.7822222]
K10_AUCS = [0.6111111, 0.6522222, 0.6633333]
K10_EPS = [1.5, 3.25, 6.125]


@pytest.fixture(scope="module")
def schema() -> DatasetSchema:
    return DatasetSchema.from_yaml(CARDIO_YAML)


@pytest.fixture(scope="module")
def real(schema) -> pd.DataFrame:
    """A 'real' table with distinctive statistics: odd offsets on the continuous columns, a smoking share
    of 206/1500 = 0.137333 (the demo tables have about 1/3)."""
    frame = make_demo_table(schema, 1500, seed=1)
    for i, col in enumerate(schema.continuous):
        frame[col.name] = frame[col.name] + 0.456789 + 0.1111 * i
    frame["smoke"] = np.where(np.arange(len(frame)) < 206, 1, 0)
    return frame


@pytest.fixture(scope="module")
def synth(schema) -> pd.DataFrame:
    return make_demo_table(schema, 1000, seed=2)


def _results() -> pd.DataFrame:
    rows = []
    for i, auc in enumerate(REAL_AUCS):
        rows.append({"setting": "real", "iteration": 1000 * i, "index": i, "epsilon": NAN, "test_auc": auc})
    for i, auc in enumerate(BASELINE_AUCS):
        rows.append(
            {"setting": "baseline", "iteration": 1000 * (i + 1), "index": i + 1, "epsilon": INF, "test_auc": auc}
        )
    for i, (eps, auc) in enumerate(zip(K10_EPS, K10_AUCS, strict=False)):
        rows.append({"setting": "k10", "iteration": 1000 * (i + 1), "index": i + 1, "epsilon": eps, "test_auc": auc})
    frame = pd.DataFrame(rows)
    frame["penalty"], frame["C"], frame["degenerate"], frame["seconds"] = "l2", 0.0123, False, 1.5
    frame["val_auc"] = frame["test_auc"] + 0.0101
    frame["test_auprc"] = frame["test_auc"] - 0.0202
    frame["real_val_auc"] = frame["test_auc"] + 0.0033
    frame["real_val_share_gap"] = 0.0654321
    frame["real_val_pairs"] = frame["real_val_auc"] * 300 * 310
    frame["real_val_gap_rows"] = 40.0
    return frame[RESULT_COLUMNS]


CHOSEN = {
    "k10": {"iteration": 2000, "epsilon": 3.25, "test_auc": K10_AUCS[1]},
    "baseline": {"iteration": 1000, "epsilon": INF, "test_auc": BASELINE_AUCS[0]},
}
PRIVACY = {
    "mechanism": "subsampled Gaussian, sampling without replacement",
    "delta": 1e-5,
    "noise_multiplier": 1.07,
    "clip": 1.0,
    "batch_size": 32,
    "iterations": 3000,
    "settings": {"k10": {"discriminators": 10, "private": True}, "baseline": {"discriminators": 1, "private": False}},
    "validation_unexpected_rows": 4242,  # no label: internal report only
    "labels": {
        "mechanism": "mechanism",
        "delta": "delta",
        "noise_multiplier": "noise multiplier sigma",
        "clip": "clipping norm C",
        "batch_size": "batch size B",
        "iterations": "generator iterations (planned)",
    },
}
LEDGER = [
    {"iteration": 0, "epsilon": 0.0},
    {"iteration": 1000, "epsilon": 1.5},
    {"iteration": 2000, "epsilon": 3.25, "critic_wasserstein": 9.87654},
    {"iteration": 3000, "epsilon": 6.125},
]


def _shares(gluc3=0.1, cardio1=0.5):
    return {
        "gender": {"1": 0.6, "2": 0.4},
        "cholesterol": {"1": 0.5, "2": 0.3, "3": 0.2},
        "gluc": {"1": 0.6, "2": 0.4 - gluc3, "3": gluc3},
        "smoke": {"0": 0.7, "1": 0.3},
        "alco": {"0": 0.9, "1": 0.1},
        "active": {"0": 0.2, "1": 0.8},
        "cardio": {"0": 1.0 - cardio1, "1": cardio1},
    }


def _ledger_shares(vanish: bool) -> dict:
    if not vanish:
        return {"k10": [{"iteration": it, "level_shares": _shares()} for it in (0, 1000, 2000, 3000)]}
    return {
        "k10": [
            {"iteration": 0, "level_shares": _shares(gluc3=0.0)},
            {"iteration": 1000, "level_shares": _shares()},
            {"iteration": 2000, "level_shares": _shares(cardio1=0.0)},  # the chosen checkpoint
            {"iteration": 3000, "level_shares": _shares(gluc3=0.0)},
        ]
    }


@pytest.fixture(scope="module")
def internal(tmp_path_factory, schema, real, synth) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("internal")
    collapsed = synth.copy()
    collapsed["alco"] = 0  # level 1 absent from this synthetic table
    path = build_internal_report(
        directory / "report.html",
        title="Cardio experiment",
        schema=schema,
        results=_results(),
        chosen=CHOSEN,
        real_frame=real,
        synthetic_frames={"k10": synth, "baseline": collapsed},
        ledger_level_shares=_ledger_shares(vanish=True),
        privacy=PRIVACY,
        statement=STATEMENT,
        imputation_counts={"height": 12, "ap_hi": 34},
        thesis_reference={"K=1500 best trade-off": {"auc": 0.717, "epsilon": 6.45}},
        seed=0,
        membership={
            "k10": {
                "rows_each": 300,
                "dcr": {"share_closer_to_members": 0.5123, "low": 0.49, "high": 0.53},
                "nearest_synthetic_auc": {"auc": 0.5071, "low": 0.48, "high": 0.53},
                "density_ratio_auc": {"auc": 0.5234, "low": 0.5, "high": 0.55},
            }
        },
    )
    return path, path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def notes(tmp_path_factory, schema, synth) -> str:
    path = build_release_notes(
        tmp_path_factory.mktemp("notes") / "RELEASE_NOTES.md",
        title="Cardio release",
        schema=schema,
        synthetic_frame=synth,
        privacy=PRIVACY,
        statement=STATEMENT,
        chosen={"k10": CHOSEN["k10"]},
        ledger=LEDGER,
    )
    return path.read_text(encoding="utf-8")


# ---- the internal report -----------------------------------------------------------------------------------


def test_internal_report_shows_membership_inference(internal):
    text = html.unescape(internal[1])
    assert "Membership inference against the chosen checkpoints" in text
    assert "0.512 [0.490, 0.530]" in text and "0.507 [0.480, 0.530]" in text and "0.523 [0.500, 0.550]" in text


def test_internal_report_is_one_self_contained_html_file(internal):
    path, text = internal
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert text.count("data:image/png;base64,") >= 5  # 7.1, 7.2 (x2), 7.3 (x3), 7.4
    sources = re.findall(r'src="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"<(link|script)\b", text, re.IGNORECASE)
    assert "href=" not in text and "http://" not in text and "https://" not in text


def test_internal_report_is_marked_internal_and_holds_the_real_data_content(internal, schema, real):
    _, text = internal
    assert "INTERNAL" in text and "(INTERNAL)</h1>" in text
    for section in (
        "Figure 7.1",
        "Figure 7.2",
        "Figure 7.3",
        "Figure 7.4",
        "Table 7.1",
        "Table 7.2",
        "Model selection: every run",
        "Level shares at every checkpoint",
        "KNN imputation",
    ):
        assert section in text
    assert format_number(REAL_AUCS[1], 4) in text  # the selection table (every run)
    assert format_number(feature_stats(schema, real).loc["age", "mean"], 3) in text  # Table 7.2
    assert "4242" in text  # every privacy key appears internally
    assert "lr_coefficient" in text and "rf_importance" in text


def test_internal_report_shows_the_quality_modules_metrics(internal, schema, real, synth):
    """The report lays out `quality_summary` (on the tables as it subsamples them); it computes no metric."""
    text = html.unescape(internal[1])
    quality = quality_summary(schema, subsample(real, 20000, 0), subsample(synth, 20000, 0), max_rows=None)
    assert f"synthetic k10 (MAD from real {quality['spearman_mad']:.4f})" in text
    row = (
        f"<tr><td>k10</td><td>{quality['mean_wasserstein']:.4f}</td><td>{quality['mean_tvd']:.4f}</td>"
        f"<td>{quality['spearman_mad']:.4f}</td></tr>"
    )
    assert row in text
    for feature, distance in quality["tvd"].items():
        assert f"<th>{feature}</th>" in text and f"<td>{distance:.4f}</td>" in text
    assert "labels:" not in text  # the notes' labels are no privacy parameter


def test_internal_report_escapes_every_text(tmp_path, schema, synth):
    privacy = {"mechanism": "<script>alert(1)</script>", "labels": {"mechanism": "mechanism"}}
    text = build_internal_report(
        tmp_path / "r.html",
        title="a <b>bold</b> & title",
        schema=schema,
        results=pd.DataFrame(columns=RESULT_COLUMNS),
        chosen={},
        real_frame=None,
        synthetic_frames={"k10": synth},
        ledger_level_shares={},
        privacy=privacy,
        statement=STATEMENT,
    ).read_text()
    assert "<script" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<title>a &lt;b&gt;bold&lt;/b&gt; &amp; title (INTERNAL)</title>" in text
    assert text.count(f'<div class="banner">{html.escape(INTERNAL_BANNER)}</div>') == 2


def test_internal_report_warns_about_vanished_levels(internal):
    _, text = internal
    text = html.unescape(text)
    assert "WARNING (CHOSEN CHECKPOINT): setting k10, iteration 2000: level '1' of column 'cardio'" in text
    assert (
        "WARNING: setting k10: level '3' of column 'gluc' vanished (share 0) at 2 checkpoint(s): "
        "iterations 0, 3000" in text
    )
    assert "WARNING: the synthetic table of setting baseline has no row with level '1' of column 'alco'" in text
    assert 'class="vanished"' in internal[1]


def test_no_warning_without_a_vanished_level(tmp_path, schema, real, synth):
    path = build_internal_report(
        tmp_path / "r.html",
        title="t",
        schema=schema,
        results=_results(),
        chosen=CHOSEN,
        real_frame=real,
        synthetic_frames={"k10": synth},
        ledger_level_shares=_ledger_shares(vanish=False),
        privacy=PRIVACY,
        statement=STATEMENT,
        imputation_counts=None,
        thesis_reference=None,
    )
    text = path.read_text()
    assert "WARNING" not in text and 'class="vanished"' not in text
    assert "No level of a binary or categorical column vanished" in text


def test_internal_report_without_real_table_or_results(tmp_path, schema, synth):
    path = build_internal_report(
        tmp_path / "r.html",
        title="t",
        schema=schema,
        results=pd.DataFrame(columns=RESULT_COLUMNS),
        chosen={},
        real_frame=None,
        synthetic_frames={"k10": synth},
        ledger_level_shares={},
        privacy={},
        statement=STATEMENT,
    )
    text = path.read_text()
    assert "No AUC recorded." in text and "No real table given." in text
    assert "data:image/png;base64," in text


def test_vanished_levels_from_ledger_and_result_columns(schema):
    results = _results()
    shares = flatten_level_shares(_shares(gluc3=0.0))
    assert shares["share:gluc=3"] == 0.0 and len(shares) == 16
    results.loc[results["setting"] == "baseline", "share:gluc=3"] = 0.0
    found = vanished_levels(schema, _ledger_shares(vanish=True), CHOSEN, results)
    assert {
        "setting": "k10",
        "iteration": 2000,
        "column": "cardio",
        "level": "1",
        "chosen": True,
        "source": "ledger",
    } in found
    assert [f["chosen"] for f in found] == [True, True, False, False, False]  # chosen checkpoints first
    assert {(f["setting"], f["iteration"], f["column"], f["level"]) for f in found} == {
        ("k10", 2000, "cardio", "1"),
        ("k10", 0, "gluc", "3"),
        ("k10", 3000, "gluc", "3"),
        ("baseline", 1000, "gluc", "3"),
        ("baseline", 2000, "gluc", "3"),
    }
    assert [f["chosen"] for f in found if f["setting"] == "baseline"] == [True, False]
    assert level_warnings(schema, _ledger_shares(vanish=False), CHOSEN) == []


# ---- the release notes --------------------------------------------------------------------------------------


def _renderings(value: float) -> list[str]:
    return [f"{value:.{d}f}" for d in (2, 3, 4, 5)] + [repr(round(value, 6))]


def test_release_notes_contain_no_real_data_statistic(notes, schema, real):
    real_stats = feature_stats(schema, real)
    for feature, row in real_stats.iterrows():
        for value in (row["mean"], row["std"]):
            for text in _renderings(value):
                assert text not in notes, (feature, text)
    real_smoke = level_frequencies(schema, real)["smoke"]["1"]
    assert real_smoke == pytest.approx(206 / 1500)
    for text in _renderings(real_smoke)[1:]:
        assert text not in notes
    for auc in REAL_AUCS + BASELINE_AUCS + K10_AUCS + [float(np.mean(REAL_AUCS))]:
        for text in _renderings(auc)[1:]:
            assert text not in notes, text
    # Nor internal details: imputation counts, critic losses, non-public privacy keys.
    for forbidden in ("4242", "validation_unexpected", "9.87654", "critic", "imputed:", "test_auc", "val_auc"):
        assert forbidden not in notes


def test_release_notes_hold_the_synthetic_statistics_and_privacy_facts(notes, schema, synth):
    for _feature, row in feature_stats(schema, synth).iterrows():
        assert format_number(row["mean"], 3) in notes and format_number(row["std"], 3) in notes
    for column, levels in level_frequencies(schema, synth).items():
        for level, share in levels.items():
            assert f"| {column} | {level} | {format_number(share, 4)} |" in notes
    assert "(epsilon, delta) = (3.250, 1e-05)" in notes
    for entry in LEDGER:
        label = "0, untrained (epsilon 0)" if entry["iteration"] == 0 else str(entry["iteration"])
        assert f"| {label} | {format_number(entry['epsilon'], 3)} |" in notes
    assert "subsampled Gaussian, sampling without replacement" in notes
    assert "| noise multiplier sigma | 1.07 |" in notes and "| batch size B | 32 |" in notes
    assert "| k10 | 10 | True |" in notes  # the settings table


def test_release_notes_show_labelled_parameters_only(tmp_path, schema, synth):
    """The notes publish each parameter under the label the privacy summary gives it; an unlabelled key
    (anything the summary did not mean to publish) stays out."""
    privacy = {**PRIVACY, "labels": {"delta": "delta", "batch_size": "the batch"}}
    text = build_release_notes(
        tmp_path / "n.md",
        title="t",
        schema=schema,
        synthetic_frame=synth,
        privacy=privacy,
        statement=STATEMENT,
        chosen={"k10": CHOSEN["k10"]},
        ledger=LEDGER,
    ).read_text()
    assert "| the batch | 32 |" in text and "| delta | 1e-05 |" in text
    assert "| noise multiplier sigma |" not in text and "| 1.07 |" not in text and "| mechanism |" not in text


def test_epsilon_statement_in_both_documents(notes, internal, tmp_path, schema, synth):
    internal_text = html.unescape(internal[1])
    html_notes = build_release_notes_html(
        tmp_path / "notes.html",
        title="Cardio release",
        schema=schema,
        synthetic_frame=synth,
        privacy=PRIVACY,
        statement=STATEMENT,
        chosen={"k10": CHOSEN["k10"]},
        ledger=LEDGER,
    ).read_text()
    for text in (notes, internal_text, html.unescape(html_notes)):
        assert STATEMENT.covers in text and STATEMENT.internal_only in text
        for item in STATEMENT.does_not_cover:
            assert item in text
        assert "post-processing of the differentially private GS-WGAN generator" in text
        assert "KNN imputation" in text and "choice of the released checkpoint" in text
    assert "data:image" not in html_notes and "INTERNAL -" not in html_notes


def test_release_notes_of_a_non_private_release_say_so(tmp_path, schema, synth):
    path = build_release_notes(
        tmp_path / "n.md",
        title="t",
        schema=schema,
        synthetic_frame=synth,
        privacy=PRIVACY,
        statement=STATEMENT,
        chosen={"baseline": CHOSEN["baseline"]},
        ledger=[{"iteration": 1000, "epsilon": INF}],
    )
    text = path.read_text()
    assert "NOT differentially private" in text and format_number(BASELINE_AUCS[0], 4) not in text


def test_release_notes_of_a_conditional_generator_say_the_target_share_is_set_by_design(tmp_path, schema, synth):
    from dpsynth.models.config import load_profile
    from dpsynth.tasks.privacy_summary import privacy_summary

    profile = load_profile("thesis-k1500", CARDIO_YAML)
    privacy = privacy_summary(profile, profile.settings, schema)
    path = build_release_notes(
        tmp_path / "n.md",
        title="t",
        schema=schema,
        synthetic_frame=synth,
        privacy=privacy,
        statement=STATEMENT,
        chosen={"k1500": {"iteration": 2000, "epsilon": 3.0}},
        ledger=[{"iteration": 2000, "epsilon": 3.0}],
    )
    text = path.read_text()
    assert "set by design, not learned" in text and "cardio = 1 with probability 0.5" in text


# ---- the first screen, the thesis section, captions, wide tables -------------------------------------------


def _summary_html(text: str) -> str:
    start = text.index(f'<section id="{SUMMARY_ID}" class="panel">')
    return text[start : text.index("</section>", start)]


def test_internal_report_opens_with_the_summary(internal):
    """The summary panel is the first thing after the title, before every other section."""
    text = internal[1]
    title_end = text.index("</h1>")
    assert text.index(f'<section id="{SUMMARY_ID}"') > title_end
    assert re.findall(r"<h2>(.*?)</h2>", text)[0] == SUMMARY_HEADING
    assert text.index(SUMMARY_HEADING) < text.index("<h2>Warnings</h2>") < text.index("<h2>Privacy parameters</h2>")


def test_summary_holds_epsilon_coverage_auc_and_warnings(internal):
    summary = html.unescape(_summary_html(internal[1]))
    assert "<td>k10</td><td>2000</td><td>3.250</td><td>1e-05</td>" in summary
    assert f"<td>{K10_AUCS[1]:.3f}</td><td>{np.mean(REAL_AUCS):.3f}</td>" in summary
    assert "inf (NOT differentially private)" in summary  # the baseline
    assert plain_coverage(STATEMENT) in summary
    assert "Setting baseline is NOT differentially private" in summary
    assert "Setting baseline never produces" in summary and "alco=1" in summary  # its alco was collapsed
    assert "warning(s) about vanished levels: see the Warnings section" in summary


def test_plain_coverage_is_the_statement_without_its_parenthesised_detail():
    plain = plain_coverage(STATEMENT)
    assert "(" not in plain and ")" not in plain and "  " not in plain
    assert plain.startswith("Epsilon bounds, with respect to replacing any one row of the input table, everything")
    assert plain.endswith("the decision to publish.")


def test_summary_fidelity_cells_carry_the_targets_light(internal, schema, real, synth):
    """Each target figure's cell holds its value and light, as `fidelity_verdicts` judges the figures of the
    whole tables; SDMetrics' scores are `sdmetrics_quality`'s."""
    summary = _summary_html(internal[1])
    verdicts = fidelity_verdicts(fidelity_summary(schema, real, synth, spearman_rows=20000))
    for figure in ("categorical_tvd_mean", "continuous_tvd_mean", "pairwise_tvd_mean", "spearman_mad_continuous"):
        v = verdicts[figure]
        cell = f'<td class="light-{v["light"]}">{v["value"]:.4f} - {LIGHT_WORDS[v["light"]]}</td>'
        assert cell in summary, figure
    scores = sdmetrics_quality(schema, real, synth, seed=0)
    for key in ("column_shapes", "column_pair_trends", "overall"):
        assert f"<td>{scores[key]:.4f}</td>" in summary
    assert "<td>n/a</td>" in summary  # cardio declares no point mass


def test_internal_report_shows_the_numeric_shapes_beside_the_public_bins(internal, schema, real, synth):
    """The shape figures (cells at the real quantiles, KS, 2-way with numeric pairs on those cells) carry
    their lights on the first screen and their per-column values in the fidelity section, all from
    `fidelity_summary`."""
    text = html.unescape(internal[1])
    summary = _summary_html(internal[1])
    figures = fidelity_summary(schema, real, synth, spearman_rows=20000)
    verdicts = fidelity_verdicts(figures)
    for figure, where in (
        ("continuous_quantile_tvd_worst", figures["continuous_quantile_tvd_worst_column"]),
        ("continuous_ks_worst", figures["continuous_ks_worst_column"]),
        ("pairwise_quantile_tvd_mean", None),
        ("pairwise_quantile_tvd_worst", ", ".join(figures["pairwise_quantile_tvd_worst_pair"])),
    ):
        v = verdicts[figure]
        shown = f"{v['value']:.4f}" + (f" ({where})" if where else "")
        assert f'<td class="light-{v["light"]}">{shown} - {LIGHT_WORDS[v["light"]]}</td>' in summary, figure
    assert "cut at the real table's quantiles" in text
    assert "Per numeric column: TVD on cells at the real quantiles, and KS distance" in text
    for col in schema.continuous:
        assert f"<td>{figures['continuous_quantile_tvd'][col.name]:.4f}</td>" in text, col.name
        assert f"<td>{figures['continuous_ks'][col.name]:.4f}</td>" in text, col.name


def test_thesis_figures_sit_in_a_section_of_their_own(internal):
    text = internal[1]
    headings = re.findall(r"<h([23])>(.*?)</h\1>", text)
    levels = {title: level for level, title in headings}
    start = [title for _, title in headings].index("Thesis reproduction: Figures 7.1 to 7.4, Tables 7.1 and 7.2")
    assert levels["Thesis reproduction: Figures 7.1 to 7.4, Tables 7.1 and 7.2"] == "2"
    for title, level in headings[start + 1 :]:
        if title.startswith(("Figure 7.", "Table 7.", "Published reference")):
            assert level == "3", title
    thesis = [title for _, title in headings[start + 1 :] if title.startswith(("Figure 7.", "Table 7."))]
    assert len(thesis) == 6
    assert all(not title.startswith(("Figure 7.", "Table 7.")) for _, title in headings[:start])


def _figure_caption(text: str, heading: str) -> str:
    after = text[text.index(heading) :]
    return html.unescape(re.search(r"<figcaption>(.*?)</figcaption>", after).group(1))


def test_figure_7_1_caption_names_only_what_is_drawn(internal, tmp_path, schema, synth):
    caption = _figure_caption(internal[1], "Figure 7.1: utility against privacy")
    assert "dotted: non-private setting(s) baseline" in caption and "dashed: real training rows" in caption
    assert "1 = K=1500 best trade-off (epsilon 6.45, AUC 0.717)" in caption
    assert "untrained" not in caption  # the fixture's results have no iteration 0
    private_only = _results()
    private_only = private_only[private_only["setting"] == "k10"]
    text = build_internal_report(
        tmp_path / "r.html",
        title="t",
        schema=schema,
        results=private_only,
        chosen={"k10": CHOSEN["k10"]},
        real_frame=None,
        synthetic_frames={"k10": synth},
        ledger_level_shares={},
        privacy=PRIVACY,
        statement=STATEMENT,
    ).read_text()
    caption = _figure_caption(text, "Figure 7.1: utility against privacy")
    assert "dotted" not in caption and "dashed" not in caption and "crosses" not in caption
    assert "Fidelity not measured" in text


def test_the_untrained_checkpoint_is_labelled_wherever_it_shows(tmp_path, schema, real, synth):
    results = _results()
    untrained = results[results["setting"] == "k10"].iloc[[0]].assign(iteration=0, index=0, epsilon=0.0, test_auc=0.7)
    results = pd.concat([results, untrained], ignore_index=True)
    text = html.unescape(
        build_internal_report(
            tmp_path / "r.html",
            title="t",
            schema=schema,
            results=results,
            chosen={"k10": {"iteration": 0, "epsilon": 0.0, "test_auc": 0.7}},
            real_frame=real,
            synthetic_frames={"k10": synth},
            ledger_level_shares=_ledger_shares(vanish=False),
            privacy=PRIVACY,
            statement=STATEMENT,
        ).read_text()
    )
    assert "hollow circle: the untrained checkpoint (iteration 0" in _figure_caption(text, "Figure 7.1")
    summary = _summary_html(text)
    assert "<td>k10</td><td>0, untrained (epsilon 0)</td>" in summary
    assert "<td>0, untrained (epsilon 0) (chosen)</td>" in text  # level shares at every checkpoint
    runs = text[text.index("Model selection: every run") :]
    assert "<td>k10</td><td>0, untrained (epsilon 0)</td>" in runs
    assert "<td>real</td><td>0</td>" in runs  # the real-vs-real runs are no checkpoint


def test_wide_tables_are_laid_out_in_groups_that_repeat_the_first_column():
    table = Table(["row", *(f"c{i}" for i in range(30))], [["a", *map(str, range(30))]])
    groups = table.column_groups(12)
    assert [len(g) for g in groups] == [12, 12, 9] and all(g[0] == 0 for g in groups)
    assert sorted({j for g in groups for j in g}) == list(range(31))
    assert Table(["a", "b"], []).column_groups(12) == [[0, 1]]


def test_the_selection_table_wraps_within_the_page(internal):
    runs = internal[1][internal[1].index("Model selection: every run") :]
    tables = re.findall(r"<table>.*?</table>", runs, re.DOTALL)
    assert len(tables) > 1 and all(t.count("<th>") <= 12 for t in tables)
    assert "(continued:" in runs
    assert all("<th>setting</th>" in t for t in tables)


def test_release_notes_say_fidelity_to_the_real_table_is_internal(notes):
    assert FIDELITY_NOT_PUBLISHED in notes
    assert "SDMetrics" not in notes.replace(FIDELITY_NOT_PUBLISHED, "")
