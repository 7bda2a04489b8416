"""Checkpoint files: the hash recorded while writing is the file's, with or without the zip CRC-32."""

from __future__ import annotations

import pytest
import torch

from dpsynth.models.checkpoint_files import (
    damaged_reason,
    load_latest_intact,
    previous,
    save_verified,
    sha256_of,
    sidecar,
    spare,
)


@pytest.mark.parametrize("zip_crc32", [True, False])
def test_the_recorded_hash_is_the_written_file_and_it_loads_back(tmp_path, zip_crc32):
    state = {"w": torch.randn(300, 70, generator=torch.Generator().manual_seed(0)), "step": 7}
    path = tmp_path / "state.pt"
    digest = save_verified(state, path, zip_crc32=zip_crc32)
    assert digest == sha256_of(path) == sidecar(path).read_text()
    assert damaged_reason(path) is None
    loaded = torch.load(path, weights_only=False)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7


def test_keep_previous_falls_back_when_the_latest_state_is_damaged(tmp_path):
    path = tmp_path / "state.pt"
    save_verified({"step": 1}, path, keep_previous=True, zip_crc32=False)
    save_verified({"step": 2, "w": torch.ones(1000)}, path, keep_previous=True, zip_crc32=False)
    assert torch.load(previous(path), weights_only=False)["step"] == 1
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    state, used, problems = load_latest_intact(path, weights_only=False)
    assert state["step"] == 1 and used == previous(path)
    assert problems and "does not match" in problems[0]


def test_a_recycled_file_holds_exactly_the_new_state(tmp_path):
    """The third save keeps the first version's (larger) file as the spare and the fourth overwrites it in
    place: cut to the new length, with the hash and content of the new state, while the current and the
    previous versions stay whole."""
    path = tmp_path / "state.pt"
    save_verified({"step": 1, "w": torch.ones(50_000)}, path, keep_previous=True, zip_crc32=False)
    save_verified({"step": 2}, path, keep_previous=True, zip_crc32=False)
    save_verified({"step": 3}, path, keep_previous=True, zip_crc32=False)
    assert spare(path).stat().st_size > 200_000 and not sidecar(spare(path)).exists()
    digest = save_verified({"step": 4}, path, keep_previous=True, zip_crc32=False)
    fresh = tmp_path / "fresh.pt"
    save_verified({"step": 4}, fresh, zip_crc32=False)
    assert path.stat().st_size == fresh.stat().st_size
    assert digest == sha256_of(path) and damaged_reason(path) is None
    assert torch.load(path, weights_only=False) == {"step": 4}
    assert torch.load(previous(path), weights_only=False) == {"step": 3} and damaged_reason(previous(path)) is None
    assert torch.load(spare(path), weights_only=False) == {"step": 2}
    assert not path.with_name(path.name + ".tmp").exists()


def test_a_failed_write_names_the_checkpoint_file(tmp_path, monkeypatch):
    """A full disk fails a write with no file name; the error names the checkpoint being written, for the
    command line's one-paragraph message, and the current state is left as it was."""
    import errno
    import os

    path = tmp_path / "state.pt"
    save_verified({"step": 1}, path, keep_previous=True)

    def full_disk(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("dpsynth.models.checkpoint_files._HashingWriter.write", full_disk)
    with pytest.raises(OSError) as caught:
        save_verified({"step": 2}, path, keep_previous=True)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path) + ".tmp"
    assert torch.load(path, weights_only=False) == {"step": 1} and damaged_reason(path) is None
