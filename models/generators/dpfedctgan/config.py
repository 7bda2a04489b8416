"""DP-Fed-CTGAN's profile section `dpfedctgan`.

Training runs in federated rounds: in each, every site's client takes `local_steps` DP-SGD updates of the
discriminator (each row of the site joins a batch with probability `sample_rate`) and as many generator
steps, from the round's global weights; the server averages the clients' weights (FedAvg). Before the
first round every client sends its row count and level counts once, with Gaussian noise (`counts_noise`):
the server turns them into the conditional vector's level shares and the averaging weights.

`sites` says how the training rows are split among the sites (exactly one key):
* `{iid: N}`: N sites, each row's site drawn uniformly from the run's secret (a function of the row's
  position only);
* `{column: NAME}`: NAME is the schema's site column (binary or categorical): one site per level;
* `{by_column: NAME}`: a public rule on a column: one site per level of a binary or categorical column,
  or, for a continuous column, `by_column_bins` equal-width bins of its declared bounds (non-IID).

The federation runs on Flower's deployment engine: a SuperLink (the server side) and one SuperNode per
site. `server_host`/`server_port`: where the SuperLink's Fleet API listens for the SuperNodes (loopback
and a free port by default): the one address the sites need. Its two other APIs (Control, where the
launcher submits the run, and ServerAppIo, where the ServerApp's process talks to it) listen on loopback
only, on free ports (no profile key: nothing outside the machine reaches them, and the profile's hash,
which names the run's folder, stays as it was). With `local_clients: false` the release starts the
SuperLink only, and each site runs its SuperNode on its own machine (docs/generators.md).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictStr, ValidationInfo, field_validator, model_validator

from dpsynth.models.config_validation import (
    STRICT,
    Beta,
    Count,
    Hidden,
    OpenUnit,
    Positive,
    Rate,
    Units,
    checkpoints_fit,
)
from dpsynth.models.generator_section import SectionConfig

SPLIT_KEYS = ("iid", "column", "by_column")
Port = Annotated[int, Field(ge=0, le=65535)]
Sites = Annotated[int, Field(ge=1, le=64)]


class SiteSplit(BaseModel):
    """How the training rows are split among the sites: exactly one of the three keys."""

    model_config = STRICT
    iid: Sites | None = None
    column: StrictStr | None = None
    by_column: StrictStr | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> SiteSplit:
        given = [key for key in SPLIT_KEYS if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(SPLIT_KEYS)} (got {', '.join(given) or 'none'})")
        return self

    @property
    def rule(self) -> str:
        return next(key for key in SPLIT_KEYS if getattr(self, key) is not None)


class DPFedCTGANConfig(SectionConfig):
    # Its section in a smoke-sized profile (SectionConfig.smoke): three IID sites as local processes, two
    # rounds of two updates each, tiny networks.
    smoke = {
        "sites": {"iid": 3},
        "rounds": 2,
        "checkpoint_every": 1,
        "local_steps": 2,
        "sample_rate": 0.02,
        "z_dim": 8,
        "generator_hidden": (16,),
        "discriminator_hidden": (16,),
    }
    # The generator checks' smoke run (SectionConfig.checks_smoke): each fit starts the federation's server and a
    # process per site (the smoke profile's flows run three sites): two sites, two short rounds, tiny networks.
    checks_smoke = {
        "sites": {"iid": 2},
        "rounds": 2,
        "checkpoint_every": 1,
        "local_steps": 3,
        "sample_rate": 0.05,
        "z_dim": 8,
        "generator_hidden": (16,),
        "discriminator_hidden": (16,),
    }
    # Its fit starts a SuperLink and a SuperNode per site and mostly waits on them and on Flower's polling.
    fit_waits_on_processes = True
    sites: SiteSplit = SiteSplit(iid=3)
    by_column_bins: Sites = 3
    rounds: Count = 40
    checkpoint_every: Count = 5
    local_steps: Count = 20
    sample_rate: OpenUnit = 0.01
    noise_multiplier: Positive = 2.0
    clip: Positive = 1.0
    # Noise multiplier of the one-off counts (row count and every level count, L2 sensitivity sqrt(1 + D)
    # for D discrete columns): their add/remove-one zCDP is 1 / (2 counts_noise^2).
    counts_noise: Positive = 10.0
    z_dim: Units = 32
    generator_hidden: Hidden = (128, 128)
    discriminator_hidden: Hidden = (128, 128)
    lr_generator: Rate = 2e-4
    lr_discriminator: Rate = 2e-4
    betas: tuple[Beta, Beta] = (0.5, 0.9)
    server_host: StrictStr = "127.0.0.1"
    server_port: Port = 0  # the SuperLink's Fleet API; 0: a free port of the machine
    local_clients: bool = True
    # Seconds the server waits for every client to connect, and for a round's replies.
    connect_timeout_s: Positive = 120.0
    round_timeout_s: Positive = 600.0

    @field_validator("checkpoint_every")
    @classmethod
    def _fits(cls, every: int, info: ValidationInfo) -> int:
        rounds = info.data.get("rounds")
        if rounds is not None and every > rounds:
            raise ValueError(f"must be at most rounds ({rounds}) (got {every})")
        return checkpoints_fit(every, rounds, "rounds")

    @model_validator(mode="after")
    def _remote_needs_a_port(self) -> DPFedCTGANConfig:
        if not self.local_clients and self.server_port == 0:
            raise ValueError("clients on other machines need a fixed server_port (got 0: a free port)")
        return self
