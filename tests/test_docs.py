"""README states what epsilon covers in the words the code generates (models/privacy/statement.py), so
the documentation cannot drift from the mechanism that runs."""

from dpsynth.models.config import load_profile
from dpsynth.models.privacy.statement import privacy_statement
from tests.conftest import CARDIO_SCHEMA, ROOT


def test_readme_carries_the_generated_statement_of_the_default_release():
    profile = load_profile("default", CARDIO_SCHEMA)
    statement = privacy_statement(profile, profile.release_target(), release=True)
    readme = " ".join((ROOT / "README.md").read_text().split())
    for text in (statement.covers, *statement.does_not_cover, statement.internal_only):
        assert " ".join(text.split()) in readme, f"README.md lacks, word for word:\n{text}"
