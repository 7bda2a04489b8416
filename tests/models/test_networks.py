"""Stacked networks: hand-written gradients against autograd, chunked forwards against separate calls,
the stacked Adam against torch.optim.Adam."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dpsynth.models.generators.networks import (
    CriticStack,
    Generator,
    GeneratorStack,
    StackedAdam,
    apply_head,
    draw_latent,
    head_noise_width,
)

GROUPS = [(0, 1, "binary"), (1, 4, "categorical"), (4, 5, "continuous"), (5, 8, "categorical")]


def _rng(seed=0):
    return torch.Generator().manual_seed(seed)


def _reference_critic_grads(stack: CriticStack, params, real, fake, alpha, gp_lambda):
    """The textbook WGAN-GP loss with autograd's double backward (the original implementation)."""
    leaves = [p.detach().clone().requires_grad_(True) for p in params]

    def forward(x):
        return stack.forward(leaves, x)

    x_hat = (alpha * real + (1.0 - alpha) * fake).requires_grad_(True)
    (grad,) = torch.autograd.grad(forward(x_hat).sum(), x_hat, create_graph=True)
    gp = ((grad.norm(dim=-1) - 1.0) ** 2).mean(dim=-1)
    d_real, d_fake = forward(real).mean(1), forward(fake).mean(1)
    loss = (d_fake - d_real + gp_lambda * gp).sum()
    grads = torch.autograd.grad(loss, leaves)
    return [g.detach() for g in grads], (d_real - d_fake).detach()


