"""The Flower client app of one site:
`python -m dpsynth.models.generators.dpfedctgan.federation.client FOLDER SITE ADDRESS`.

It reads the public job (`FOLDER/job.json`) and ONLY its own site's rows and secret
(`FOLDER/site-SITE/`), and sends the server exactly: once, its noisy counts (conditions.py); then, per
round, its new weights after DP-SGD (local_training.py) and the number of sanitised updates it took
(public: the section's local_steps). Its row count leaves it only inside the noisy counts.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsynth.models.generators.dpfedctgan.conditions import noisy_counts
from dpsynth.models.generators.dpfedctgan.federation.job import (
    ROWS_FILE,
    FederationJob,
    end_process,
    import_flower,
    load_arrays,
    site_folder,
    to_arrays,
)
from dpsynth.models.generators.dpfedctgan.local_training import SiteTrainer, site_counts_stream
from dpsynth.models.privacy import secret as secrets

SERVER_POLL_SECONDS = 0.05


class SiteClient:
    """What one site computes for each of the server's requests."""

    def __init__(self, folder: Path, site: int):
        self.job = FederationJob.read(folder)
        here = site_folder(folder, site)
        self.site = int(site)
        self.rows = torch.from_numpy(np.load(here / ROWS_FILE))
        self.secret = secrets.load(here)
        # Drawn once from the site's own stream: every request (and a restarted client) sends the same.
        self.counts = noisy_counts(
            self.rows, self.job.spec.layout, self.job.config.counts_noise, site_counts_stream(self.secret)
        )

    def fit(self, arrays: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        if config["phase"] == "counts":
            return arrays, 1, {"site": self.site, "counts": json.dumps([float(x) for x in self.counts])}
        trainer = SiteTrainer(
            self.rows,
            self.job.spec,
            self.job.config,
            seed=self.job.seed,
            site=self.site,
            secret=self.secret,
            shares=torch.tensor(json.loads(config["shares"]), dtype=torch.float32),
            noisy_size=float(self.counts[0]),
        )
        load_arrays(trainer.generator, trainer.discriminator, arrays)
        steps = trainer.run_round(int(config["round"]))
        return (
            to_arrays(trainer.generator, trainer.discriminator),
            max(1, round(float(self.counts[0]))),
            {
                "site": self.site,
                "steps": steps,
            },
        )


def wait_for_server(address: str, timeout_s: float) -> bool:
    """Whether the server at `address` (host:port) accepts connections within `timeout_s`. The launcher
    starts the server and the clients together (each process spends seconds importing torch), so a
    client polls the port rather than meet Flower's backoff (1, 2, 4... seconds) after a refused try."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(SERVER_POLL_SECONDS)


def main(argv: list[str]) -> int:
    import_flower()
    from flwr.client import NumPyClient, start_client

    folder, site, address = Path(argv[0]), int(argv[1]), argv[2]
    torch.set_num_threads(1)
    site_client = SiteClient(folder, site)
    if not wait_for_server(address, site_client.job.config.connect_timeout_s):
        print(f"site {site}: no federation server at {address}", file=sys.stderr)
        return 2

    class FlowerSite(NumPyClient):
        def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
            return []  # the server initialises the weights

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> Any:
            return site_client.fit(parameters, config)

    start_client(
        server_address=address, client=FlowerSite().to_client(), max_wait_time=site_client.job.config.connect_timeout_s
    )
    return 0


if __name__ == "__main__":
    end_process(main(sys.argv[1:]))
