"""DP-Fed-CTGAN's pieces without the federation's processes (tests/flows/test_dpfedctgan_release.py and
the conformance test run those): the accountant at the thesis' Cardio configuration, parallel composition
over sites, the site split rules, the noisy counts, and one exact sanitised discriminator update."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant

from dpsynth.models.config import load_profile
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators import get
from dpsynth.models.generators.dpfedctgan.adapter import planned_epsilon
from dpsynth.models.generators.dpfedctgan.conditions import (
    ConditionLayout,
    condition_key,
    counts_sensitivity,
    exact_counts,
    noisy_counts,
    shares_from_counts,
)
from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.generators.dpfedctgan.federation.launcher import site_secret
from dpsynth.models.generators.dpfedctgan.local_training import (
    RoundStreams,
    SiteTrainer,
    per_sample_gradients,
    public_seed,
)
from dpsynth.models.generators.dpfedctgan.networks import FedGeneratorSpec
from dpsynth.models.generators.dpfedctgan.privacy import counts_rho, release_epsilon, site_epsilon
from dpsynth.models.generators.dpfedctgan.sites import site_count, split_rows
from dpsynth.models.generators.dpsgd import clipped_sum
from dpsynth.models.privacy.dpsgd_accountant import Phase, epsilon, replace_one_epsilon
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import CARDIO_SCHEMA, TEST_SECRET_HEX

SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)


@pytest.fixture(scope="module")
def encoded(cardio_schema) -> np.ndarray:
    return TableEncoder(cardio_schema).encode(make_demo_table(cardio_schema, 900, seed=3)).astype(np.float32)


def test_a_sites_accountant_at_the_thesis_cardio_configuration_is_opacus():
    # The thesis' Cardio row: sigma 2, delta 1e-5, epsilon 3, three sites of 56,000 / 3 training rows;
    # CTGAN's batch of 500 rows gives each site's rate q = 500 / 18,667.
    q, sigma, delta = 500 / 18_667, 2.0, 1e-5
    steps = 3 * 37 * 20  # three local epochs of 37 batches, 20 rounds
    opacus = RDPAccountant()
    opacus.history = [(sigma, q, steps)]
    ours = epsilon(Phase(q, sigma, steps), delta, "opacus")
    # Our order grid extends Opacus's (every order is a valid bound): never above, and close.
    assert ours <= opacus.get_epsilon(delta) + 1e-9 and ours == pytest.approx(opacus.get_epsilon(delta), rel=0.02)
    # The release pays the replace-one figure: group privacy over a removal and an addition, with the counts.
    config = DPFedCTGANConfig(sample_rate=q, noise_multiplier=sigma, local_steps=3 * 37, rounds=20, checkpoint_every=5)
    assert site_epsilon([Phase(q, sigma, steps)], counts_rho(config), delta) == replace_one_epsilon(
        Phase(q, sigma, steps), delta, extra_rho=1 / (2 * config.counts_noise**2)
    )
    assert site_epsilon([Phase(q, sigma, steps)], 0.0, delta) > 2 * epsilon(Phase(q, sigma, steps), delta)


def test_the_release_pays_the_worst_sites_epsilon_not_their_sum():
    delta, rho = 1e-5, 0.005
    sites = [([Phase(0.01, 2.0, 100)], rho), ([Phase(0.02, 2.0, 100)], rho), ([Phase(0.01, 2.0, 50)], 0.02)]
    each = [site_epsilon(phases, r, delta) for phases, r in sites]
    assert release_epsilon(sites, delta) == max(each) == each[2]
    assert release_epsilon(sites, delta) < sum(each)


def test_the_plan_is_the_accountants_figure_at_every_round(cardio_schema):
    profile = load_profile("smoke", CARDIO_SCHEMA).with_generator("dpfedctgan")
    c = profile.dpfedctgan
    plan = get("dpfedctgan").plan(profile, profile.release_target())
    assert plan.iterations[-1] == c.rounds and plan.iterations[1] == c.checkpoint_every
    from dpsynth.models.marginals.release import ADD_REMOVE_ONE, marginals_rho

    extra = counts_rho(c) + marginals_rho(profile, ADD_REMOVE_ONE)
    for rounds, eps in zip(plan.iterations, plan.epsilons, strict=True):
        assert eps == replace_one_epsilon(
            Phase(c.sample_rate, c.noise_multiplier, rounds * c.local_steps), profile.privacy.delta, extra_rho=extra
        )
        assert planned_epsilon(profile, rounds) == eps


def test_an_iid_split_is_a_disjoint_cover_fixed_by_the_secret(cardio_schema, encoded):
    config = DPFedCTGANConfig(sites={"iid": 4})
    sites = split_rows(encoded, cardio_schema, config, SECRET)
    assert len(sites) == 4 and sorted(np.concatenate(sites).tolist()) == list(range(len(encoded)))
    again = split_rows(encoded, cardio_schema, config, SECRET)
    other = split_rows(encoded, cardio_schema, config, PrivacySecret.from_hex("a1" * 32))
    assert all(np.array_equal(a, b) for a, b in zip(sites, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(sites, other, strict=True))
    # By position only: another table of the same size splits the same way.
    shuffled = encoded[::-1].copy()
    assert all(
        np.array_equal(a, b) for a, b in zip(sites, split_rows(shuffled, cardio_schema, config, SECRET), strict=True)
    )


def test_splits_by_column_follow_the_rows_values(cardio_schema, encoded):
    encoder = TableEncoder(cardio_schema)
    target = cardio_schema.target
    by_label = split_rows(encoded, cardio_schema, DPFedCTGANConfig(sites={"by_column": target}), SECRET)
    assert len(by_label) == 2
    assert (encoded[by_label[0], encoder.target_index] < 0).all() and (
        encoded[by_label[1], encoder.target_index] > 0
    ).all()
    continuous = cardio_schema.continuous[0].name
    bins = split_rows(
        encoded, cardio_schema, DPFedCTGANConfig(sites={"by_column": continuous}, by_column_bins=4), SECRET
    )
    column = encoded[:, encoder.block(continuous).start]
    assert len(bins) == 4 and all(
        column[b].max() <= column[c].min() for b, c in zip(bins, bins[1:], strict=False) if len(b) and len(c)
    )
    categorical = next(c for c in cardio_schema.columns if c.kind == "categorical")
    assert site_count(DPFedCTGANConfig(sites={"column": categorical.name}), cardio_schema) == len(categorical.levels)
    with pytest.raises(ConfigError, match="site column"):
        site_count(DPFedCTGANConfig(sites={"column": continuous}), cardio_schema)
    with pytest.raises(ConfigError, match="exactly one"):
        DPFedCTGANConfig(sites={"iid": 3, "column": target})


def test_a_sites_noisy_counts_are_its_counts_plus_one_gaussian_draw_per_entry(cardio_schema, encoded):
    layout = ConditionLayout.from_groups(TableEncoder(cardio_schema).head_groups())
    rows = torch.from_numpy(encoded[:300])
    exact = exact_counts(rows, layout)
    assert exact[0] == 300 and len(exact) == 1 + layout.width
    for offset, count in zip(layout.offsets, layout.levels, strict=True):
        assert exact[1 + offset : 1 + offset + count].sum() == 300
    std = 3.0 * counts_sensitivity(layout)
    sent = noisy_counts(rows, layout, 3.0, np.random.default_rng(5))
    np.testing.assert_allclose(sent - exact, np.random.default_rng(5).normal(0.0, std, size=exact.shape))
    shares = shares_from_counts(sent, layout)
    for offset, count in zip(layout.offsets, layout.levels, strict=True):
        assert float(shares[offset : offset + count].sum()) == pytest.approx(1.0) and (shares >= 0).all()
    # Different sites' secrets give different noise.
    assert site_secret(SECRET, 0) != site_secret(SECRET, 1)


def test_one_discriminator_update_is_exactly_the_sanitised_mean(cardio_schema, encoded):
    config = DPFedCTGANConfig(
        sample_rate=0.05, noise_multiplier=1.5, clip=0.7, z_dim=8, generator_hidden=(16,), discriminator_hidden=(16,)
    )
    groups = tuple(TableEncoder(cardio_schema).head_groups())
    spec = FedGeneratorSpec(8, (16,), encoded.shape[1], groups)
    layout = spec.layout
    shares = torch.full((layout.width,), 0.5)
    trainer = SiteTrainer(
        torch.from_numpy(encoded[:400]), spec, config, seed=1, site=0, secret=SECRET, shares=shares, noisy_size=410.0
    )
    before = {k: v.detach().clone() for k, v in trainer.discriminator.named_parameters()}
    sgd = torch.optim.SGD(trainer.discriminator.parameters(), lr=1.0)
    rows, parts = trainer.discriminator_step(sgd, RoundStreams.for_round(SECRET, 1, 0, 7), 0)
    # The same draws again, computed by hand: each real row's gradient clipped to C, the noise, the fake sum.
    streams = RoundStreams.for_round(SECRET, 1, 0, 7)
    index = (torch.rand(400, generator=streams.sampling) < 0.05).nonzero().squeeze(1)
    assert rows == index.numel()
    real = trainer.rows[index]
    real_cond = layout.real_conditions(real, index, condition_key(public_seed(1, 0, 7), 0))
    disc = spec.build_discriminator((16,))
    disc.load_state_dict(before)
    expected_batch = 0.05 * 410.0
    real_sum = {k: torch.zeros_like(v) for k, v in before.items()}
    for row, cond in zip(real, real_cond, strict=True):
        disc.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(
            disc(row[None], cond[None]).squeeze(0), torch.tensor(1.0)
        ).backward()
        grads = {k: p.grad.clone() for k, p in disc.named_parameters()}
        norm = math.sqrt(sum(float((g**2).sum()) for g in grads.values()))
        for k in real_sum:
            real_sum[k] += grads[k] * min(1.0, 0.7 / (norm + 1e-6))
    noise = {k: torch.randn(v.shape, generator=streams.noise) * (1.5 * 0.7) for k, v in real_sum.items()}
    for k, p in trainer.discriminator.named_parameters():
        torch.testing.assert_close(parts.real_sum[k], real_sum[k], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(parts.noise[k], noise[k])
        applied = (real_sum[k] + noise[k] + parts.fake_sum[k]) / expected_batch
        torch.testing.assert_close(before[k] - p.detach(), applied, rtol=1e-4, atol=1e-6)
    assert trainer.updates == 1


def test_a_neighbouring_batch_changes_nothing_public_only_the_rows_own_gradient(cardio_schema, encoded):
    """Removing one sampled row (the table's last, so every other row's Poisson draw stays as it was; same
    secret, same seed) leaves the public stream, the fakes and the fake sum bit-identical, and the
    generator step too once the two discriminators agree (they differ by that row's gradient only)."""
    config = DPFedCTGANConfig(
        sample_rate=0.05, noise_multiplier=1.5, clip=0.7, z_dim=8, generator_hidden=(16,), discriminator_hidden=(16,)
    )
    groups = tuple(TableEncoder(cardio_schema).head_groups())
    spec = FedGeneratorSpec(8, (16,), encoded.shape[1], groups)
    shares = torch.full((spec.layout.width,), 0.5)
    n = 400
    round_index = next(
        r for r in range(200) if torch.rand(n, generator=RoundStreams.for_round(SECRET, 1, 0, r).sampling)[-1] < 0.05
    )
    full, neighbour = (
        SiteTrainer(
            torch.from_numpy(rows), spec, config, seed=1, site=0, secret=SECRET, shares=shares, noisy_size=410.0
        )
        for rows in (encoded[:n], encoded[: n - 1])
    )
    neighbour.load(full.generator.state_dict(), full.discriminator.state_dict())
    before = {k: v.detach().clone() for k, v in full.discriminator.state_dict().items()}
    seen = []
    for trainer in (full, neighbour):
        draw_fake, fakes = trainer.draw_fake, []
        trainer.draw_fake = lambda rows, rng, draw=draw_fake, kept=fakes: kept.append(draw(rows, rng)) or kept[-1]
        streams = RoundStreams.for_round(SECRET, 1, 0, round_index)
        rows, parts = trainer.discriminator_step(
            torch.optim.SGD(trainer.discriminator.parameters(), lr=1.0), streams, 0
        )
        seen.append((rows, parts, streams, fakes))
    (rows_a, parts_a, streams_a, fakes_a), (rows_b, parts_b, streams_b, fakes_b) = seen
    assert rows_b == rows_a - 1  # the neighbouring batch: that row only is gone
    assert torch.equal(streams_a.public.get_state(), streams_b.public.get_state())
    for (fake_a, cond_a), (fake_b, cond_b) in zip(fakes_a, fakes_b, strict=True):
        assert torch.equal(fake_a, fake_b) and torch.equal(cond_a, cond_b)
    for k in parts_a.fake_sum:
        assert torch.equal(parts_a.fake_sum[k], parts_b.fake_sum[k])
        assert torch.equal(parts_a.noise[k], parts_b.noise[k])
    # The removed row's own clipped gradient is the whole difference of the real sums.
    disc = spec.build_discriminator((16,))
    disc.load_state_dict(before)
    last = full.rows[n - 1 :]
    cond = spec.layout.real_conditions(last, torch.tensor([n - 1]), condition_key(public_seed(1, 0, round_index), 0))
    own = clipped_sum(per_sample_gradients(disc, last, cond, real=True), 0.7)
    for k in own:
        torch.testing.assert_close(parts_a.real_sum[k] - parts_b.real_sum[k], own[k], rtol=1e-4, atol=1e-6)
    neighbour.discriminator.load_state_dict(full.discriminator.state_dict())
    for trainer, streams in ((full, streams_a), (neighbour, streams_b)):
        trainer.generator_step(torch.optim.Adam(trainer.generator.parameters(), lr=1e-3), streams)
    assert torch.equal(streams_a.public.get_state(), streams_b.public.get_state())
    for (name, a), b in zip(
        full.generator.state_dict().items(), neighbour.generator.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_the_section_rejects_a_remote_federation_without_a_fixed_port():
    with pytest.raises(ConfigError, match="server_port"):
        DPFedCTGANConfig(local_clients=False)
    assert DPFedCTGANConfig(local_clients=False, server_port=9092, server_host="0.0.0.0").server_port == 9092
    assert dataclasses.is_dataclass(RoundStreams)


def test_the_server_averages_by_noisy_size_in_site_order_and_refuses_a_miscounted_round(tmp_path, cardio_schema):
    # The server's arithmetic, without Flower's transport: the sites' replies in the order they arrived.
    from dpsynth.models.generators.dpfedctgan.federation.job import FederationJob, to_arrays
    from dpsynth.models.generators.dpfedctgan.federation.server import (
        FederatedState,
        FederationError,
        SiteReply,
        take_counts,
        take_round,
        train_config,
    )

    config = DPFedCTGANConfig(
        rounds=2, checkpoint_every=1, local_steps=3, z_dim=4, generator_hidden=(8,), discriminator_hidden=(8,)
    )
    groups = tuple(TableEncoder(cardio_schema).head_groups())
    spec = FedGeneratorSpec(4, (8,), groups[-1][1], groups)
    state = FederatedState(FederationJob(config, spec, 0, 2, 2, str(tmp_path)))

    width = 1 + spec.layout.width
    initial = to_arrays(state.generator, state.discriminator)
    take_counts(state, [SiteReply(1, [], {"counts": [300.0] * width}), SiteReply(0, [], {"counts": [100.0] * width})])
    assert state.noisy_sizes == [100.0, 300.0] and state.round == 0
    assert train_config(state)["round"] == 1 and len(train_config(state)["shares"]) == len(state.shares)
    ones, fives = [np.ones_like(a) for a in initial], [np.full_like(a, 5.0) for a in initial]
    take_round(state, [SiteReply(1, fives, {"steps": 3}), SiteReply(0, ones, {"steps": 3})])
    # Site 0 holds a quarter of the noisy rows: 0.25 * 1 + 0.75 * 5, whichever reply came first.
    assert all(np.allclose(a, 4.0) for a in to_arrays(state.generator, state.discriminator))
    assert state.round == 1 and [a.steps for a in state.accountants] == [3, 3]
    # A site that reports other than local_steps fails the round before anything is accounted or averaged.
    with pytest.raises(FederationError, match="site 1 took 2 updates, not 3"):
        take_round(state, [SiteReply(0, ones, {"steps": 3}), SiteReply(1, fives, {"steps": 2})])
    # So does a site that replies twice (another for a missing one).
    with pytest.raises(FederationError, match=r"one reply from each of sites 0..1, got \[1, 1\]"):
        take_round(state, [SiteReply(1, ones, {"steps": 3}), SiteReply(1, fives, {"steps": 3})])
    assert state.round == 1 and [a.steps for a in state.accountants] == [3, 3]


class _SlowSites:
    """A Grid's push and pull (the two calls the ServerApp uses), with every site's reply arriving
    `after_s` after the push, or never for the sites in `silent`."""

    def __init__(self, after_s: float, silent: tuple[int, ...] = ()):
        self.after_s, self.silent = after_s, silent
        self.pushed: dict[str, tuple[int, float]] = {}

    def push_messages(self, messages):
        for message in messages:
            self.pushed[f"m{message.metadata.dst_node_id}"] = (message.metadata.dst_node_id, time.monotonic())
        return list(self.pushed)

    def send_and_receive(self, messages, *, timeout=None):
        """Flower's own loop (flwr/superlink/grid/grpc_grid.py): a pull, then 3 s asleep, until done."""
        waiting, end, replies = set(self.push_messages(messages)), time.time() + (timeout or 0.0), []
        while timeout is None or time.time() < end:
            pulled = self.pull_messages(waiting)
            replies.extend(pulled)
            waiting.difference_update(r.metadata.reply_to_message_id for r in pulled)
            if not waiting:
                break
            time.sleep(3)
        return replies

    def pull_messages(self, message_ids):
        now, replies = time.monotonic(), []
        for mid in message_ids:
            node, at = self.pushed[mid]
            if node not in self.silent and now - at >= self.after_s:
                metadata = SimpleNamespace(reply_to_message_id=mid)
                replies.append(
                    SimpleNamespace(metadata=metadata, has_error=lambda: False, content={"metrics": {"site": node}})
                )
        return replies


def test_the_server_takes_a_rounds_replies_as_they_arrive_not_after_flowers_fixed_3_s_sleep():
    """Flower's Grid.send_and_receive sleeps 3 s between pulls; the ServerApp polls itself, briefly,
    under the same timeout: a site that does not reply within it fails the round."""
    from flwr.app import RecordDict

    from dpsynth.models.generators.dpfedctgan.federation.server import FederationError
    from dpsynth.models.generators.dpfedctgan.federation.server_app import ask

    start = time.monotonic()
    replies = ask(_SlowSites(after_s=0.3), [0, 1], "train", RecordDict(), "round 1", timeout_s=30)  # type: ignore[arg-type]
    assert sorted(r.site for r in replies) == [0, 1] and time.monotonic() - start < 2.5  # Flower's loop: 3 s

    start = time.monotonic()
    with pytest.raises(FederationError, match=r"round 2: 1 of 2 sites failed \(1 did not reply within 0.5 s\)"):
        ask(_SlowSites(after_s=0.0, silent=(1,)), [0, 1], "train", RecordDict(), "round 2", timeout_s=0.5)  # type: ignore[arg-type]
    assert 0.5 <= time.monotonic() - start < 2.5


def test_a_local_sites_supernode_waits_at_most_half_a_second_between_pulls_not_flowers_fixed_3_s(monkeypatch):
    """Flower's SuperNode sleeps 3 s after every pull that brings no message (flwr.supernode.
    start_client_internal): after each round's reply, before the next round's weights. The launcher starts a
    local site's SuperNode through federation/supernode.py, whose sleeps in that module last at most
    PULL_SECONDS; the module's other uses of `time` are Flower's own."""
    import inspect
    import sys

    from flwr.supernode import start_client_internal

    from dpsynth.models.generators.dpfedctgan.federation import supernode
    from dpsynth.models.generators.dpfedctgan.federation.launcher import supernode_argv

    folder = Path("/nonexistent")
    argv = supernode_argv("127.0.0.1:1", folder, 0, folder / "key", SimpleNamespace(ca=folder / "ca"))  # type: ignore[arg-type]
    assert argv[:4] == [sys.executable, "-P", "-m", supernode.__name__]
    assert "time.sleep(3)" in inspect.getsource(start_client_internal)  # the wait this shortens is still there
    monkeypatch.setattr(start_client_internal, "time", time)  # restored after the test
    assert supernode.shorten_sleeps(start_client_internal) and supernode.PULL_SECONDS <= 0.5
    start = time.monotonic()
    start_client_internal.time.sleep(3)
    assert time.monotonic() - start < 1.5
    assert start_client_internal.time.monotonic is time.monotonic
    assert not supernode.shorten_sleeps(SimpleNamespace())  # type: ignore[arg-type]


def test_the_superexecs_ask_for_an_app_to_launch_five_times_a_second_not_once(monkeypatch, tmp_path):
    """Flower's SuperExec (flwr.supercore.superexec.run_superexec), which the SuperLink and each SuperNode start by
    the name `flower-superexec`, sleeps 1 s between its questions for an app to launch: each round's ClientApp
    started up to 1 s late on every site. The launcher's PATH finds the wrapper write_superexec writes first; it
    runs Flower's SuperExec with that module's sleeps at most LAUNCH_POLL_SECONDS."""
    import inspect
    import subprocess

    from flwr.supercore.superexec import run_superexec

    from dpsynth.models.generators.dpfedctgan.federation import supernode

    assert "time.sleep(1)" in inspect.getsource(run_superexec)  # the wait this shortens is still there
    monkeypatch.setattr(run_superexec, "time", time)  # restored after the test
    assert supernode.shorten_sleeps(run_superexec, supernode.LAUNCH_POLL_SECONDS)
    start = time.monotonic()
    run_superexec.time.sleep(1)
    assert time.monotonic() - start < 0.5 and supernode.LAUNCH_POLL_SECONDS <= 0.2

    wrapper = supernode.write_superexec(tmp_path)
    assert wrapper.name == "flower-superexec" and wrapper.stat().st_mode & 0o777 == 0o700
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "FLWR_HOME": str(tmp_path)}
    done = subprocess.run(["flower-superexec", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--plugin-type" in done.stdout, done.stderr  # Flower's own SuperExec answered


def test_flowers_processes_post_neither_telemetry_nor_an_update_check(monkeypatch, tmp_path):
    """Every process the launcher starts gets telemetry_off's environment: Flower's telemetry off, and its
    update check (a POST of Flower's, Python's and the system's versions from every flwr, SuperLink,
    SuperNode and SuperExec process, flwr.supercore.update_check) never started."""
    from flwr.supercore import update_check

    from dpsynth.models.generators.dpfedctgan.federation.job import telemetry_off

    env = telemetry_off({"PATH": "/bin"})
    assert env["FLWR_TELEMETRY_ENABLED"] == "0" and env["PATH"] == "/bin"
    started = []
    monkeypatch.setattr(update_check, "_start_flwr_update_check_refresh_thread", lambda *a, **k: started.append(a))
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))  # no cached check: Flower would start one now
    monkeypatch.delenv("FLWR_DISABLE_UPDATE_CHECK", raising=False)
    update_check.warn_if_flwr_update_available(process_name="flower-supernode")
    assert started  # without the switch, Flower posts
    started.clear()
    for key in ("FLWR_TELEMETRY_ENABLED", "FLWR_DISABLE_UPDATE_CHECK"):
        if key in env:
            monkeypatch.setenv(key, env[key])
    update_check.warn_if_flwr_update_available(process_name="flower-supernode")
    assert started == []
