"""The C kernels (models/native/kernels.py) against the tensor code they replace: the same critic
gradients up to float32 rounding, torch's Adam update, exact zeros kept, the generators' bfloat16
BatchNorm, whole pretraining and training visits within rounding of the tensor code; and how
`gan.kernels` is resolved."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsynth.models.config import PrivacyConfig, Setting
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.devices import kernels_in_use
from dpsynth.models.generators.gswgan.partition import make_partition
from dpsynth.models.generators.gswgan.pretraining import (
    build_pretrain_chunk,
    chunk_generator,
    pretrain_critics,
)
from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer
from dpsynth.models.generators.networks import CriticStack, GeneratorStack, StackedAdam, Workspace
from dpsynth.models.native import kernels as native_kernels
from dpsynth.models.native.kernels import (
    CriticRows,
    NativeKernelError,
    batchnorm_relu_bf16,
    critic_input_grads,
    critic_updates,
    step_gradients,
    use_native_batchnorm,
    use_native_critics,
)
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import TEST_SECRET_HEX

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="no C compiler builds the kernel here")

CPU = torch.device("cpu")
SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)


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


@pytest.mark.parametrize("batch,width,hidden", [(32, 16, 128), (5, 7, 32), (8, 19, 48), (40, 130, 64)])
def test_step_gradients_equal_the_tensor_code(batch, width, hidden):
    """Shapes the vector code handles in blocks and in remainders (batch and width not multiples of 4,
    8 or 16, a batch of 32-row tiles and a padded 16-row rest): gradients and the Wasserstein estimate agree with
    `loss_grads_rows` to float32 rounding."""
    critic = _critic(1, width, hidden)
    rows = _rows((1, 2 * batch, width), 1)
    alpha = torch.rand(1, batch, 1, generator=torch.Generator().manual_seed(2))
    want, w_want = critic.loss_grads_rows(
        critic.params, rows, CriticStack.weighted_rows(rows), alpha, 10.0, wasserstein=True
    )
    got, w_got = step_gradients(critic.params, rows[0], alpha[0], 10.0)
    for g, w in zip(got, want, strict=False):
        assert g.shape == w.shape
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-6), (g - w).abs().max()
    assert w_got == pytest.approx(float(w_want[0]), rel=1e-4, abs=1e-6)


def test_adam_update_is_torch_adam_on_the_kernel_gradients():
    critic = _critic(1, 16, 128)
    params = [p.clone() for p in critic.params]
    opt = StackedAdam(critic.trainable(params), 1e-3, (0.5, 0.9))
    for t in range(3):  # some history in the moments first
        rows, alpha = _rows((2 * 32, 16), 10 + t), torch.rand(32, 1, generator=torch.Generator().manual_seed(t))
        grads, _ = step_gradients(params, rows, alpha, 10.0)
        expected = [p.clone() for p in params]
        moments = ([m.clone() for m in opt.exp_avg], [v.clone() for v in opt.exp_avg_sq])
        torch._fused_adam_(
            expected[:3],
            grads,
            *moments,
            [],
            [torch.tensor(float(t + 1))] * 3,
            lr=1e-3,
            beta1=0.5,
            beta2=0.9,
            weight_decay=0.0,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
        )
        critic_updates(
            params,
            opt.exp_avg,
            opt.exp_avg_sq,
            opt.steps,
            rows[None, None],
            alpha[None, None],
            1e-3,
            (0.5, 0.9),
            1e-8,
            10.0,
        )
        opt.steps += 1
        for got, want in zip(
            params[:3] + opt.exp_avg + opt.exp_avg_sq, expected[:3] + moments[0] + moments[1], strict=False
        ):
            assert torch.allclose(got, want, rtol=1e-6, atol=1e-9)
    assert torch.equal(params[3], critic.params[3])  # the output bias is not trained


def test_an_exactly_zero_bias_gradient_stays_zero():
    """Every unit active on every row: the Wasserstein part of b1's gradient is exactly zero (the same
    sum over the fake and the real rows), so Adam must leave b1 exactly where it was."""
    critic = _critic(1, 16, 128)
    critic.params[1].fill_(50.0)
    rows, alpha = _rows((2 * 32, 16), 3), torch.rand(32, 1, generator=torch.Generator().manual_seed(4))
    grads, _ = step_gradients(critic.params, rows, alpha, 10.0)
    assert torch.count_nonzero(grads[1]) == 0
    opt = StackedAdam(critic.trainable(critic.params), 1e-4, (0.5, 0.9))
    critic_updates(
        critic.params,
        opt.exp_avg,
        opt.exp_avg_sq,
        opt.steps,
        rows[None, None],
        alpha[None, None],
        1e-4,
        (0.5, 0.9),
        1e-8,
        10.0,
    )
    assert torch.all(critic.params[1] == 50.0)


@pytest.mark.parametrize("matmul", ["float32", "bfloat16"])
def test_native_pretraining_stays_within_rounding_of_the_tensor_code(matmul):
    """Both kernels from the same draws (with bfloat16 products the C BatchNorm too): after 20
    iterations the critics sit within 5% of how far they moved (a rounding difference that Adam
    amplifies near zero gradients, not another algorithm)."""
    data = _rows((2000, 16), 0)
    partition = make_partition(2000, 3, SECRET)
    runs = {}
    for kernel in ("torch", "native"):
        gan = GanConfig(pretrain_matmul=matmul, kernels=kernel)
        runs[kernel] = pretrain_critics(data, partition, gan, [], 0, CPU, iterations=20, chunk_size=3).params
    initial = build_pretrain_chunk(3, 16, GanConfig(), [], chunk_generator(0, 0), CPU)[0].params
    for got, want, start in zip(runs["native"][:3], runs["torch"][:3], initial, strict=False):
        moved = (want - start).abs().max().item()
        assert moved > 1e-3
        assert (got - want).abs().max().item() <= 0.05 * moved


def test_native_training_refresh_stays_within_rounding_of_the_tensor_code(tmp_path):
    """One training refresh (r updates of each drawn critic, and their mean estimate) with either kernel,
    same draws: the C call updates critics 1 and 3 in place in the stack, through its index."""
    data = _rows((2000, 16), 0)
    partition = make_partition(2000, 4, SECRET)
    results = {}
    for kernel in ("torch", "native"):
        gan = GanConfig(iterations=4, checkpoint_every=4, critic_refresh_steps=20, kernels=kernel)
        critics = _critic(4, 16, gan.critic_hidden, seed=5)
        trainer = GeneratorTrainer(
            data, partition, critics, gan, PrivacyConfig(), Setting("k4", 4), [], 3, tmp_path / kernel, CPU, SECRET
        )
        assert trainer.native_critics == (kernel == "native")
        estimate = trainer.refresh_critics(torch.tensor([1, 3]), wasserstein=True)
        results[kernel] = ([p.clone() for p in trainer.critics.params], float(estimate), trainer.opt_d.steps.copy())
    start = _critic(4, 16, GanConfig().critic_hidden, seed=5).params
    (native, w_native, steps_native), (ref, w_ref, steps_ref) = results["native"], results["torch"]
    np.testing.assert_array_equal(steps_native, steps_ref)
    np.testing.assert_array_equal(steps_native, [0, 20, 0, 20])
    for got, want, s in zip(native[:3], ref[:3], start, strict=False):
        assert torch.equal(got[[0, 2]], s[[0, 2]])  # only the drawn critics move
        for k in (1, 3):
            moved = (want[k] - s[k]).abs().max().item()
            assert moved > 1e-3
            assert (got[k] - want[k]).abs().max().item() <= 0.05 * moved
    assert w_native == pytest.approx(w_ref, rel=0.05)


def test_indexed_critic_updates_equal_updates_of_the_gathered_critics():
    """critic_updates with an index updates stack[index[k]] in place exactly as the same call on a
    gathered copy of those critics would, and leaves every other critic alone."""
    stack = _critic(6, 16, 128, seed=3)
    opt = StackedAdam(stack.trainable(stack.params), 1e-3, (0.5, 0.9))
    index = np.array([4, 1])
    rows = _rows((2, 3, 64, 16), 7)
    alpha = torch.rand(2, 3, 32, 1, generator=torch.Generator().manual_seed(8))
    gathered = [p[index].clone() for p in stack.params]
    moments = ([m[index].clone() for m in opt.exp_avg], [v[index].clone() for v in opt.exp_avg_sq])
    before = [p.clone() for p in stack.params]
    w_indexed = critic_updates(
        stack.params,
        opt.exp_avg,
        opt.exp_avg_sq,
        opt.steps[index],
        rows,
        alpha,
        1e-3,
        (0.5, 0.9),
        1e-8,
        10.0,
        wasserstein=True,
        index=index,
    )
    w_gathered = critic_updates(
        gathered, *moments, np.zeros(2, dtype=np.int64), rows, alpha, 1e-3, (0.5, 0.9), 1e-8, 10.0, wasserstein=True
    )
    assert torch.equal(w_indexed, w_gathered)
    for p, g, b in zip(stack.params, gathered, before, strict=False):
        assert torch.equal(p[index], g)
        assert torch.equal(p[[0, 2, 3, 5]], b[[0, 2, 3, 5]])
    with pytest.raises(ValueError):
        critic_updates(
            stack.params,
            opt.exp_avg,
            opt.exp_avg_sq,
            opt.steps[:2],
            rows,
            alpha,
            1e-3,
            (0.5, 0.9),
            1e-8,
            10.0,
            index=np.array([1, 6]),
        )


@pytest.mark.parametrize("shared", [True, False])
def test_rows_read_in_place_give_the_updates_of_the_copied_block(shared):
    """CriticRows (real rows by index into the table, fake rows shared by every critic or per critic)
    feed the C updates exactly the numbers of the [K, S, 2B, d] block they replace."""
    k, steps, b, width = 3, 2, 8, 19
    data = _rows((50, width), 1)
    real_rows = torch.randint(50, (k, steps, b), generator=torch.Generator().manual_seed(2))
    fakes = _rows((steps, b, width) if shared else (k, steps * b + 3, width), 3)
    alpha = torch.rand(k, steps, b, 1, generator=torch.Generator().manual_seed(4))
    per_critic = fakes.expand(k, steps, b, width) if shared else fakes[:, : steps * b].reshape(k, steps, b, width)
    block = torch.cat([data[real_rows], per_critic], 2)
    results = []
    for rows in (CriticRows(data, real_rows, fakes, shared), block):
        stack = _critic(k, width, 32, seed=5)
        opt = StackedAdam(stack.trainable(stack.params), 1e-3, (0.5, 0.9))
        w = critic_updates(
            stack.params,
            opt.exp_avg,
            opt.exp_avg_sq,
            opt.steps,
            rows,
            alpha,
            1e-3,
            (0.5, 0.9),
            1e-8,
            10.0,
            wasserstein=True,
        )
        results.append((stack.params, w))
    (in_place, w_in_place), (copied, w_copied) = results
    assert torch.equal(w_in_place, w_copied)
    for got, want in zip(in_place, copied, strict=False):
        assert torch.equal(got, want)
    with pytest.raises(ValueError):
        CriticRows(data, real_rows, fakes[:1], shared)
    for outside in (real_rows + 50, real_rows - 50):
        with pytest.raises(ValueError, match="must index rows of data"):
            CriticRows(data, outside, fakes, shared)
    halves = CriticRows(data, real_rows, fakes, shared).part(slice(1, 3))
    assert torch.equal(halves.real_rows, real_rows[1:3]) and halves.shared == shared
    assert halves.fakes is fakes if shared else torch.equal(halves.fakes, fakes[1:3])


def test_critic_input_grads_equal_the_tensor_code_on_gathered_critics():
    """Training's query, each row through its own critic read in place in the stack, agrees with
    `CriticStack.input_grad` on the gathered critics to float32 rounding."""
    stack = _critic(6, 37, 48, seed=1)
    rows = _rows((9, 37), 2)
    index = torch.tensor([5, 0, 3, 3, 1, 2, 5, 4, 0])
    want = stack.input_grad([p.index_select(0, index) for p in stack.params], rows.unsqueeze(1)).squeeze(1)
    got = critic_input_grads(stack.params, index, rows)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), (got - want).abs().max()
    with pytest.raises(ValueError):
        critic_input_grads(stack.params, torch.tensor([6] * 9), rows)
    with pytest.raises(ValueError, match="float32 rows"):
        critic_input_grads(stack.params, index, rows.double())


def test_native_training_query_equals_the_tensor_code(tmp_path):
    """A training step's per-row critic query (the gradient the sanitiser clips) with either kernel."""
    data = _rows((400, 16), 0)
    partition = make_partition(400, 4, SECRET)
    fake, drawn = _rows((32, 16), 1), torch.randint(4, (32,), generator=torch.Generator().manual_seed(2))
    results = {}
    for kernel in ("torch", "native"):
        gan = GanConfig(iterations=4, checkpoint_every=4, kernels=kernel)
        trainer = GeneratorTrainer(
            data,
            partition,
            _critic(4, 16, gan.critic_hidden, seed=5),
            gan,
            PrivacyConfig(),
            Setting("k4", 4),
            [],
            3,
            tmp_path / kernel,
            CPU,
            SECRET,
        )
        results[kernel] = trainer.query_critics(fake, drawn)
    assert torch.allclose(results["native"], results["torch"], rtol=1e-5, atol=1e-7)


