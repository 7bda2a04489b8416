"""GS-WGAN core: sanitiser, where real data may flow, partition, baseline, resume, budget, pretraining.

Small problems (K <= 4, a few iterations, 2,000 random rows of width 16) so the file runs in seconds.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from dpsynth.models.config import PrivacyConfig, Setting
from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.generators.gswgan import trainer as gswgan
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.devices import _cpu_has_native_bfloat16, pretrain_matmul_dtype
from dpsynth.models.generators.gswgan.generator_files import load_generator, sample_encoded
from dpsynth.models.generators.gswgan.partition import make_partition, sample_local_rows, subset_sizes
from dpsynth.models.generators.gswgan.pretraining import (
    build_pretrain_chunk,
    chunk_generator,
    critic_chunks,
    pretrain_critics,
    pretrain_draws,
)
from dpsynth.models.generators.gswgan.schedule import checkpoint_epsilons
from dpsynth.models.generators.gswgan.trainer import LEDGER_FILE, STATE_FILE, GeneratorTrainer
from dpsynth.models.generators.networks import CriticStack, Generator
from dpsynth.models.generators.sanitizer import clip_rows, sanitize_rows
from dpsynth.models.native import kernels as native_kernels
from dpsynth.models.privacy.budget import Schedule, cut_to_budget
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import TEST_SECRET_HEX

CPU = torch.device("cpu")
N_ROWS, WIDTH = 2000, 16
GAN = GanConfig(iterations=12, checkpoint_every=4, pretrain_iterations=3)
PRIVACY = PrivacyConfig()
SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread, as training and pretraining use on CPU: a fixed summation order (Adam turns
    rounding-level differences of gradients that are zero in exact arithmetic into visible updates), and
    no stalls when other processes load the machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _data(seed: int = 0, rows: int = N_ROWS) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(rows, WIDTH, generator=g) * 2 - 1


def _critics(k: int, gan: GanConfig = GAN, seed: int = 1) -> CriticStack:
    return CriticStack(k, WIDTH, gan.critic_hidden, gan.critic_batchnorm, gan.init, torch.Generator().manual_seed(seed))


def _trainer(
    tmp_path, k=4, setting=None, gan=GAN, privacy=PRIVACY, data=None, critics=None, seed=3, name="run", secret=SECRET
):
    data = _data() if data is None else data
    partition = make_partition(N_ROWS, k, SECRET)
    setting = setting or Setting(f"k{k}", k)
    critics = critics if critics is not None else _critics(k, gan)
    return GeneratorTrainer(data, partition, critics, gan, privacy, setting, [], seed, tmp_path / name, CPU, secret)


def _state(module: nn.Module) -> dict:
    return {k: v.clone() for k, v in module.state_dict().items()}


# ------------------------------------------------------------------------------------------ sanitiser


def test_clip_rows_bounds_every_row_norm():
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(500, WIDTH, generator=g) * torch.logspace(-3, 3, 500).unsqueeze(1)
    for clip in (0.1, 1.0, 3.0):
        clipped = clip_rows(grad, clip)
        norms = clipped.norm(dim=1)
        assert (norms <= clip * (1 + 1e-6)).all()
        inside = grad.norm(dim=1) <= clip
        assert torch.equal(clipped[inside], grad[inside])  # rows inside are untouched
        assert torch.allclose(norms[~inside], torch.full_like(norms[~inside], clip), rtol=1e-5)
        # direction is kept
        cos = nn.functional.cosine_similarity(clipped, grad, dim=1)
        assert torch.allclose(cos, torch.ones_like(cos), atol=1e-5)


@pytest.mark.parametrize("sigma,clip", [(1.07, 1.0), (0.5, 2.0)])
def test_sanitiser_noise_has_std_2_sigma_c(sigma, clip):
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(20000, WIDTH, generator=g) * 5.0
    rng = torch.Generator().manual_seed(2)
    noise = sanitize_rows(grad, clip, sigma, rng) - clip_rows(grad, clip)
    n = noise.numel()
    std = noise.std().item()
    expected = 2.0 * sigma * clip
    # the sample std of 320,000 Gaussian draws is within 5 standard errors (~0.6 %)
    assert abs(std - expected) < 5 * expected / math.sqrt(2 * n)
    assert abs(noise.mean().item()) < 5 * expected / math.sqrt(n)
    # Gaussian tails: about 4.55 % beyond two standard deviations
    assert abs((noise.abs() > 2 * expected).float().mean().item() - 0.0455) < 0.003


def test_sanitised_rows_are_clipped_before_noise_in_training(tmp_path):
    """With a vanishing noise multiplier, the tensor the generator receives has rows of norm <= C."""
    privacy = PrivacyConfig(noise_multiplier=1e-9, clip=0.05)
    trainer = _trainer(tmp_path, privacy=privacy)
    for k in range(4):
        trainer.refresh_critics(k)
        upstream = trainer.generator_step(k)
        assert (upstream.norm(dim=1) <= 0.05 + 1e-6).all()


def test_generator_update_is_computed_from_the_sanitised_tensor_alone(tmp_path):
    trainer = _trainer(tmp_path)
    for _ in range(3):
        trainer.step()
    k = 2
    trainer.refresh_critics(k)
    gen_copy, opt_copy = copy.deepcopy((trainer.generator, trainer.opt_g))
    rng_copy = torch.Generator()
    rng_copy.set_state(trainer.rng.get_state())
    critics_before = [p.clone() for p in trainer.critics.params]
    seen = []
    hook = trainer.generator.register_forward_hook(
        lambda *_: seen.append([p.requires_grad for p in trainer.critics.params])
    )

    sanitised = trainer.generator_step(k)

    hook.remove()
    # The critic is frozen while G runs: no parameter requires or received a gradient.
    assert seen == [[False] * len(critics_before)]
    assert all(not p.requires_grad and p.grad is None for p in trainer.critics.params)
    # What G receives is a constant: no autograd path leads back to the critic or to real rows.
    assert sanitised.grad_fn is None and not sanitised.requires_grad
    # By hand: the same z, G's forward, backward of the sanitised tensor / B, one Adam step.
    z = torch.randn(GAN.batch_size, GAN.z_dim, generator=rng_copy)
    fake = gen_copy(z)
    opt_copy.zero_grad(set_to_none=True)
    fake.backward(sanitised / GAN.batch_size)
    for p, q in zip(trainer.generator.parameters(), gen_copy.parameters(), strict=False):
        assert torch.equal(p.grad, q.grad)
    opt_copy.step()
    for (name, a), b in zip(trainer.generator.state_dict().items(), gen_copy.state_dict().values(), strict=False):
        assert torch.equal(a, b), name
    # The tensor is noisy: it is not the critic's raw gradient.
    rows = fake.detach().clone().requires_grad_(True)
    (raw,) = torch.autograd.grad(-trainer.critics.forward([p[k] for p in critics_before], rows).sum(), rows)
    noise = sanitised - clip_rows(raw, PRIVACY.clip)
    assert noise.abs().max() > 0.1


def test_generator_step_needs_no_real_rows_and_leaves_critics_unchanged(tmp_path):
    """Nothing in the generator step reads the table: with every real row NaN it still updates G finitely,
    and the critics and their optimiser state do not change."""
    trainer = _trainer(tmp_path, data=torch.full((N_ROWS, WIDTH), float("nan")))
    critics = [p.clone() for p in trainer.critics.params]
    moments = [m.clone() for m in trainer.opt_d.exp_avg + trainer.opt_d.exp_avg_sq]
    before = _state(trainer.generator)
    for k in range(4):
        trainer.generator_step(k)
    assert all(torch.equal(a, b) for a, b in zip(critics, trainer.critics.params, strict=False))
    assert all(
        torch.equal(a, b) for a, b in zip(moments, trainer.opt_d.exp_avg + trainer.opt_d.exp_avg_sq, strict=False)
    )
    after = trainer.generator.state_dict()
    assert all(torch.isfinite(v.float()).all() for v in after.values())
    assert any(not torch.equal(before[n], after[n]) for n in before if "weight" in n)


def test_critic_steps_update_only_critic_k_without_sanitising(tmp_path):
    """Critic k's r updates are plain WGAN-GP Adam steps (reproduced here with autograd and
    torch.optim.Adam from the same random draws); the other critics and G's weights do not move.
    The tensor code here; the C kernel computes the same up to rounding (tests/models/test_native_kernels.py)."""
    trainer = _trainer(tmp_path, gan=GAN.replace(kernels="torch"))
    k, r, b = 1, GAN.critic_steps, GAN.batch_size
    before = [p.clone() for p in trainer.critics.params]
    gen_copy = copy.deepcopy(trainer.generator)
    rng_copy = torch.Generator()
    rng_copy.set_state(trainer.rng.get_state())
    gen_weights = {n: p.clone() for n, p in trainer.generator.named_parameters()}

    trainer.refresh_critics(k)

    for j in range(4):
        same = all(torch.equal(a[j], p[j]) for a, p in zip(before, trainer.critics.params, strict=False))
        assert same == (j != k)
    assert all(torch.equal(p, gen_weights[n]) for n, p in trainer.generator.named_parameters())
    # Reference: same draws, autograd WGAN-GP loss, a fresh torch.optim.Adam (no clipping, no noise).
    z = torch.randn(r * b, GAN.z_dim, generator=rng_copy)
    local = sample_local_rows(int(subset_sizes(trainer.partition)[k]), b, rng_copy, (r,))
    alpha = torch.rand(r, b, 1, generator=rng_copy)
    with torch.no_grad():
        fakes = torch.stack([gen_copy(part) for part in z.chunk(r)])
    real = trainer.data[trainer.partition[k][local]]
    params = [p[k].clone().requires_grad_(True) for p in before]
    opt = torch.optim.Adam(params, lr=GAN.lr_critic, betas=GAN.betas)
    for s in range(r):

        def forward(x):
            return trainer.critics.forward(params, x)

        x_hat = (alpha[s] * real[s] + (1 - alpha[s]) * fakes[s]).requires_grad_(True)
        (grad,) = torch.autograd.grad(forward(x_hat).sum(), x_hat, create_graph=True)
        loss = forward(fakes[s]).mean() - forward(real[s]).mean() + GAN.gp_lambda * ((grad.norm(dim=1) - 1) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p, q in zip(trainer.critics.params, params, strict=False):
        assert torch.allclose(p[k], q.detach(), atol=1e-6)


# ------------------------------------------------------------------------------------------ partition


def test_partition_is_disjoint_complete_balanced_and_secret():
    other = PrivacySecret.from_hex("a1" * 32)
    for n, k in ((2000, 3), (2000, 7), (1001, 1000), (50, 50)):
        part = make_partition(n, k, SECRET)
        sizes = subset_sizes(part)
        assert part.shape == (k, -(-n // k)) and sizes.sum() == n
        assert sizes.max() - sizes.min() <= (0 if n % k == 0 else 1)  # sizes floor(n/K) or one more
        flat = part[part >= 0]
        assert np.array_equal(np.sort(flat), np.arange(n))  # disjoint, complete: no row dropped
        for j in range(k):  # padding only at a subset's end
            assert (part[j, : sizes[j]] >= 0).all() and (part[j, sizes[j] :] == -1).all()
        assert np.array_equal(part, make_partition(n, k, SECRET))
    assert not np.array_equal(make_partition(2000, 3, SECRET), make_partition(2000, 3, other))
    with pytest.raises(ConfigError):
        make_partition(10, 11, SECRET)


def _members(partition: np.ndarray, k: int) -> np.ndarray:
    return partition[k][partition[k] >= 0]


def _poison_all_but(k: int, partition: np.ndarray) -> torch.Tensor:
    data = torch.full((N_ROWS, WIDTH), float("nan"))
    clean = _data()
    data[_members(partition, k)] = clean[_members(partition, k)]
    return data


def test_training_reads_real_rows_of_critic_k_only_from_partition_k(tmp_path):
    partition = make_partition(N_ROWS, 4, SECRET)
    trainer = _trainer(tmp_path, data=_poison_all_but(2, partition))
    before = [p[2].clone() for p in trainer.critics.params]
    for _ in range(3):
        trainer.refresh_critics(2)
        trainer.generator_step(2)
    assert all(torch.isfinite(p).all() for p in trainer.critics.params)
    assert not all(torch.equal(a, p[2]) for a, p in zip(before, trainer.critics.params, strict=False))
    trainer.refresh_critics(0)  # the poison is real: another critic does read it
    assert not torch.isfinite(trainer.critics.params[0][0]).all()


@pytest.mark.parametrize("batchnorm", [False, True])
def test_pretraining_critic_k_sees_only_partition_k(batchnorm):
    gan = GanConfig(critic_batchnorm=batchnorm)
    partition = make_partition(N_ROWS, 3, SECRET)
    data = _poison_all_but(1, partition)
    assert data.isnan().any()
    critics = pretrain_critics(data, partition, gan, [], 0, CPU, iterations=3)
    finite = [bool(all(torch.isfinite(p[j]).all() for p in critics.params)) for j in range(3)]
    assert finite == [False, True, False]


def test_local_row_sampling():
    rng = torch.Generator().manual_seed(0)
    idx = sample_local_rows(40, 32, rng, (5, 3))
    assert idx.shape == (5, 3, 32) and idx.min() >= 0 and idx.max() < 40
    assert all(len(set(row.tolist())) == 32 for row in idx.reshape(-1, 32))  # without replacement
    small = sample_local_rows(10, 32, rng, (2,))
    assert small.shape == (2, 32) and small.max() < 10
    large = sample_local_rows(50_000, 32, rng, ())
    assert large.shape == (32,) and large.max() < 50_000
    # Subsets of different sizes (a partition of n rows into K): each within its own size.
    sizes = torch.tensor([33, 40, 34, 39])
    ragged = sample_local_rows(sizes, 32, rng, (4, 6))
    assert ragged.shape == (4, 6, 32)
    for j in range(4):
        assert ragged[j].max() < sizes[j] and all(len(set(r.tolist())) == 32 for r in ragged[j])
    mixed = sample_local_rows(torch.tensor([5, 40]), 32, rng, (2, 3))  # one too small: with replacement
    assert mixed[0].max() < 5 and mixed[1].max() < 40 and mixed.min() >= 0


# ------------------------------------------------------------------------------------------ baseline


def test_baseline_setting_adds_no_noise_and_costs_infinite_epsilon(tmp_path):
    setting = Setting("baseline", 1, private=False)
    trainer = _trainer(tmp_path, k=1, setting=setting)
    trainer.refresh_critics(0)
    gen_copy = copy.deepcopy(trainer.generator)
    rng_copy = torch.Generator()
    rng_copy.set_state(trainer.rng.get_state())
    critic = [p[0].clone() for p in trainer.critics.params]
    upstream = trainer.generator_step(0)
    rows = gen_copy(torch.randn(GAN.batch_size, GAN.z_dim, generator=rng_copy)).detach().requires_grad_(True)
    (raw,) = torch.autograd.grad(-trainer.critics.forward(critic, rows).sum(), rows)
    assert torch.allclose(upstream, raw, atol=1e-6)  # neither clipped nor noised
    assert raw.norm(dim=1).max() > 0
    # the RNG is not used for noise: the next draw equals the copy's next draw
    assert torch.equal(torch.rand(3, generator=trainer.rng), torch.rand(3, generator=rng_copy))
    steps, eps = checkpoint_epsilons(GAN, PRIVACY, setting)
    assert steps[-1] == GAN.iterations and all(math.isinf(e) for e in eps)
    result = trainer.run(8)
    assert all(math.isinf(c["epsilon"]) for c in result.checkpoints)
    assert trainer.accountant.iterations == 0
    ledger = json.loads((tmp_path / "run" / LEDGER_FILE).read_text())
    assert ledger["mechanism"] is None


# ------------------------------------------------------------------------------------------ resume


def _final(trainer_dir) -> tuple[dict, dict]:
    state = torch.load(trainer_dir / STATE_FILE, weights_only=False)
    return state, json.loads((trainer_dir / LEDGER_FILE).read_text())


@pytest.mark.parametrize("stop_after", [6, 8, 1])
@pytest.mark.parametrize("ema", [None, 0.9])
def test_resume_after_interruption_equals_uninterrupted_run(tmp_path, stop_after, ema):
    gan = GanConfig(iterations=12, checkpoint_every=4, generator_ema=ema)
    base = _critics(4, gan)
    full = _trainer(tmp_path, gan=gan, critics=copy.deepcopy(base), name="full")
    full.run(12)

    first = _trainer(tmp_path, gan=gan, critics=copy.deepcopy(base), name="resumed")
    first.run(12, stop_after=stop_after)
    assert first.iteration == stop_after
    del first
    second = _trainer(tmp_path, gan=gan, critics=copy.deepcopy(base), name="resumed")  # fresh objects
    result = second.run(12)
    assert second.iteration == 12

    for a, b in zip(full.generator.state_dict().values(), second.generator.state_dict().values(), strict=False):
        assert torch.equal(a, b)
    state_a, ledger_a = _final(tmp_path / "full")
    state_b, ledger_b = _final(tmp_path / "resumed")
    assert ledger_a == ledger_b
    assert [c["iteration"] for c in result.checkpoints] == [0, 4, 8, 12]
    assert state_a["metrics"] == state_b["metrics"]
    for a, b in zip(state_a["critics"]["params"], state_b["critics"]["params"], strict=False):
        assert torch.equal(a, b)
    for it in (4, 8, 12):
        ga, _ = load_generator(tmp_path / "full" / f"generator_{it:06d}.pt")
        gb, _ = load_generator(tmp_path / "resumed" / f"generator_{it:06d}.pt")
        assert np.array_equal(sample_encoded(ga, 100, seed=1), sample_encoded(gb, 100, seed=1))


@pytest.mark.parametrize("damage", ["truncate", "unhashed", "both"])
def test_damaged_training_state_resumes_from_the_previous_one(tmp_path, damage):
    from dpsynth.models.checkpoint_files import previous, sidecar

    gan = GanConfig(iterations=12, checkpoint_every=4)
    base = _critics(4, gan)
    full = _trainer(tmp_path, gan=gan, critics=copy.deepcopy(base), name="full")
    full.run(12)
    first = _trainer(tmp_path, gan=gan, critics=copy.deepcopy(base), name="resumed")
    first.run(12, stop_after=8)
    state = tmp_path / "resumed" / "training_state.pt"
    if damage in ("truncate", "both"):
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a copy cut short
    if damage in ("unhashed", "both"):
        sidecar(state).unlink()  # killed before its hash
    if damage == "both":
        blob = previous(state).read_bytes()
        previous(state).write_bytes(blob[:-10] + bytes(10))
    second = _trainer(tmp_path, gan=gan, critics=copy.deepcopy(base), name="resumed")
    second.run(12)
    assert any("training_state.pt" in note for note in second.resume_notes)
    expected = "iteration 0" if damage == "both" else "resumed from training_state.prev.pt (iteration 4)"
    assert expected in second.resume_notes[-1]
    # Resumed from an older state (or from scratch) with the same secret: the same run, checkpoint for checkpoint.
    for a, b in zip(full.generator.state_dict().values(), second.generator.state_dict().values(), strict=False):
        assert torch.equal(a, b)
    for it in (4, 8, 12):
        entry = next(e for e in second.ledger if e["iteration"] == it)
        ga, _ = load_generator(tmp_path / "full" / f"generator_{it:06d}.pt")
        gb, _ = load_generator(tmp_path / "resumed" / entry["generator"], sha256=entry["sha256"])
        assert np.array_equal(sample_encoded(ga, 100, seed=1), sample_encoded(gb, 100, seed=1))


def test_a_damaged_generator_checkpoint_is_named_not_loaded(tmp_path):
    from dpsynth.models.errors import StorageError

    trainer = _trainer(tmp_path)
    trainer.run(0)
    entry = trainer.ledger[0]
    path = tmp_path / "run" / entry["generator"]
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(StorageError, match=r"generator_000000\.pt.*SHA-256") as caught:
        load_generator(path, sha256=entry["sha256"])
    assert caught.value.exit_code == 7


def test_finished_run_is_not_trained_again(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.run(8)
    again = _trainer(tmp_path)
    result = again.run(8)
    assert again.iteration == 8 and [c["iteration"] for c in result.checkpoints] == [0, 4, 8]
    for a, b in zip(trainer.generator.state_dict().values(), again.generator.state_dict().values(), strict=False):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------ budget


def planned_iterations(gan, privacy, setting):
    """The last iteration and the epsilons of GS-WGAN's schedule cut at `privacy.epsilon_budget` (the one
    cut, models/privacy/budget.py)."""
    steps, eps = checkpoint_epsilons(gan, privacy, setting)
    budget = privacy.epsilon_budget if setting.private else None
    plan = cut_to_budget(
        Schedule(tuple(steps), tuple(eps), gan.checkpoint_every, "lower the cost"), budget, setting.name
    )
    return plan.last, list(plan.epsilons)


def test_planned_iterations_stops_at_last_checkpoint_under_budget():
    gan = GanConfig(iterations=5000, checkpoint_every=1000)
    setting = Setting("k1500", 1500)
    _, all_eps = planned_iterations(gan, PrivacyConfig(), setting)
    assert all_eps[0] == 0 and all(a < b for a, b in itertools.pairwise(all_eps))
    assert all_eps[1] == pytest.approx(1.34, abs=0.01) and all_eps[5] == pytest.approx(2.99, abs=0.01)
    for budget in (1.34 + 0.01, 2.0, all_eps[3], 2.98, 100.0):
        last, eps = planned_iterations(gan, PrivacyConfig(epsilon_budget=budget), setting)
        assert last % gan.checkpoint_every == 0 and 0 < last <= gan.iterations
        assert eps[-1] <= budget and len(eps) == last // 1000 + 1
        if last < gan.iterations:
            assert all_eps[last // 1000 + 1] > budget  # the next checkpoint would exceed it
    with pytest.raises(BudgetExceededError):
        planned_iterations(gan, PrivacyConfig(epsilon_budget=1.0), setting)
    last, eps = planned_iterations(gan, PrivacyConfig(epsilon_budget=None), setting)
    assert last == 5000 and len(eps) == 6


def test_training_never_passes_the_budget(tmp_path):
    gan = GanConfig(iterations=12, checkpoint_every=4)
    setting = Setting("k4", 4)
    _, all_eps = planned_iterations(gan, PrivacyConfig(), setting)
    budget = (all_eps[2] + all_eps[3]) / 2
    privacy = PrivacyConfig(epsilon_budget=budget)
    last, _ = planned_iterations(gan, privacy, setting)
    assert last == 8
    trainer = _trainer(tmp_path, gan=gan, privacy=privacy, setting=setting)
    result = trainer.run(last)
    assert trainer.iteration == 8 and result.stopped_by_budget
    assert max(c["epsilon"] for c in result.checkpoints) <= budget
    assert result.checkpoints[-1]["epsilon"] == pytest.approx(all_eps[2])


# ------------------------------------------------------------------------------------------ pretraining


def _reference_pretraining(data, partition, gan, seed, iterations, chunk_size):
    """One critic and its own throwaway generator at a time: nn.Modules, autograd, torch.optim.Adam,
    fed with the random draws the batched version makes (official GS-WGAN semantics)."""
    b, r = gan.batch_size, gan.critic_steps
    finals = []
    for index, (start, stop) in enumerate(critic_chunks(partition.shape[0], chunk_size)):
        rng = chunk_generator(seed, index)
        pairs, subset = stop - start, torch.as_tensor(subset_sizes(partition)[start:stop])
        critics, gens = build_pretrain_chunk(pairs, WIDTH, gan, [], rng, CPU)
        draws = [pretrain_draws(rng, pairs, subset, gan) for _ in range(iterations)]
        for j in range(pairs):
            critic = nn.Sequential(
                nn.Linear(WIDTH, gan.critic_hidden), nn.LeakyReLU(0.2), nn.Linear(gan.critic_hidden, 1)
            )
            gen = Generator(gan.z_dim, tuple(gan.generator_hidden), WIDTH)
            with torch.no_grad():
                w1, b1, w2, b2 = (p[j] for p in critics.params)
                critic[0].weight.copy_(w1.T), critic[0].bias.copy_(b1[0])
                critic[2].weight.copy_(w2.T), critic[2].bias.copy_(b2[0])
                linears = [m for m in gen.body if isinstance(m, nn.Linear)]
                norms = [m for m in gen.body if isinstance(m, nn.BatchNorm1d)]
                for i, lin in enumerate(linears):
                    lin.weight.copy_(gens.params[4 * i if i < len(norms) else -2][j].T)
                    lin.bias.copy_(gens.params[4 * i + 1 if i < len(norms) else -1][j][0])
                for i, bn in enumerate(norms):
                    bn.weight.copy_(gens.params[4 * i + 2][j][0])
                    bn.bias.copy_(gens.params[4 * i + 3][j][0])
            opt_d = torch.optim.Adam(critic.parameters(), lr=gan.lr_critic, betas=gan.betas)
            opt_g = torch.optim.Adam(gen.parameters(), lr=gan.lr_generator, betas=gan.betas)
            rows = data[torch.as_tensor(_members(partition, start + j))]
            for z, local, alpha in draws:
                for s in range(r):
                    with torch.no_grad():
                        fake = gen(z[j, s * b : (s + 1) * b])
                    real = rows[local[j, s]]
                    x_hat = (alpha[j, s] * real + (1 - alpha[j, s]) * fake).requires_grad_(True)
                    (grad,) = torch.autograd.grad(critic(x_hat).sum(), x_hat, create_graph=True)
                    gp = ((grad.norm(dim=1) - 1) ** 2).mean()
                    loss = critic(fake).mean() - critic(real).mean() + gan.gp_lambda * gp
                    opt_d.zero_grad()
                    loss.backward()
                    opt_d.step()
                for p in critic.parameters():
                    p.requires_grad_(False)
                g_loss = -critic(gen(z[j, r * b :])).mean()
                opt_g.zero_grad()
                g_loss.backward()
                opt_g.step()
                for p in critic.parameters():
                    p.requires_grad_(True)
            finals.append([critic[0].weight.T, critic[0].bias[None], critic[2].weight.T, critic[2].bias[None]])
    return [torch.stack([f[i].detach() for f in finals]) for i in range(4)]


@pytest.mark.parametrize("chunk_size", [3, 2])
def test_batched_pretraining_equals_per_critic_reference(chunk_size):
    # The tensor code's formulas and precision (the C kernel's rounding: tests/models/test_native_kernels.py).
    gan = GanConfig(pretrain_matmul="float32", kernels="torch")
    data = _data()
    partition = make_partition(N_ROWS, 3, SECRET)
    iterations = 4
    initial = build_pretrain_chunk(3, WIDTH, gan, [], chunk_generator(0, 0), CPU)[0].params
    critics = pretrain_critics(data, partition, gan, [], 0, CPU, iterations=iterations, chunk_size=chunk_size)
    reference = _reference_pretraining(data, partition, gan, 0, iterations, chunk_size)
    for got, want in zip(critics.params, reference, strict=False):
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    if chunk_size == 3:  # the critics moved much more than the tolerance
        assert max((a - b).abs().max().item() for a, b in zip(critics.params[:3], initial[:3], strict=False)) > 1e-4


def test_bfloat16_pretraining_stays_within_rounding_of_the_float32_reference():
    """Mixed precision changes only the rounding of the throwaway generators' products: after 20
    iterations the critics sit within 5% of how far they moved from the float32 reference."""
    gan = GanConfig(pretrain_matmul="bfloat16", kernels="torch")
    data = _data()
    partition = make_partition(N_ROWS, 3, SECRET)
    iterations = 20
    initial = build_pretrain_chunk(3, WIDTH, gan, [], chunk_generator(0, 0), CPU)[0].params
    critics = pretrain_critics(data, partition, gan, [], 0, CPU, iterations=iterations, chunk_size=3)
    reference = _reference_pretraining(data, partition, gan, 0, iterations, 3)
    for got, want, start in zip(critics.params[:3], reference, initial, strict=False):
        moved = (want - start).abs().max().item()
        assert moved > 1e-3
        assert (got - want).abs().max().item() <= 0.05 * moved


def test_auto_pretraining_precision_is_bfloat16_only_where_native():
    auto = GanConfig()
    assert pretrain_matmul_dtype(auto, "cuda") is None
    native = _cpu_has_native_bfloat16()
    assert pretrain_matmul_dtype(auto, "cpu") == (torch.bfloat16 if native else None)
    assert pretrain_matmul_dtype(GanConfig(pretrain_matmul="float32"), "cpu") is None
    assert pretrain_matmul_dtype(GanConfig(pretrain_matmul="bfloat16"), "cuda") == torch.bfloat16


def test_pretraining_is_deterministic_and_independent_of_workers():
    data = _data()
    partition = make_partition(N_ROWS, 4, SECRET)
    torch.set_num_threads(2)  # pretraining uses one intra-op thread per worker whatever this says
    runs = [
        pretrain_critics(data, partition, GAN, [], 0, CPU, iterations=2, chunk_size=1, workers=w) for w in (1, 2, 2, 3)
    ]
    assert torch.get_num_threads() == 2
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0].params, run.params, strict=False))
    other = pretrain_critics(data, partition, GAN, [], 1, CPU, iterations=2, chunk_size=1)
    assert not torch.equal(other.params[0], runs[0].params[0])


INTERRUPTED_PRETRAINING = """
import signal, sys, torch
# Ctrl-C as in a terminal: a process started with SIGINT ignored (a test worker's child can be) never
# installs Python's KeyboardInterrupt handler by itself.
signal.signal(signal.SIGINT, signal.default_int_handler)
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.partition import make_partition
from dpsynth.models.generators.gswgan.pretraining import pretrain_critics
from dpsynth.models.privacy.secret import PrivacySecret
data = torch.rand(400, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
partition = make_partition(400, 6, PrivacySecret(bytes(32)))
def shown(done):
    print(done, flush=True)
try:
    pretrain_critics(data, partition, GanConfig(), [], 0, "cpu", iterations=10**7, chunk_size=1, workers=2,
                     progress=shown)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_an_interrupted_pretraining_stops_instead_of_finishing_its_chunks():
    """Ctrl-C or SIGTERM while the critics pretrain in worker threads: the running chunks stop at their
    next iteration and the queued ones never start. Before, the thread pool's exit waited for every
    chunk's whole pretraining, so a stopped release went on pretraining for hours (K = 1000)."""
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED_PRETRAINING], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        first = child.stdout.readline()  # an iteration of every pair done: the threads are at work
        assert first.strip().isdigit(), first
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)  # a hang guard: it stops within a second or two
    finally:
        child.kill()
    assert out.split()[-1] == "interrupted"
    assert child.returncode == 0


