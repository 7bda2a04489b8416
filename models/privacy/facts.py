"""What a generator says of its mechanism, in public words: the input of the privacy statement
(models/privacy/statement.py) and of every place that describes a release's privacy.

It lives in privacy/ rather than beside the generators that fill it in (models/generators/base.py
`GeneratorType.privacy_facts`), so that the statement reads it without importing a generator: the
generators sit above privacy (docs/extending.md, "Layers").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrivacyFacts:
    """The public description of a generator's mechanism (nothing here depends on the rows)."""

    generator: str  # its name in prose, e.g. "GS-WGAN"
    mechanism: str  # what the accountant composes
    accountant: str
    conversion: str
    sampling: str
    adjacency: str
    sanitised: str  # how training's steps are sanitised (for the privacy statement)
    imputation: str  # how a training row's gaps are filled under the honest protocol
    parameters: dict  # public accountant inputs: release.json, registry tags, notes
    labels: dict  # {parameter: what a reader calls it}, for every key of `parameters`
