"""The files a federation run shares between the release's process, the server and the clients.

`<folder>/job.json` holds public values only (the section, the network spec, the seed, the sites'
count, the rounds to reach); `<folder>/site-<k>/` holds one site's rows (`rows.npy`) and its secret
(`privacy_secret`, owner-only), written by the release for clients on this machine, or by each site on
its own machine. The server writes `<checkpoints>/federation_state.pt` after every completed round.
Both apps (server_app.py, client_app.py) also share the weights' form on the wire (one ArrayRecord) and the
environment Flower runs in (telemetry off).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
# What the ServerApp leaves in the job folder for the launcher: its pid when it starts, then one of the two.
PID_FILE = "server_app.pid"
DONE_FILE = "server_done.txt"
ERROR_FILE = "server_error.txt"


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


# ------------------------------------------------------------------------------ Flower's side


def telemetry_off(env: dict[str, str]) -> dict[str, str]:
    """`env` with Flower's usage telemetry and its update check off: by default every Flower process posts
    events (with the machine's platform) to Flower's servers, and each `flwr`, SuperLink, SuperNode and
    SuperExec process posts its version, Python's and the operating system's to Flower's update check, from
    a thread the process waits for before it exits; a process that holds a site's rows sends nothing but
    what the federation needs. Flower reads the switches in the environment, so they go in that of every
    process the launcher starts (and, through it, of the apps those processes start)."""
    return {**env, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}


def weights_record(generator: torch.nn.Module, discriminator: torch.nn.Module) -> Any:
    """The networks' weights as one Flower ArrayRecord, in `to_arrays` order."""
    from flwr.app import ArrayRecord

    return ArrayRecord(to_arrays(generator, discriminator))


def record_arrays(record: Any) -> list[np.ndarray]:
    """An ArrayRecord's arrays back in `to_arrays` order (the record keeps its insertion order)."""
    return list(record.to_numpy_ndarrays())