def _generators(native: bool) -> GeneratorStack:
    return GeneratorStack(
        3,
        8,
        (32, 48),
        16,
        "tanh",
        [],
        "default",
        torch.Generator().manual_seed(0),
        matmul_dtype=torch.bfloat16,
        native_batchnorm=native,
    )


def test_bfloat16_batchnorm_equals_the_tensor_code():
    """forward_train of bfloat16 generators (4 chunks of 6 rows): the same outputs and saved tensors
    with the C BatchNorm as with the tensor code, up to float32 rounding (and one bfloat16 rounding
    step where a value sits on a rounding boundary), and the same gradients from backward."""
    z = torch.randn(3, 24, 8, generator=torch.Generator().manual_seed(1))
    dout = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(2))
    results = []
    for native in (False, True):
        gens = _generators(native)
        out, saved = gens.forward_train(gens.params, z, 4, Workspace())
        grads = gens.backward(gens.params, saved, dout, Workspace())
        inputs, xhats, scales, _, _ = saved
        results.append(([t.clone() for t in [out] + inputs[1:] + xhats + scales], [g.clone() for g in grads]))
    (tensors_ref, grads_ref), (tensors_c, grads_c) = results
    for got, want in zip(tensors_c, tensors_ref, strict=False):
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=1e-2, atol=1e-3)
        assert (got - want).abs().mean() < 1e-4
    for got, want in zip(grads_c, grads_ref, strict=False):
        assert torch.allclose(got, want, rtol=2e-2, atol=1e-3)


