"""The server's state and arithmetic, apart from Flower's transport (server_app.py drives them).

It holds the global generator and discriminator and never a row. The sites' noisy counts
(conditions.py) give the conditional vector's level shares and the averaging weights; each training
round's replies are averaged by the sites' noisy row counts (FedAvg), in site order and in float64, so
the average does not depend on which reply arrived first.

After every completed round it writes its state (`federation_state.pt`: weights, shares, each site's
accountant), and at every `checkpoint_every` rounds (and the last) a generator file: a rerun resumes
after the last completed round. A round with a failed, missing or repeated site, or a site that took
other than `local_steps` updates, raises FederationError: a round is never averaged over fewer sites than
the split made, and nothing of it is accounted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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
    load_arrays,
)
from dpsynth.models.generators.dpfedctgan.privacy import counts_rho
from dpsynth.models.generators.networks import init_generator_
from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant


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


@dataclass(frozen=True)
class SiteReply:
    """One site's reply to a request: the site id it reports, its weights (training rounds) and metrics."""

    site: int
    arrays: list[np.ndarray]
    metrics: dict[str, Any]


def _by_site(replies: list[SiteReply], sites: int) -> list[SiteReply]:
    """The replies in site order; FederationError unless every site answered exactly once."""
    got = sorted(r.site for r in replies)
    if got != list(range(sites)):
        raise FederationError(f"the round expected one reply from each of sites 0..{sites - 1}, got {got}")
    return sorted(replies, key=lambda r: r.site)


def train_config(state: FederatedState) -> dict[str, Any]:
    """What every site gets with the global weights for the next round: its index and the level shares."""
    assert state.shares is not None
    return {"round": state.round + 1, "shares": [float(x) for x in state.shares]}


def take_counts(state: FederatedState, replies: list[SiteReply]) -> None:
    """The sites' noisy counts: the averaging weights and the conditional vector's level shares."""
    job = state.job
    counts = [np.asarray(r.metrics["counts"], dtype=np.float64) for r in _by_site(replies, job.sites)]
    state.noisy_sizes = [max(1.0, float(c[0])) for c in counts]
    state.shares = shares_from_counts(np.sum(counts, axis=0), job.spec.layout)
    if state.round == 0 and not state.resumed:
        state.save()  # round 0: the untrained generator with the shares


def take_round(state: FederatedState, replies: list[SiteReply]) -> None:
    """One training round's replies: FedAvg by noisy sizes, in site order and in float64, then every
    site's accountant steps and the state is saved. Refused (nothing averaged or accounted) unless every
    site replied once and took exactly local_steps updates."""
    job = state.job
    ordered = _by_site(replies, job.sites)
    for reply in ordered:  # the plan's count: the ledger never understates it
        if int(reply.metrics["steps"]) != job.config.local_steps:
            raise FederationError(
                f"site {reply.site} took {reply.metrics['steps']} updates, not {job.config.local_steps}"
            )
    weights = np.asarray(state.noisy_sizes, dtype=np.float64)
    weights = weights / weights.sum()
    arrays = [r.arrays for r in ordered]
    averaged = [
        sum(w * a[i].astype(np.float64) for w, a in zip(weights, arrays, strict=True)).astype(arrays[0][i].dtype)
        for i in range(len(arrays[0]))
    ]
    load_arrays(state.generator, state.discriminator, averaged)
    for accountant in state.accountants:
        accountant.step(job.config.local_steps)
    state.round += 1
    state.save()
