"""The Flower server app: `python -m dpsynth.models.generators.dpfedctgan.federation.server FOLDER ADDRESS`.

It holds the global generator and discriminator and never a row. Flower's round 1 asks every site for
its noisy counts (conditions.py), which give the conditional vector's level shares and the averaging
weights; every later Flower round is one training round: each site trains from the global weights
(local_training.py) and the server averages the sites' weights by their noisy row counts (FedAvg), in
site order and in float64, so the average does not depend on which reply arrived first.

After every completed round it writes its state (`federation_state.pt`: weights, shares, each site's
accountant), and at every `checkpoint_every` rounds (and the last) a generator file: a rerun resumes
after the last completed round. A round with a failed or missing site fails the run (exit status 3,
the reason in `server_error.txt`): a round is never averaged over fewer sites than the split made.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsynth.models.checkpoint_files import resume_state, save_training_state, save_verified, write_text_atomic
from dpsynth.models.generators.dpfedctgan.conditions import shares_from_counts
from dpsynth.models.generators.dpfedctgan.federation.job import (
    STATE_FILE,
    FederationJob,
    build_networks,
    end_process,
    import_flower,
    load_arrays,
    to_arrays,
)
from dpsynth.models.generators.dpfedctgan.privacy import counts_rho
from dpsynth.models.generators.networks import init_generator_
from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant

ERROR_FILE = "server_error.txt"
EXIT_ROUND_FAILED = 3


class FederationError(RuntimeError):
    """A round could not complete (a site failed, or did not answer)."""


def generator_file_name(round_index: int) -> str:
    return f"generator_{round_index:06d}.pt"


class FederatedState:
    """The server's whole state: resumable, written after every completed round."""

    def __init__(self, job: FederationJob):
        self.job = job
        self.dir = Path(job.checkpoints)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.generator, self.discriminator = build_networks(job)
        rng = torch.Generator().manual_seed(job.seed)
        init_generator_(self.generator, "default", rng)
        init_generator_(self.discriminator, "default", rng)
        self.round = 0
        self.shares: torch.Tensor | None = None
        self.noisy_sizes: list[float] = []
        self.accountants = [
            DPSGDAccountant(job.config.sample_rate, job.config.noise_multiplier) for _ in range(job.sites)
        ]
        self.ledger: list[dict] = []
        self.resume_notes: list[str] = []
        self.resumed = self._load()

    def written_for(self) -> dict:
        return {"config": self.job.config.model_dump(mode="json"), "sites": self.job.sites, "seed": self.job.seed}

    def _load(self) -> bool:
        state, self.resume_notes = resume_state(self.dir / STATE_FILE, "round", written_for=self.written_for())
        if state is None:
            return False
        self.round = int(state["round"])
        self.generator.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        self.shares = state["shares"]
        self.noisy_sizes = list(state["noisy_sizes"])
        self.accountants = [DPSGDAccountant.from_state_dict(s) for s in state["accountants"]]
        self.ledger = list(state["ledger"])
        return True

    def save(self) -> None:
        c = self.job.config
        if self.round % c.checkpoint_every == 0 or self.round == self.job.last_round:
            path = self.dir / generator_file_name(self.round)
            digest = save_verified(
                {
                    "spec": self.job.spec.to_dict(),
                    "state_dict": self.generator.state_dict(),
                    "condition_shares": self.shares,
                    "iteration": self.round,
                    "adjacency": "per site (module notes: dpfedctgan/privacy.py)",
                },
                path,
            )
            self.ledger = [e for e in self.ledger if e["iteration"] < self.round] + [
                {
                    "iteration": self.round,
                    "generator": path.name,
                    "sha256": digest,
                    "site_phases": [a.state_dict() for a in self.accountants],
                    "counts_rho": [counts_rho(c)] * self.job.sites,
                }
            ]
        state = {
            "round": self.round,
            **self.written_for(),
            "generator": self.generator.state_dict(),
            "discriminator": self.discriminator.state_dict(),
            "shares": self.shares,
            "noisy_sizes": self.noisy_sizes,
            "accountants": [a.state_dict() for a in self.accountants],
            "ledger": self.ledger,
        }
        save_training_state(state, self.dir / STATE_FILE)
        write_text_atomic(
            json.dumps({"round": self.round, "checkpoints": self.ledger}, indent=1), self.dir / "federation.json"
        )


def _by_site(results: list[tuple[Any, Any]], sites: int) -> list[Any]:
    """The fit results in site order; FederationError unless every site answered exactly once."""
    by_site: dict[int, Any] = {}
    for _, res in results:
        by_site[int(res.metrics["site"])] = res
    if sorted(by_site) != list(range(sites)):
        raise FederationError(f"the round expected replies from sites 0..{sites - 1}, got {sorted(by_site)}")
    return [by_site[k] for k in range(sites)]