def test_pretraining_progress_and_critic_stack_round_trip():
    data = _data()
    partition = make_partition(N_ROWS, 5, SECRET)
    seen = []
    critics = pretrain_critics(data, partition, GAN, [], 0, CPU, iterations=3, chunk_size=2, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 3 and len(set(seen)) == len(seen)
    assert critics.k == 5 and critics.params[0].shape == (5, WIDTH, GAN.critic_hidden)
    loaded = CriticStack(1, WIDTH, GAN.critic_hidden, False, "default", torch.Generator().manual_seed(0))
    loaded.load_state_dict(critics.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(loaded.params, critics.params, strict=False))


@pytest.mark.parametrize("head", ["tanh", "typed"])
def test_training_with_batchnorm_critics_and_typed_head_is_deterministic(tmp_path, head):
    gan = GanConfig(iterations=4, checkpoint_every=2, critic_batchnorm=True, output_head=head)
    groups = [(0, 1), (1, 4), (4, 16)]
    partition = make_partition(N_ROWS, 3, SECRET)
    critics = pretrain_critics(_data(), partition, gan, groups, 0, CPU, iterations=2)
    results = []
    for name in ("a", "b"):
        trainer = GeneratorTrainer(
            _data(),
            partition,
            copy.deepcopy(critics),
            gan,
            PRIVACY,
            Setting("k3", 3),
            groups,
            3,
            tmp_path / name,
            CPU,
            SECRET,
        )
        trainer.run(4)
        results.append(sample_encoded(trainer.generator, 50, seed=0))
    assert np.array_equal(*results) and np.isfinite(results[0]).all()


# ------------------------------------------------------------------------------------------ conditional G


def _labelled_data(seed: int = 0, rows: int = N_ROWS) -> torch.Tensor:
    """Column 0 is a balanced +-1 target; column 1 follows it (0.6 y + noise); the rest is noise."""
    g = torch.Generator().manual_seed(seed)
    data = torch.rand(rows, WIDTH, generator=g) * 2 - 1
    y = torch.where(torch.rand(rows, generator=g) < 0.5, 1.0, -1.0)
    data[:, 0] = y
    data[:, 1] = 0.6 * y + 0.2 * (torch.rand(rows, generator=g) * 2 - 1)
    return data


def test_conditional_training_sanitises_the_generated_columns_only(tmp_path):
    gan = GAN.replace(condition_on_target=True)
    privacy = PrivacyConfig(noise_multiplier=1e-9, clip=0.05)
    partition = make_partition(N_ROWS, 4, SECRET)
    trainer = GeneratorTrainer(
        _labelled_data(),
        partition,
        _critics(4, gan),
        gan,
        privacy,
        Setting("k4", 4),
        [],
        3,
        tmp_path / "run",
        CPU,
        SECRET,
        condition=(0, 0.5),
    )
    trainer.run(0)  # writes checkpoint 0
    for k in range(4):
        trainer.refresh_critics(k)
        upstream = trainer.generator_step(k)
        assert (upstream.norm(dim=1) <= 0.05 + 1e-6).all()
        assert upstream[:, 0].abs().max() < 1e-6  # the label column takes no share of the clipping norm
    blob = torch.load(tmp_path / "run" / "generator_000000.pt", weights_only=False)
    assert blob["spec"]["condition"] == [0, 0.5]
    gen, _ = load_generator(tmp_path / "run" / "generator_000000.pt")
    assert gen.condition == (0, 0.5)


def test_tiny_multi_critic_run_produces_both_target_classes_and_learns_the_label(tmp_path):
    """Issue 7's failure was a many-critic run whose target collapsed to one class. A conditional
    generator keeps both classes at the public prior, and must still learn how a feature depends on the
    label from several critics that each see a small subset."""
    gan = GanConfig(
        pretrain_iterations=30,
        iterations=400,
        checkpoint_every=400,
        condition_on_target=True,
        output_head="typed",
        critic_refresh_steps=10,
        generator_ema=0.99,
        lr_generator=1e-3,
        lr_critic=1e-3,
    )
    data = _labelled_data()
    partition = make_partition(N_ROWS, 8, SECRET)
    condition = (0, 0.5)
    critics = pretrain_critics(data, partition, gan, [], 0, CPU, condition=condition)
    trainer = GeneratorTrainer(
        data,
        partition,
        critics,
        gan,
        PRIVACY,
        Setting("k8", 8, private=False),
        [],
        3,
        tmp_path / "run",
        CPU,
        SECRET,
        condition=condition,
    )
    before = sample_encoded(trainer.released_generator(), 4000, seed=5)
    for _ in range(gan.iterations):
        trainer.step(wasserstein=False)
    rows = sample_encoded(trainer.released_generator(), 4000, seed=5)
    label = rows[:, 0] > 0
    assert 0.45 < label.mean() < 0.55
    gap = rows[label, 1].mean() - rows[~label, 1].mean()  # real data: 1.2
    gap_before = before[before[:, 0] > 0, 1].mean() - before[before[:, 0] <= 0, 1].mean()
    print(f"label gap before {gap_before:.3f}, after {gap:.3f}")
    assert gap > 0.6 and abs(gap_before) < 0.3


@pytest.mark.skipif(not native_kernels.available(), reason="no C compiler here")
def test_refresh_split_over_threads_changes_no_number(tmp_path, monkeypatch):
    """The C refresh of a step's drawn critics split over two threads gives exactly the single thread's
    critics and generator: every drawn critic is updated independently."""
    monkeypatch.setattr(gswgan, "SPLIT_REFRESH_MIN", 0)  # split even these narrow critics
    gan = GanConfig(iterations=6, checkpoint_every=6, kernels="native")
    base = _critics(16, gan)
    trainers = []
    for workers in (1, 2):
        trainer = _trainer(tmp_path, k=16, gan=gan, critics=copy.deepcopy(base), name=f"w{workers}")
        trainer.refresh_workers = workers
        trainer.run(6)
        trainers.append(trainer)
    one, two = trainers
    for a, b in zip(one.generator.state_dict().values(), two.generator.state_dict().values(), strict=False):
        assert torch.equal(a, b)
    for a, b in zip(one.critics.params, two.critics.params, strict=False):
        assert torch.equal(a, b)


def _uneven_trainer(tmp_path, secret: PrivacySecret, name: str, gan: GanConfig = GAN, k: int = 64):
    """K = 64 > B, so the number of distinct critics a step draws varies, and subsets of 32 and 33 rows, so
    whether a larger one is among them varies too."""
    rows = 64 * 32 + 10
    partition = make_partition(rows, k, secret)
    assert sorted(set(subset_sizes(partition).tolist())) == [32, 33]
    return GeneratorTrainer(
        _data(rows=rows),
        partition,
        _critics(k, gan),
        gan,
        PRIVACY,
        Setting(f"k{k}", k),
        [],
        3,
        tmp_path / name,
        CPU,
        secret,
    )


@pytest.mark.parametrize("refresh", ["independent", "drawn"])
def test_the_seeded_stream_advances_the_same_whatever_the_secret_draws(tmp_path, refresh):
    """The latents the released generator is trained on come from the seeded stream; if how far a step
    advanced it depended on the secret critic draws (how many distinct critics, whether a larger subset
    is among them), later latents would carry those draws outside the sanitised rows."""
    gan = GAN.replace(critic_refresh=refresh, kernels="torch")
    secrets_ = [SECRET, PrivacySecret.from_hex("ab" * 32)]
    first_draws = [_uneven_trainer(tmp_path, s, f"draws{i}", gan).draw_critics() for i, s in enumerate(secrets_)]
    assert torch.unique(first_draws[0]).numel() != torch.unique(first_draws[1]).numel()
    states = []
    for i, secret in enumerate(secrets_):
        trainer = _uneven_trainer(tmp_path, secret, f"run{i}", gan)
        after_each = []
        for _ in range(3):
            trainer.step(wasserstein=False)
            after_each.append(trainer.rng.get_state())
        states.append(torch.stack(after_each))
    assert torch.equal(states[0], states[1])


def test_the_refresh_schedule_is_independent_of_the_query_draws(tmp_path):
    """per_step: one query draw and one refresh slot per step, K = 10. Independent streams give a
    contingency table of (queried, refreshed) with no association; refreshing the queried critic
    (official GS-WGAN) puts every step on the diagonal, which the same test rejects."""
    from scipy.stats import chi2_contingency

    steps, k = 3000, 10
    for refresh in ("independent", "drawn"):
        gan = GAN.replace(critic_draw="per_step", critic_refresh=refresh)
        trainer = _trainer(tmp_path, k=k, gan=gan, name=refresh)
        table = np.zeros((k, k))
        for _ in range(steps):
            drawn = trainer.draw_critics()
            slots = trainer.draw_refreshed(drawn)
            assert slots.numel() == 1 and drawn.numel() == GAN.batch_size
            table[int(drawn[0]), int(slots[0])] += 1
        p_value = chi2_contingency(table)[1]
        if refresh == "independent":
            assert p_value > 1e-3
            assert np.trace(table) < 0.15 * steps
        else:
            assert p_value < 1e-12 and np.trace(table) == steps
    per_row = _trainer(tmp_path, k=k, name="per_row")
    assert per_row.draw_refreshed(per_row.draw_critics()).numel() == GAN.batch_size


def test_a_critic_named_by_several_slots_is_refreshed_once_from_its_first_slot():
    slots = torch.tensor([4, 1, 4, 0, 1, 4])
    drawn, first = gswgan._first_slots(slots)
    assert drawn.tolist() == [0, 1, 4] and first.tolist() == [3, 1, 0]
