"""`dpsynth.load`: a released generator as a `Sampler` of decoded synthetic rows.

Three sources: a release bundle folder (its `generator.pt` and `schema.yaml`), a generator file (with the
schema beside it or given), or a registered model's URI (`models:/NAME/VERSION`, `models:/NAME@ALIAS`,
loaded from the registry store as `dpsynth sample` loads it). Every one samples through the pipeline's one
sampling path (`samplers.sample_rows`): for a given seed, the same rows as the bundle's synthetic table
(sampled with the profile's seed) and as the registered pyfunc model. A generator file records its format
version; a file newer than this code reads is refused with a message to upgrade (samplers.format_version).

Everything a Sampler returns is sampled from the DP generator (and calibrated to its file's noisy
marginals, when it carries them), so it is covered by the release's epsilon: post-processing only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth.api.conditions import sample_conditioned
from dpsynth.models.errors import ConfigError, MissingInputError

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.api.schema import Schema
    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.models.data.schema import DatasetSchema

# A bundle's files (tasks/bundle.py writes them under these names).
BUNDLE_GENERATOR = "generator.pt"
BUNDLE_SCHEMA = "schema.yaml"


class Sampler:
    """Synthetic rows from one released generator: `sample(n, seed=None, conditions=None)`.

    `info` holds the generator file's public facts (generator type, iteration, epsilon, delta, format
    version); `schema` the public schema the rows decode through."""

    def __init__(self, generator: Any, schema: DatasetSchema, info: Mapping[str, object], source: str) -> None:
        from dpsynth.models.data.encoding import TableEncoder

        self._generator = generator
        self.schema = schema
        self.encoder: TableEncoder = TableEncoder(schema)
        self.info = dict(info)
        self.source = source
        if int(generator.width) != self.encoder.width:
            raise ConfigError(
                f"The generator of {source} emits {generator.width} encoded columns but the schema "
                f"{schema.name!r} encodes to {self.encoder.width}: it was released with another schema."
            )

    @property
    def epsilon(self) -> float | None:
        """The whole release's epsilon as the generator file records it (None: not recorded)."""
        value = self.info.get("epsilon")
        return float(value) if isinstance(value, int | float) else None

    @property
    def format_version(self) -> int:
        from dpsynth.models.generators.samplers import FORMAT_VERSION_KEY

        return int(self.info.get(FORMAT_VERSION_KEY, 1))  # type: ignore[call-overload]

    def sample(self, n: int, seed: int | None = None, conditions: Mapping[str, Any] | None = None) -> pd.DataFrame:
        """`n` synthetic rows with the schema's columns, types, bounds and levels.

        `seed`: the same seed gives the same rows (those of the bundle and of the pyfunc model for that
        seed); None (the default) draws fresh randomness from the operating system, so each call gives
        new rows. `conditions`: {column: value} every row must satisfy; a continuous column takes a
        (low, high) pair, inclusive. A condition on the target alone, for a generator that takes the
        target's label as input (GS-WGAN with `condition_on_target`, DP-CGAN) and carries no measured
        marginals, sets the label directly; every other condition is drawn by rejection from ordinary
        samples (calibrated ones where the file carries marginals), in batches up to a bounded number of
        drawn rows, and refused with an error when it is too rare to fill `n` rows
        (dpsynth/api/conditions.py)."""
        from dpsynth.models.generators.samplers import fresh_seed, sample_rows

        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"the number of rows must be a whole number >= 0, not {n!r}")
        if seed is None:
            seed = fresh_seed()
        if not conditions:
            return sample_rows(self._generator, self.encoder, n, int(seed))
        return sample_conditioned(self._generator, self.encoder, n, int(seed), dict(conditions))

    def __repr__(self) -> str:
        return f"Sampler({self.source}, generator={self.info.get('generator_type', 'gswgan')!r})"


def load(source: str | Path, schema: str | Path | Schema | None = None) -> Sampler:
    """A Sampler for a release bundle folder, a generator file or a registered model URI (`models:/...`).

    `schema`: for a generator file without `schema.yaml` beside it, the schema it was released with."""
    text = str(source)
    if text.startswith("models:/") or text.startswith("runs:/"):
        return _from_registry(text)
    path = Path(source).expanduser()
    if path.is_dir():
        generator_file, schema_source = path / BUNDLE_GENERATOR, schema or path / BUNDLE_SCHEMA
    else:
        generator_file, schema_source = path, schema or path.with_name(BUNDLE_SCHEMA)
    if not generator_file.is_file():
        raise MissingInputError(
            f"There is no generator file at {str(generator_file)!r}: dpsynth.load takes a release bundle "
            "folder, a generator file or a model URI such as models:/cardio-gswgan@champion."
        )
    generator, info = _generator_of(generator_file)
    return Sampler(generator, _dataset_schema(schema_source), info, str(generator_file))


def _generator_of(path: Path) -> tuple[Any, dict[str, object]]:
    from dpsynth.models.generators.samplers import public_facts, read_generator_file, sampler_from_blob

    try:
        blob = read_generator_file(path)
    except (RuntimeError, ValueError, EOFError) as exc:  # torch's refusal of a file that is not its own
        raise ConfigError(f"{str(path)!r} is not a generator file dpsynth wrote: {exc}") from None
    return sampler_from_blob(blob), public_facts(blob)


def _dataset_schema(source: str | Path | Schema) -> DatasetSchema:
    from dpsynth.api.schema import Schema

    if isinstance(source, Schema):
        return source.validated()
    path = Path(source)
    if not path.is_file():
        raise MissingInputError(
            f"There is no schema at {str(path)!r}: pass `schema=` (the YAML the generator was released with)."
        )
    return Schema.from_yaml(path).validated()


def _from_registry(uri: str) -> Sampler:
    """The registered pyfunc model's own generator and schema (loaded by its `load_context`)."""
    from mlflow.exceptions import MlflowException

    from dpsynth.tasks.registry import load_released_model, registry_uri

    try:
        model = load_released_model(uri).unwrap_python_model()
    except (MlflowException, OSError) as exc:
        reason = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else type(exc).__name__
        raise MissingInputError(
            f"Cannot load the model {uri!r} from the registry at {registry_uri()}: {reason}. Check the model "
            "name and the alias or version (e.g. models:/cardio-gswgan@champion), and the home (DPSYNTH_HOME)."
        ) from None
    return Sampler(model.generator, model.schema, model.info, uri)


__all__ = ["Sampler", "load"]