def test_bfloat16_batchnorm_kernel_formulas():
    """Direct check on one network: per-chunk statistics, gamma/beta, ReLU, and bfloat16 rounding to
    nearest even (the output is exactly the float32 result rounded as torch rounds it)."""
    y = torch.randn(2, 3, 5, 32, generator=torch.Generator().manual_seed(3)).bfloat16()
    gamma = torch.rand(2, 1, 32, generator=torch.Generator().manual_seed(4)) + 0.5
    beta = torch.randn(2, 1, 32, generator=torch.Generator().manual_seed(5)) * 0.1
    out = torch.empty_like(y)
    last, xhat, scale = torch.empty(2, 5, 32), torch.empty(2, 5, 32), torch.empty(2, 1, 32)
    batchnorm_relu_bf16(y, gamma, beta, 1e-5, out, last, xhat, scale)
    yf = y.double()
    centred = yf - yf.mean(2, keepdim=True)
    rstd = (centred.pow(2).mean(2, keepdim=True) + 1e-5).rsqrt()
    want = (centred * rstd * gamma.double().unsqueeze(1) + beta.double().unsqueeze(1)).relu()
    assert torch.allclose(last.double(), want[:, -1], atol=1e-5)
    assert torch.allclose(xhat.double(), (centred * rstd)[:, -1], atol=1e-5)
    assert torch.allclose(scale.double(), rstd[:, -1] * gamma.double(), atol=1e-5)
    assert torch.equal(out[:, -1], last.bfloat16())
    assert torch.allclose(out.double(), want, rtol=8e-3, atol=1e-5)


