"""The files a federation run shares between the release's process, the server and the clients.

`<folder>/job.json` holds public values only (the section, the network spec, the seed, the sites'
count, the rounds to reach); `<folder>/site-<k>/` holds one site's rows (`rows.npy`) and its secret
(`privacy_secret`, owner-only), written by the release for clients on this machine, or by each site on
its own machine. The server writes `<checkpoints>/federation_state.pt` after every completed round.
Both apps also share how they import Flower (telemetry off) and how their processes end.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpsynth.models.checkpoint_files import write_text_atomic
from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.generators.dpfedctgan.networks import (
    ConditionalDiscriminator,
    ConditionalGenerator,
    FedGeneratorSpec,
)

JOB_FILE = "job.json"
STATE_FILE = "federation_state.pt"
ROWS_FILE = "rows.npy"


@dataclass(frozen=True)
class FederationJob:
    config: DPFedCTGANConfig
    spec: FedGeneratorSpec
    seed: int
    sites: int
    last_round: int
    checkpoints: str  # the folder the server writes its state and generator files to

    def to_json(self) -> str:
        return json.dumps(
            {
                "config": self.config.model_dump(mode="json"),
                "spec": self.spec.to_dict(),
                "seed": self.seed,
                "sites": self.sites,
                "last_round": self.last_round,
                "checkpoints": self.checkpoints,
            },
            indent=1,
        )

    @classmethod
    def read(cls, folder: Path) -> FederationJob:
        raw = json.loads((Path(folder) / JOB_FILE).read_text())
        return cls(
            DPFedCTGANConfig(**raw["config"]),
            FedGeneratorSpec.from_dict(raw["spec"]),
            int(raw["seed"]),
            int(raw["sites"]),
            int(raw["last_round"]),
            str(raw["checkpoints"]),
        )

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.to_json(), folder / JOB_FILE)


def site_folder(folder: Path, site: int) -> Path:
    return Path(folder) / f"site-{site}"


def write_site_rows(folder: Path, site: int, rows: np.ndarray) -> Path:
    path = site_folder(folder, site)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    np.save(path / ROWS_FILE, rows.astype(np.float32))
    return path


# ------------------------------------------------------------------------------ weights on the wire


def build_networks(job: FederationJob) -> tuple[ConditionalGenerator, ConditionalDiscriminator]:
    return job.spec.build(), job.spec.build_discriminator(job.config.discriminator_hidden)


def to_arrays(generator: torch.nn.Module, discriminator: torch.nn.Module) -> list[np.ndarray]:
    """The generator's then the discriminator's state, in state_dict order (Flower's parameter list)."""
    return [v.detach().cpu().numpy() for v in generator.state_dict().values()] + [
        v.detach().cpu().numpy() for v in discriminator.state_dict().values()
    ]


def load_arrays(generator: torch.nn.Module, discriminator: torch.nn.Module, arrays: list[np.ndarray]) -> None:
    keys = [("g", k) for k in generator.state_dict()] + [("d", k) for k in discriminator.state_dict()]
    if len(keys) != len(arrays):
        raise ValueError(f"expected {len(keys)} weight arrays, got {len(arrays)}")
    g_state = {k: torch.from_numpy(np.array(a)) for (owner, k), a in zip(keys, arrays, strict=True) if owner == "g"}
    d_state = {k: torch.from_numpy(np.array(a)) for (owner, k), a in zip(keys, arrays, strict=True) if owner == "d"}
    generator.load_state_dict(g_state)
    discriminator.load_state_dict(d_state)


# ------------------------------------------------------------------------------ the processes


def import_flower() -> None:
    """Import Flower with its usage telemetry off: by default every Flower server and client posts events
    (with the machine's platform) to Flower's servers; a process that holds a site's rows sends nothing
    but what the federation needs. Flower reads the switch once, when it is first imported."""
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    import flwr  # noqa: F401 - imported here first, after the switch


def end_process(code: int) -> None:
    """End a server or client process at once with `code`. Its files are written (atomically) and its
    logs flushed by then; the interpreter's teardown of torch and gRPC would hold the federation's end,
    and with it the release, for seconds."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
