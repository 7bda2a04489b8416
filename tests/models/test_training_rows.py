"""The DP-SGD trainers read their rows from a memory map (models/generators/training_rows.py, issue 42):
the same rows as from an array, the same trained weights for a fixed secret, and a trainer's peak memory
that does not grow with the rows of the file it reads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth.models.generators.dpautogan import latent_gaussian
from dpsynth.models.generators.dpautogan.trainer import DPAutoGANTrainer
from dpsynth.models.generators.dpcgan import trainer as dpcgan_trainer
from dpsynth.models.generators.rdpcgan.trainer import RDPCGANTrainer
from dpsynth.models.generators.training_rows import TrainingRows
from tests.conftest import ROOT
from tests.models.test_dpautogan import small_config as dpautogan_config
from tests.models.test_dpcgan import small_config as dpcgan_config
from tests.models.test_rdpcgan import TARGET
from tests.models.test_rdpcgan import small_config as rdpcgan_config
from tests.models.two_phase_tables import DELTA, GROUPS, toy_table

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def mapped(array: np.ndarray, path: Path) -> np.memmap:
    np.save(path, array)
    return np.load(path, mmap_mode="r")


def test_rows_read_from_a_memory_map_are_the_arrays_rows(tmp_path):
    array = np.random.default_rng(0).standard_normal((1_000, 7)).astype(np.float32)
    from_map, in_memory = TrainingRows(mapped(array, tmp_path / "rows.npy")), TrainingRows(array)
    assert from_map.from_file and not in_memory.from_file
    assert from_map.shape == in_memory.shape == (1_000, 7) and len(from_map) == 1_000
    batch = torch.sort(torch.randperm(1_000, generator=torch.Generator().manual_seed(1))[:300]).values
    repeated = np.array([5, 5, 6, 7, 999, 0, 1, 5])  # runs, repeats, any order
    for rows in (from_map, in_memory):
        assert torch.equal(rows[batch], torch.from_numpy(array)[batch])
        assert torch.equal(rows[repeated], torch.from_numpy(array[repeated]))
        assert torch.equal(rows[100:350], torch.from_numpy(array[100:350]))
        assert rows[:0].shape == (0, 7) and rows[torch.zeros(0, dtype=torch.long)].shape == (0, 7)
        assert torch.equal(rows[990:2_000], torch.from_numpy(array[990:]))
        some = rows.columns([6, 1, 3])
        assert some.shape == (1_000, 3)
        assert torch.equal(some[batch], torch.from_numpy(array[:, [6, 1, 3]])[batch])
        assert torch.equal(some.columns([2, 0])[10:20], torch.from_numpy(array[10:20][:, [3, 6]]))
        assert torch.equal(torch.cat(list(rows.chunks(333))), torch.from_numpy(array))
        with pytest.raises(ValueError, match="contiguous"):
            rows[::2]
        with pytest.raises(ValueError, match="positions"):
            rows[np.ones(1_000, dtype=bool)]


def test_dpcgan_labels_are_read_in_chunks_and_a_non_binary_target_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(dpcgan_trainer, "LABEL_CHUNK_ROWS", 7)
    data = toy_table(50).numpy()
    labels = dpcgan_trainer._labels_of(TrainingRows(mapped(data, tmp_path / "rows.npy")), 1)
    assert labels.dtype == torch.bool and torch.equal(labels, torch.from_numpy(data[:, 1] > 0))
    data[45, 1] = 0.5  # in the last chunk
    with pytest.raises(Exception, match="not a binary target"):
        dpcgan_trainer._labels_of(TrainingRows(mapped(data, tmp_path / "bad.npy")), 1)


def _dpautogan(data, secret, directory):
    cfg = dpautogan_config(
        latent_model="gaussian", latent_noise=3.0, autoencoder_steps=4, moment_noise=5.0, moment_steps=5
    )
    return DPAutoGANTrainer(data, GROUPS, cfg, 5, secret, directory, delta=DELTA, moment_columns=(0, 1))


def _dpautogan_gan(data, secret, directory):
    return DPAutoGANTrainer(data, GROUPS, dpautogan_config(), 5, secret, directory, delta=DELTA)


def _dpcgan(data, secret, directory):
    return dpcgan_trainer.DPCGANTrainer(data, 1, GROUPS, dpcgan_config(), 5, secret, directory, delta=DELTA)


def _rdpcgan(data, secret, directory):
    return RDPCGANTrainer(data, GROUPS, rdpcgan_config(), 5, secret, directory, delta=DELTA, target=TARGET)


@pytest.mark.parametrize("make", [_dpautogan, _dpautogan_gan, _dpcgan, _rdpcgan], ids=lambda f: f.__name__[1:])
def test_a_trainer_reading_a_memory_map_trains_what_it_trains_from_the_array(make, tmp_path, test_secret, monkeypatch):
    # Small chunks: the Gaussian fit, the moment query and the labels read the map in several runs.
    monkeypatch.setattr(latent_gaussian, "CHUNK_ROWS", 16)
    monkeypatch.setattr(dpcgan_trainer, "LABEL_CHUNK_ROWS", 16)
    data = toy_table(60).numpy()
    from_map = make(mapped(data, tmp_path / "rows.npy"), test_secret, tmp_path / "map").run()
    from_array = make(torch.from_numpy(data), test_secret, tmp_path / "array").run()
    sealed = [(e.get("step", e.get("iteration")), e["sha256"]) for e in from_map.checkpoints]
    assert len(sealed) >= 2
    assert sealed == [(e.get("step", e.get("iteration")), e["sha256"]) for e in from_array.checkpoints]


# A DP-auto-GAN fit (autoencoder steps, then the Gaussian fit and the moment query over every row) in a
# fresh process, on the rows of a .npy file read as the train stage reads them; prints its peak memory.
FIT_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np, torch
    torch.set_num_threads(1)
    from dpsynth.models.generators.dpautogan.config import DPAutoGANConfig
    from dpsynth.models.generators.dpautogan.trainer import DPAutoGANTrainer
    from dpsynth.models.privacy.secret import PrivacySecret
    path, mapped, folder = sys.argv[1], sys.argv[2] == "mapped", Path(sys.argv[3])
    # The peak from here on: the imports' own transient peak (above 500 MB) would hide the fit's.
    Path("/proc/self/clear_refs").write_text("5")
    data = np.load(path, mmap_mode="r" if mapped else None)
    width = data.shape[1]
    cfg = DPAutoGANConfig(
        autoencoder_rate=0.002, autoencoder_clip=1.0, autoencoder_noise=1.0, autoencoder_steps=3,
        critic_rate=0.002, critic_clip=1.0, critic_noise=1.0, critic_steps=1, generator_steps=1,
        generator_batch=8, checkpoint_every=1, latent_dim=4, z_dim=4, encoder_hidden=(16,),
        decoder_hidden=(16,), generator_hidden=(8,), critic_hidden=(8,), latent_model="gaussian",
        latent_noise=3.0, moment_noise=5.0, moment_steps=2,
    )
    groups = [(i, i + 1, "continuous") for i in range(width)]
    trainer = DPAutoGANTrainer(data, groups, cfg, 0, PrivacySecret(bytes(range(32))), folder, delta=1e-5,
                               moment_columns=(0, 1, 2))
    trainer.run()
    peak = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    print(json.dumps({"peak_kb": int(peak.split()[1])}))
    """
)
WIDTH_WIDE = 128  # 512 bytes a row
BUFFER_MB = 30


