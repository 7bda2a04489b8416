"""The C critic kernel (models/critic_kernel.py) against the tensor code it replaces: the same
gradients up to float32 rounding, torch's Adam update, exact zeros kept, and whole pretraining and
training visits within rounding of the tensor code; and how `gan.critic_kernel` is resolved."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from models import critic_kernel
from models.config import GanConfig, PrivacyConfig, Setting
from models.critic_kernel import NativeKernelError, critic_updates, step_gradients, use_native
from models.errors import ConfigError
from models.gswgan import GeneratorTrainer, build_pretrain_chunk, chunk_generator, make_partition, pretrain_critics
from models.networks import CriticStack, StackedAdam

pytestmark = pytest.mark.skipif(not critic_kernel.available(), reason="no C compiler builds the kernel here")

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _critic(k: int, width: int, hidden: int, seed: int = 0) -> CriticStack:
    return CriticStack(k, width, hidden, False, "default", torch.Generator().manual_seed(seed))


def _rows(shape, seed: int) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize("batch,width,hidden", [(32, 16, 128), (5, 7, 32), (8, 19, 48)])
def test_step_gradients_equal_the_tensor_code(batch, width, hidden):
    """Shapes the vector code handles in blocks and in remainders (batch and width not multiples of 4
    or 16): gradients and the Wasserstein estimate agree with `loss_grads_rows` to float32 rounding."""
    critic = _critic(1, width, hidden)
    rows = _rows((1, 2 * batch, width), 1)
    alpha = torch.rand(1, batch, 1, generator=torch.Generator().manual_seed(2))
    want, w_want = critic.loss_grads_rows(critic.params, rows, CriticStack.weighted_rows(rows), alpha, 10.0,
                                          wasserstein=True)
    got, w_got = step_gradients(critic.params, rows[0], alpha[0], 10.0)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-6), (g - w).abs().max()
    assert w_got == pytest.approx(float(w_want[0]), rel=1e-4, abs=1e-6)


def test_adam_update_is_torch_adam_on_the_kernel_gradients():
    critic = _critic(1, 16, 128)
    params = [p.clone() for p in critic.params]
    opt = StackedAdam(critic.trainable(params), 1e-3, (0.5, 0.9))
    for t in range(3):   # some history in the moments first
        rows, alpha = _rows((2 * 32, 16), 10 + t), torch.rand(32, 1, generator=torch.Generator().manual_seed(t))
        grads, _ = step_gradients(params, rows, alpha, 10.0)
        expected = [p.clone() for p in params]
        moments = ([m.clone() for m in opt.exp_avg], [v.clone() for v in opt.exp_avg_sq])
        torch._fused_adam_(expected[:3], grads, *moments, [], [torch.tensor(float(t + 1))] * 3, lr=1e-3,
                           beta1=0.5, beta2=0.9, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        critic_updates(params, opt.exp_avg, opt.exp_avg_sq, opt.steps, rows[None, None], alpha[None, None], 1e-3,
                       (0.5, 0.9), 1e-8, 10.0)
        opt.steps += 1
        for got, want in zip(params[:3] + opt.exp_avg + opt.exp_avg_sq, expected[:3] + moments[0] + moments[1]):
            assert torch.allclose(got, want, rtol=1e-6, atol=1e-9)
    assert torch.equal(params[3], critic.params[3])   # the output bias is not trained


def test_an_exactly_zero_bias_gradient_stays_zero():
    """Every unit active on every row: the Wasserstein part of b1's gradient is exactly zero (the same
    sum over the fake and the real rows), so Adam must leave b1 exactly where it was."""
    critic = _critic(1, 16, 128)
    critic.params[1].fill_(50.0)
    rows, alpha = _rows((2 * 32, 16), 3), torch.rand(32, 1, generator=torch.Generator().manual_seed(4))
    grads, _ = step_gradients(critic.params, rows, alpha, 10.0)
    assert torch.count_nonzero(grads[1]) == 0
    opt = StackedAdam(critic.trainable(critic.params), 1e-4, (0.5, 0.9))
    critic_updates(critic.params, opt.exp_avg, opt.exp_avg_sq, opt.steps, rows[None, None], alpha[None, None],
                   1e-4, (0.5, 0.9), 1e-8, 10.0)
    assert torch.all(critic.params[1] == 50.0)


def test_native_pretraining_stays_within_rounding_of_the_tensor_code():
    """Both kernels from the same draws: after 20 iterations the critics sit within 5% of how far they
    moved (a rounding difference that Adam amplifies near zero gradients, not another algorithm)."""
    data = _rows((2000, 16), 0)
    partition = make_partition(2000, 3, seed=7)
    runs = {}
    for kernel in ("torch", "native"):
        gan = GanConfig(pretrain_matmul="float32", critic_kernel=kernel)
        runs[kernel] = pretrain_critics(data, partition, gan, [], 0, CPU, iterations=20, chunk_size=3).params
    initial = build_pretrain_chunk(3, 16, GanConfig(), [], chunk_generator(0, 0), CPU)[0].params
    for got, want, start in zip(runs["native"][:3], runs["torch"][:3], initial):
        moved = (want - start).abs().max().item()
        assert moved > 1e-3
        assert (got - want).abs().max().item() <= 0.05 * moved


def test_native_training_visit_stays_within_rounding_of_the_tensor_code(tmp_path):
    """One training visit (r updates of critic k and its estimate) with either kernel, same draws."""
    data = _rows((2000, 16), 0)
    partition = make_partition(2000, 4, seed=7)
    results = {}
    for kernel in ("torch", "native"):
        gan = GanConfig(iterations=4, checkpoint_every=4, critic_refresh_steps=20, critic_kernel=kernel)
        critics = _critic(4, 16, gan.critic_hidden, seed=5)
        trainer = GeneratorTrainer(data, partition, critics, gan, PrivacyConfig(), Setting("k4", 4), [], 3,
                                   tmp_path / kernel, CPU)
        assert trainer.native_critics == (kernel == "native")
        estimate = trainer.critic_steps(2, wasserstein=True)
        results[kernel] = ([p.clone() for p in trainer.critics.params], float(estimate), trainer.opt_d.steps.copy())
    start = _critic(4, 16, GanConfig().critic_hidden, seed=5).params
    (native, w_native, steps_native), (ref, w_ref, steps_ref) = results["native"], results["torch"]
    np.testing.assert_array_equal(steps_native, steps_ref)
    for got, want, s in zip(native[:3], ref[:3], start):
        assert torch.equal(got[[0, 1, 3]], s[[0, 1, 3]])   # only critic 2 moves
        moved = (want[2] - s[2]).abs().max().item()
        assert moved > 1e-3
        assert (got[2] - want[2]).abs().max().item() <= 0.05 * moved
    assert w_native == pytest.approx(w_ref, rel=0.05)


def test_kernel_choice():
    plain = _critic(1, 16, 128).params
    assert use_native("auto", plain, False) and use_native("native", plain, False)
    assert not use_native("torch", plain, False)
    assert not use_native("auto", plain, batchnorm=True)              # BatchNorm critics: autograd
    assert not use_native("auto", _critic(1, 16, 40).params, False)   # hidden width not a multiple of 16
    with pytest.raises(ConfigError, match="critic_kernel 'native' needs"):
        use_native("native", plain, batchnorm=True)
    with pytest.raises(ConfigError, match="critic_kernel must be one of"):
        use_native("fast", plain, False)


def test_without_a_compiler_auto_falls_back_and_native_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(critic_kernel, "_library", None)
    monkeypatch.setattr(critic_kernel, "_build_error", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("DPSYNTH_NATIVE_CACHE", str(tmp_path / "cache"))
    plain = _critic(1, 16, 128).params
    assert not use_native("auto", plain, False)
    with pytest.raises(NativeKernelError, match="no C compiler .* on PATH.*'auto' or 'torch'"):
        use_native("native", plain, False)
    assert isinstance(NativeKernelError("x"), ConfigError)   # the command line shows it without a traceback


def test_the_library_is_built_once_per_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(critic_kernel, "_library", None)
    monkeypatch.setattr(critic_kernel, "_build_error", None)
    monkeypatch.setenv("DPSYNTH_NATIVE_CACHE", str(tmp_path))
    assert critic_kernel.available()
    built = list(tmp_path.glob("critic_updates-*.so"))
    assert len(built) == 1 and not list(tmp_path.glob("*.so.tmp*"))
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(critic_kernel, "_library", None)
    assert critic_kernel.available()
    assert built[0].stat().st_mtime_ns == stamp and len(list(tmp_path.glob("*.so"))) == 1


def test_a_training_profile_accepts_only_known_kernels():
    from models.config import Profile
    with pytest.raises(ConfigError, match="critic_kernel"):
        Profile(name="p", settings=(Setting("k4", 4),), gan=dataclasses.replace(GanConfig(), critic_kernel="gpu"))