@pytest.mark.parametrize("batchnorm", [False, True])
@pytest.mark.parametrize("scheme", ["default", "thesis"])
def test_critic_loss_grads_match_autograd(batchnorm, scheme):
    stack = CriticStack(4, 16, 32, batchnorm, scheme, _rng(1))
    g = _rng(2)
    real = torch.rand(4, 8, 16, generator=g) * 2 - 1
    fake = torch.rand(4, 8, 16, generator=g) * 2 - 1
    alpha = torch.rand(4, 8, 1, generator=g)
    grads, w = stack.loss_grads(stack.params, real, fake, alpha, 10.0, wasserstein=True)
    ref, ref_w = _reference_critic_grads(stack, stack.params, real, fake, alpha, 10.0)
    # The output bias is not trained: its true gradient is zero.
    assert torch.count_nonzero(ref[-1]) == 0
    assert len(grads) == len(ref) - 1
    for got, want in zip(grads, ref[:-1], strict=False):
        scale = want.abs().max().item()
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5 * max(scale, 1.0))
    assert torch.allclose(w, ref_w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batchnorm", [False, True])
def test_critic_input_grad_matches_autograd(batchnorm):
    stack = CriticStack(3, 16, 32, batchnorm, "default", _rng(3))
    x = (torch.rand(3, 8, 16, generator=_rng(4)) * 2 - 1).requires_grad_(True)
    (want,) = torch.autograd.grad(stack.forward(stack.params, x).sum(), x)
    got = stack.input_grad(stack.params, x.detach())
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_critic_stack_rows_equal_independent_modules():
    """Each network of the stack is the plain module Linear -> LeakyReLU -> Linear."""
    stack = CriticStack(3, 16, 32, False, "default", _rng(5))
    x = torch.rand(3, 8, 16, generator=_rng(6))
    out = stack.forward(stack.params, x)
    for j in range(3):
        w1, b1, w2, b2 = (p[j] for p in stack.params)
        module = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
        with torch.no_grad():
            module[0].weight.copy_(w1.T)
            module[0].bias.copy_(b1[0])
            module[2].weight.copy_(w2.T)
            module[2].bias.copy_(b2[0])
        assert torch.allclose(out[j], module(x[j]).squeeze(-1), atol=1e-6)


@pytest.mark.parametrize("head", ["tanh", "typed", "gumbel"])
@pytest.mark.parametrize("condition", [None, (0, 0.5)])
def test_generator_stack_backward_matches_autograd(head, condition):
    gens = GeneratorStack(3, 8, (16, 32), 8, head, GROUPS, "default", _rng(7), condition=condition)
    chunks, batch = 3, 6
    z = draw_latent((3, chunks * batch), 8, condition, _rng(8), head_noise_width(head, 8))
    dout = torch.randn(3, batch, 8, generator=_rng(9))
    leaves = [p.clone().requires_grad_(True) for p in gens.params]
    out_ref = gens.forward(leaves, z, chunks)
    grads_ref = torch.autograd.grad((out_ref[:, -batch:] * dout).sum(), gens.trainable(leaves))

    out, saved = gens.forward_train(gens.params, z, chunks)
    assert torch.allclose(out, out_ref, atol=1e-5)
    grads = gens.backward(gens.params, saved, dout)
    assert len(grads) == len(grads_ref)
    for got, want in zip(grads, grads_ref, strict=False):
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("condition", [None, (0, 0.5)])
def test_generator_stack_bfloat16_products_round_only(condition):
    """With bfloat16 products the forward pass is the float32 one up to bfloat16 rounding (8 bits of
    mantissa): close, but not bit-equal, so the lower precision is really used."""
    gens = GeneratorStack(
        3, 8, (16, 32), 8, "tanh", GROUPS, "default", _rng(7), condition=condition, matmul_dtype=torch.bfloat16
    )
    z = draw_latent((3, 4 * 16), 8, condition, _rng(8))
    out, _ = gens.forward_train(gens.params, z, 4)
    want = gens.forward(gens.params, z, 4)
    error = (out - want).abs().max().item()
    assert 0.0 < error < 0.05
    assert out.dtype == torch.float32


def test_generator_stack_pre_batchnorm_bias_is_inert():
    gens = GeneratorStack(2, 8, (16,), 4, "tanh", [], "default", _rng(10))
    z = torch.randn(2, 12, 8, generator=_rng(11))
    before = gens.forward(gens.params, z, 2)
    shifted = [p.clone() for p in gens.params]
    shifted[1] += 3.0
    assert torch.allclose(gens.forward(shifted, z, 2), before, atol=1e-5)


@pytest.mark.parametrize("head", ["tanh", "typed", "gumbel"])
@pytest.mark.parametrize("condition", [None, (4, 0.3)])
def test_generator_forward_chunks_equals_separate_calls(head, condition):
    gen = Generator(8, (16, 32), 8, head, GROUPS, condition)
    twin = copy.deepcopy(gen)
    z = gen.latent(4 * 10, _rng(12))
    with torch.no_grad():
        got = gen.forward_chunks(z, 4)
        want = torch.cat([twin(part) for part in z.chunk(4)])
    assert torch.allclose(got, want, atol=1e-5)
    for name, buf in gen.state_dict().items():
        assert torch.allclose(buf.double(), twin.state_dict()[name].double(), atol=1e-6), name


def test_unconditional_latent_is_plain_normal_noise():
    assert torch.equal(Generator(8, (16,), 8).latent(20, _rng(3)), torch.randn(20, 8, generator=_rng(3)))


def test_conditional_generator_copies_its_label_into_the_target_column():
    gen = Generator(8, (16,), 8, "typed", GROUPS, condition=(4, 0.3))
    z = gen.latent(4000, _rng(14))
    assert z.shape == (4000, 9) and set(z[:, -1].tolist()) == {-1.0, 1.0}
    assert (z[:, -1] > 0).float().mean().item() == pytest.approx(0.3, abs=0.03)
    z.requires_grad_(True)
    out = gen(z)
    assert torch.equal(out[:, 4], z[:, -1].detach())
    # No gradient reaches G's parameters through the label column: it is an input, not generated.
    weights = torch.zeros(8)
    weights[4] = 1.0
    grads = torch.autograd.grad((out * weights).sum(), list(gen.parameters()), allow_unused=True)
    assert all(g is None or torch.count_nonzero(g) == 0 for g in grads)
    with pytest.raises(RuntimeError):
        gen(torch.randn(5, 8))  # an unconditional input does not fit


def test_gumbel_head_samples_levels_with_the_softmax_probabilities():
    """Relaxed samples: near-hard +-1 values whose levels follow softmax(logits) for a one-hot group and
    sigmoid(logit) for a binary column, while continuous columns keep Tanh."""
    n = 20000
    logits = torch.zeros(n, 8)
    logits[:, 0] = 1.0  # binary: P(+1) = sigmoid(1) = 0.731
    logits[:, 1:4] = torch.tensor([0.0, 1.0, -1.0])  # group: softmax = 0.245, 0.665, 0.090
    logits[:, 4] = 0.3
    noise = torch.rand(n, 8, generator=_rng(15))
    out = apply_head(logits, "gumbel", GROUPS, noise)
    assert (out[:, 0] > 0).float().mean().item() == pytest.approx(0.731, abs=0.015)
    shares = torch.bincount(out[:, 1:4].argmax(1), minlength=3).float() / n
    assert torch.allclose(shares, torch.softmax(torch.tensor([0.0, 1.0, -1.0]), 0), atol=0.015)
    assert (out[:, 1:4].max(1).values > 0.5).float().mean() > 0.85  # mostly near one-hot (tau 0.2)
    assert torch.allclose(out[:, 4], torch.tanh(torch.tensor(0.3)))
    assert torch.allclose(((out[:, 5:8] + 1) / 2).sum(-1), torch.ones(n), atol=1e-5)


def test_apply_head_typed_rows():
    logits = torch.randn(5, 8, generator=_rng(13))
    out = apply_head(logits, "typed", GROUPS)
    for start, stop, _ in GROUPS[1::2]:
        assert torch.allclose(((out[:, start:stop] + 1) / 2).sum(-1), torch.ones(5))
    assert torch.allclose(out[:, 0], torch.tanh(logits[:, 0]))


def test_stacked_adam_matches_torch_adam():
    g = _rng(14)
    params = [torch.randn(3, 4, 5, generator=g), torch.randn(3, 1, 5, generator=g)]
    refs = [[p[j].clone().requires_grad_(True) for p in params] for j in range(3)]
    opts = [torch.optim.Adam(r, lr=1e-2, betas=(0.0, 0.9)) for r in refs]
    adam = StackedAdam(params, 1e-2, (0.0, 0.9))
    for _it in range(3):  # all networks together
        grads = [torch.randn(p.shape, generator=g) for p in params]
        adam.step_all(params, grads)
        for j in range(3):
            for r, gr in zip(refs[j], grads, strict=False):
                r.grad = gr[j].clone()
            opts[j].step()
    for _it in range(4):  # network 1 alone, through views of the stack
        untouched = [p.clone() for p in params]
        grads = [torch.randn(p[1:2].shape, generator=g) for p in params]
        adam.step_one(1, [p[1:2] for p in params], grads)
        for r, gr in zip(refs[1], grads, strict=False):
            r.grad = gr[0].clone()
        opts[1].step()
        for p, u in zip(params, untouched, strict=False):
            assert torch.equal(p[0], u[0]) and torch.equal(p[2], u[2])
    assert adam.steps.tolist() == [3, 7, 3]
    for j in range(3):
        for p, r in zip(params, refs[j], strict=False):
            assert torch.allclose(p[j], r.detach(), atol=1e-7)
    state = adam.state_dict()
    other = StackedAdam(params, 1e-2, (0.0, 0.9))
    other.load_state_dict(state)
    assert other.steps.tolist() == [3, 7, 3]