def test_kernel_choice():
    assert use_native_critics("auto", 128, False, "cpu") and use_native_critics("native", 128, False, "cpu")
    assert not use_native_critics("torch", 128, False, "cpu")
    assert not use_native_critics("auto", 128, True, "cpu")  # BatchNorm critics: autograd
    assert not use_native_critics("auto", 40, False, "cpu")  # hidden width not a multiple of 16
    assert not use_native_critics("auto", 128, False, "cuda")
    with pytest.raises(ConfigError, match="kernels 'native' needs"):
        use_native_critics("native", 128, True, "cpu")
    with pytest.raises(ConfigError, match="kernels must be one of"):
        use_native_critics("fast", 128, False, "cpu")
    assert use_native_batchnorm("auto", "cpu", torch.bfloat16)
    assert not use_native_batchnorm("auto", "cpu", None)  # float32 products: tensor code
    assert not use_native_batchnorm("torch", "cpu", torch.bfloat16)
    assert not use_native_batchnorm("auto", "cuda", torch.bfloat16)
    assert kernels_in_use(GanConfig(kernels="torch"), "cpu") == {
        "critic_updates": "torch",
        "pretrain_batchnorm": "torch",
    }
    assert kernels_in_use(GanConfig(kernels="auto", pretrain_matmul="float32"), "cpu") == {
        "critic_updates": "native",
        "pretrain_batchnorm": "torch",
    }


