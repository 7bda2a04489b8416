"""The base of every generator's profile section: one pydantic model per generator, which the profile
loader validates YAML against, `Profile` holds, and the generator's trainer reads.

Every field has its default (the profile's defaults live in the models); fields opt in to strictness as
the rest of the profile does (models/config_validation.py `STRICT`). Built in code with a bad value, a
section raises the same one-paragraph `ConfigError` as a profile file, naming the key's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import BaseModel, ValidationError, create_model

from dpsynth.models.config_validation import STRICT, validate

if TYPE_CHECKING:
    from pydantic._internal._model_construction import ModelMetaclass

    from dpsynth.models.config import SettingSpec
else:
    ModelMetaclass = type(BaseModel)  # public only as this


class _ConfigErrors(ModelMetaclass):
    """Turns a section's ValidationError, when built in code (`GanConfig(...)`), into the ConfigError a
    profile file gets. A metaclass rather than `__init__`: pydantic calls a model's own `__init__` when
    the model is a field of another one (the profile), whose errors must stay pydantic's to be listed."""

    def __call__(cls, **values: Any) -> Any:
        try:
            return super().__call__(**values)
        except ValidationError:
            # Validated again under its section key, so that the message names the key's whole path.
            key = _section_key(cls)
            fields: dict[str, Any] = {key: (cls, ...)}
            validate(
                create_model("Section", __config__=STRICT, **fields), {key: values}, where=f"profile section {key!r}"
            )
            raise


class SectionConfig(BaseModel, metaclass=_ConfigErrors):
    model_config = STRICT
    # The section's values in a smoke-sized profile (`smoke_sizing: true`, as the shipped `smoke`), over its
    # defaults: a few dozen private updates on a few thousand rows. Declared here, in the generator's own
    # config, so that a new generator sizes its smoke runs and its checks without an edit elsewhere.
    smoke: ClassVar[Mapping[str, Any]] = {}
    # Further values, over `smoke`, for the generator checks' runs only (dpsynth.generator_checks), which
    # train each generator several times: most generators need none.
    checks_smoke: ClassVar[Mapping[str, Any]] = {}
    # Whether its fit mostly waits on processes of its own (a federation's): the generator checks then run their
    # independent fits side by side, so that the waits overlap. A fit that computes in this process runs alone
    # (threads would only contend for the interpreter).
    fit_waits_on_processes: ClassVar[bool] = False

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes`, validated (as `dataclasses.replace` for the other profile sections)."""
        return type(self)(**{**self.model_dump(), **changes})

    @classmethod
    def setting_problem(cls, setting: SettingSpec) -> str | None:
        """Why a setting on this generator is not a usable setting (a SettingSpec), or None."""
        return None


def _section_key(model: type) -> str:
    from dpsynth.models.generator_registry import registrations

    for registration in registrations():
        if registration.config_model() is model:
            return registration.section
    return model.__name__