def _fit_peak_mb(path: Path, how: str, folder: Path) -> float:
    done = subprocess.run(
        [sys.executable, "-c", FIT_CHILD, str(path), how, str(folder)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_kb"] / 1024


def _write_rows(path: Path, n_rows: int) -> None:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n_rows, WIDTH_WIDE))
    rng = np.random.default_rng(3)
    for start in range(0, n_rows, 50_000):
        stop = min(n_rows, start + 50_000)
        out[start:stop] = rng.uniform(-1, 1, (stop - start, WIDTH_WIDE)).astype(np.float32)
    out.flush()
    del out


def test_a_dp_sgd_fit_from_a_memory_map_peaks_within_a_fixed_buffer_on_4x_the_rows(tmp_path):
    small, large = tmp_path / "small.npy", tmp_path / "large.npy"
    # Both past one chunk of the one-off queries (65,536 rows), so both read chunks of the same size.
    _write_rows(small, 70_000)
    _write_rows(large, 280_000)
    grown = 210_000 * WIDTH_WIDE * 4 / 2**20  # what holding the rows in memory adds: 103 MB
    assert grown > 2.5 * BUFFER_MB  # so the bound below has the power to catch it
    peak_small = _fit_peak_mb(small, "mapped", tmp_path / "fit-small")
    peak_large = _fit_peak_mb(large, "mapped", tmp_path / "fit-large")
    assert peak_large - peak_small < BUFFER_MB, (peak_small, peak_large)