def test_without_a_compiler_auto_falls_back_and_native_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(native_kernels, "_library", None)
    monkeypatch.setattr(native_kernels, "_build_error", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("DPSYNTH_NATIVE_CACHE", str(tmp_path / "cache"))
    assert not use_native_critics("auto", 128, False, "cpu")
    with pytest.raises(NativeKernelError, match="no C compiler .* on PATH.*'auto' or 'torch'"):
        use_native_critics("native", 128, False, "cpu")
    assert isinstance(NativeKernelError("x"), ConfigError)  # the command line shows it without a traceback


def test_the_library_is_built_once_per_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(native_kernels, "_library", None)
    monkeypatch.setattr(native_kernels, "_build_error", None)
    monkeypatch.setenv("DPSYNTH_NATIVE_CACHE", str(tmp_path))
    assert native_kernels.available()
    built = list(tmp_path.glob("dpsynth-kernels-*.so"))
    assert len(built) == 1 and not list(tmp_path.glob("*.so.tmp*"))
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native_kernels, "_library", None)
    assert native_kernels.available()
    assert built[0].stat().st_mtime_ns == stamp and len(list(tmp_path.glob("*.so"))) == 1


def test_every_c_source_and_header_keys_the_library(monkeypatch, tmp_path):
    """The library is one build of every C file in models/native/, cached under a key of all of them and
    the shared header: a change to any one builds a new library."""
    folder = native_kernels.SOURCES[0].parent
    assert sorted(p.name for p in native_kernels.SOURCES) == sorted(p.name for p in folder.glob("*.c"))
    assert sorted(p.name for p in native_kernels.HEADERS) == sorted(p.name for p in folder.glob("*.h"))
    copies = {}
    for path in (*native_kernels.SOURCES, *native_kernels.HEADERS):
        copies[path.name] = tmp_path / path.name
        copies[path.name].write_text(path.read_text())
    monkeypatch.setattr(native_kernels, "SOURCES", tuple(copies[p.name] for p in native_kernels.SOURCES))
    monkeypatch.setattr(native_kernels, "HEADERS", tuple(copies[p.name] for p in native_kernels.HEADERS))
    compiler = native_kernels._compiler()
    keys = {native_kernels._library_path(compiler)}
    for copy in copies.values():
        copy.write_text(copy.read_text() + "\n/* edited */\n")
        keys.add(native_kernels._library_path(compiler))
    assert len(keys) == 1 + len(copies)


def test_a_training_profile_accepts_only_known_kernels():
    from dpsynth.models.config import Profile

    with pytest.raises(ConfigError, match="kernels"):
        Profile(name="p", settings=(Setting("k4", 4),), gan=GanConfig().replace(kernels="gpu"))


def test_an_unusable_cache_folder_builds_in_a_private_temporary_one(monkeypatch, tmp_path):
    monkeypatch.setattr(native_kernels, "_library", None)
    monkeypatch.setattr(native_kernels, "_build_error", None)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DPSYNTH_NATIVE_CACHE", str(blocker / "cache"))  # cannot be created
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert native_kernels.available()
    assert len(list((tmp_path / "tmp").glob("dpsynth-native-*/dpsynth-kernels-*.so"))) == 1
