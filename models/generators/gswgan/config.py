"""GS-WGAN's profile section `gan`: networks and optimisation (thesis section 4.4 and 6.1). Its noise
multiplier and clipping norm are the shared privacy keys (`privacy.noise_multiplier`, `privacy.clip`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, Strict, StrictBool, ValidationInfo, field_validator

from dpsynth.models.config_validation import (
    MAX_CHECKPOINTS,
    MAX_INT,
    Count,
    NonNegative,
    OpenUnit,
    Units,
)
from dpsynth.models.errors import ConfigError
from dpsynth.models.generator_section import SectionConfig

if TYPE_CHECKING:
    from dpsynth.models.config import Setting, SettingSpec

LearningRate = Annotated[float, Strict(), Field(gt=0, le=1)]
Beta = Annotated[float, Strict(), Field(ge=0, lt=1)]


class GanConfig(SectionConfig):
    # Its section in a smoke-sized profile (SectionConfig.smoke): few pretraining and training iterations,
    # conditioned on the target with Gumbel-softmax heads, as the shipped profiles train.
    smoke = {
        "pretrain_iterations": 20,
        "iterations": 40,
        "checkpoint_every": 20,
        "condition_on_target": True,
        "output_head": "gumbel",
        "critic_refresh_steps": 5,
        "generator_ema": 0.9,
    }
    z_dim: Units = 32
    generator_hidden: Annotated[tuple[Units, ...], Field(max_length=16)] = (128, 256)
    critic_hidden: Units = 128
    # The thesis' critics use BatchNorm; it mixes rows inside the gradient penalty, so it is an option.
    critic_batchnorm: StrictBool = False
    # "thesis": weights ~ N(0, 1) as the thesis text says; "default": PyTorch's scaled initialisation.
    init: Literal["default", "thesis"] = "default"
    lr_generator: LearningRate = 1e-4
    lr_critic: LearningRate = 1e-4
    betas: tuple[Beta, Beta] = (0.0, 0.9)
    critic_steps: Count = 5
    # How a generator step draws the critics it queries, the mechanism the accountant composes
    # (models/privacy/accountant.py): "per_row", every sanitised row its own critic, independently (T x B
    # queries at sigma); "per_step", one critic for all B rows (the thesis' Algorithm 2: T queries at
    # sigma / sqrt(B), epsilon in the hundreds; for reproducing the thesis only, `release` refuses it).
    critic_draw: Literal["per_row", "per_step"] = "per_row"
    # Critic updates each critic drawn in a training step gets before it is queried; null keeps
    # `critic_steps` (thesis: 5). Free in privacy terms (critics are never released, and the refresh
    # schedule depends on no row: `critic_refresh`) and the main lever against stale critics at large K.
    critic_refresh_steps: Count | None = None
    # Which critics a training step refreshes (trainer.py GeneratorTrainer.draw_refreshed): "independent",
    # as many critics as the step queries, drawn from a secret stream of their own, independent of the
    # query draws, so no critic's state records which critics past rows queried (the premise of the
    # T x B composition: docs/privacy.md section 1); "drawn", the critics the step queries (official
    # GS-WGAN, the thesis), for reproduction only: `release` refuses it.
    critic_refresh: Literal["independent", "drawn"] = "independent"
    gp_lambda: NonNegative = 10.0
    batch_size: Count = 32
    pretrain_iterations: Annotated[int, Strict(), Field(ge=0, le=MAX_INT)] = 2000
    # Precision of the throwaway generators' matrix products in pretraining, forward and backward
    # (devices.py `pretrain_matmul_dtype`): "float32"; "bfloat16" (float32 accumulation, mixed precision
    # as autocast); "auto": bfloat16 on a CPU that computes it natively (AVX512-BF16/AMX), float32
    # elsewhere. BatchNorm, the critics and Adam stay float32; training and the released generator too.
    pretrain_matmul: Literal["auto", "float32", "bfloat16"] = "auto"
    # Two CPU inner loops in C (dpsynth.models.native.kernels): the critic updates (all r of a visit in one
    # call, pretraining and training) and BatchNorm + ReLU of pretraining's bfloat16 products. "torch": the
    # tensor code; "native": the C kernels, built with the system's C compiler on first use (an error if
    # none builds them); "auto": the C kernels where they build and apply (CPU, critics without
    # BatchNorm), the tensor code elsewhere. Same formulas; results differ by float32 rounding.
    kernels: Literal["auto", "native", "torch"] = "auto"
    iterations: Count = 40000  # declared before checkpoint_every, which is checked against it
    checkpoint_every: Count = 1000
    # Exponential moving average of G (official GS-WGAN: 0.999); null keeps the raw generator.
    generator_ema: Beta | None = None
    # "tanh": one Tanh head for every encoded column (thesis); "typed": Tanh for continuous and
    # binary columns, a softmax mapped to [-1, 1] over each one-hot group; "gumbel": relaxed samples
    # for binary columns and one-hot groups (CTGAN's Gumbel-softmax; dpsynth.models.generators.networks.apply_head).
    output_head: Literal["tanh", "typed", "gumbel"] = "tanh"
    # Condition G and the critics' fake rows on the (binary) target, as official GS-WGAN conditions on
    # the class label: G takes z and a label drawn with probability `target_prior` of the target's
    # second level, and copies it into the target column. The prior is a public design choice (GS-WGAN:
    # uniform labels), never measured on the rows; the target share of the output is fixed by it.
    condition_on_target: StrictBool = False
    target_prior: OpenUnit = 0.5

    @field_validator("checkpoint_every")
    @classmethod
    def _divides_iterations(cls, every: int, info: ValidationInfo) -> int:
        iterations = info.data.get("iterations")
        if iterations is None:  # iterations itself is invalid and reported
            return every
        if every > iterations:
            raise ValueError(f"must be at most iterations ({iterations}) (got {every})")
        if iterations % every:
            raise ValueError(f"iterations ({iterations}) must be a multiple of checkpoint_every (got {every})")
        if iterations // every > MAX_CHECKPOINTS:
            raise ValueError(
                f"gives {iterations // every} checkpoints, at most {MAX_CHECKPOINTS} are allowed "
                f"(got {every} for {iterations} iterations)"
            )
        return every

    @classmethod
    def setting_problem(cls, setting: SettingSpec) -> str | None:
        return "a GS-WGAN setting needs discriminators (K)" if setting.discriminators is None else None


def discriminators(setting: Setting) -> int:
    """A GS-WGAN setting's K (a profile's settings are checked for it when it loads: `setting_problem`)."""
    if setting.discriminators is None:
        raise ConfigError(f"Setting {setting.name!r}: a GS-WGAN setting needs discriminators (K).")
    return setting.discriminators