def make_strategy(state: FederatedState) -> Any:
    from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import Strategy

    job = state.job
    first_round = state.round

    class FedAvgBySiteSize(Strategy):
        """Round 1: the sites' noisy counts; then FedAvg by noisy row counts, a checkpoint per round."""

        def initialize_parameters(self, client_manager: Any) -> Any:
            return ndarrays_to_parameters(to_arrays(state.generator, state.discriminator))

        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            if not client_manager.wait_for(job.sites, timeout=int(job.config.connect_timeout_s)):
                raise FederationError(
                    f"only {client_manager.num_available()} of {job.sites} sites connected within "
                    f"{job.config.connect_timeout_s:g} s"
                )
            if server_round == 1:
                config: dict[str, Any] = {"phase": "counts"}
            else:
                assert state.shares is not None
                config = {
                    "phase": "train",
                    "round": first_round + server_round - 1,
                    "shares": json.dumps([float(x) for x in state.shares]),
                }
            clients = client_manager.sample(num_clients=job.sites, min_num_clients=job.sites)
            return [(client, FitIns(parameters, config)) for client in clients]

        def aggregate_fit(self, server_round: int, results: list, failures: list) -> Any:
            if failures:
                reasons = "; ".join(
                    str(f if isinstance(f, BaseException) else getattr(f, "status", f)) for f in failures
                )
                raise FederationError(
                    f"round {first_round + server_round - 1}: {len(failures)} of {job.sites} sites failed "
                    f"({reasons or 'a client disconnected'})"
                )
            replies = _by_site(results, job.sites)
            if server_round == 1:
                counts = [np.asarray(json.loads(r.metrics["counts"]), dtype=np.float64) for r in replies]
                state.noisy_sizes = [max(1.0, float(c[0])) for c in counts]
                state.shares = shares_from_counts(np.sum(counts, axis=0), job.spec.layout)
                if state.round == 0 and not state.resumed:
                    state.save()  # round 0: the untrained generator with the shares
            else:
                for site, reply in enumerate(replies):  # the plan's count: the ledger never understates it
                    if int(reply.metrics["steps"]) != job.config.local_steps:
                        raise FederationError(
                            f"site {site} took {reply.metrics['steps']} updates, not {job.config.local_steps}"
                        )
                weights = np.asarray(state.noisy_sizes, dtype=np.float64)
                weights = weights / weights.sum()
                arrays = [parameters_to_ndarrays(r.parameters) for r in replies]
                averaged = [
                    sum(w * a[i].astype(np.float64) for w, a in zip(weights, arrays, strict=True)).astype(
                        arrays[0][i].dtype
                    )
                    for i in range(len(arrays[0]))
                ]
                load_arrays(state.generator, state.discriminator, averaged)
                for accountant in state.accountants:
                    accountant.step(job.config.local_steps)
                state.round += 1
                state.save()
            return ndarrays_to_parameters(to_arrays(state.generator, state.discriminator)), {}

        def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> list:
            return []

        def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> Any:
            return None, {}

        def evaluate(self, server_round: int, parameters: Any) -> Any:
            return None

    return FedAvgBySiteSize()


def serve(folder: Path, address: str) -> None:
    """Run the remaining rounds to the job's last round (nothing when it is reached already)."""
    import_flower()
    from flwr.server import ServerConfig, start_server

    job = FederationJob.read(folder)
    state = FederatedState(job)
    remaining = job.last_round - state.round
    if remaining <= 0 and state.resumed:
        return
    start_server(
        server_address=address,
        config=ServerConfig(num_rounds=1 + max(remaining, 0), round_timeout=job.config.round_timeout_s),
        strategy=make_strategy(state),
    )
    if state.round < job.last_round or not state.ledger:
        raise FederationError(f"the server stopped after round {state.round} of {job.last_round}")


def main(argv: list[str]) -> int:
    folder, address = Path(argv[0]), argv[1]
    torch.set_num_threads(1)
    try:
        serve(folder, address)
    except Exception as exc:  # noqa: BLE001 - every failure ends the run with its reason for the launcher
        write_text_atomic(f"{type(exc).__name__}: {exc}\n", folder / ERROR_FILE)
        print(f"federation server failed: {exc}", file=sys.stderr)
        return EXIT_ROUND_FAILED
    return 0


if __name__ == "__main__":
    end_process(main(sys.argv[1:]))
