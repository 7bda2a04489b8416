"""The secret partition of the training rows among GS-WGAN's K critics, and the draw of a batch from a
critic's subset (pretraining and training alike).

The partition comes from the run's privacy secret (models/privacy/secret.py), never from the rows' values;
batches are drawn from the caller's seeded stream.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import torch

from dpsynth.models.errors import ConfigError
from dpsynth.models.privacy.secret import PrivacySecret


def make_partition(n_rows: int, discriminators: int, secret: PrivacySecret) -> np.ndarray:
    """K disjoint subsets covering all n training rows: row j goes to subset (position of j in a
    permutation drawn from the secret's "partition" stream) mod K. Which subset a row joins depends on
    its position and the secret only, never on any row's values, so changing one row moves no other;
    sizes are floor(n/K) or one more (no row is dropped).

    Returns [K, ceil(n/K)] row positions, padded with -1 where a subset holds floor(n/K) rows (see
    `subset_sizes`). The accountant's 1/K does not depend on the sizes: every query draws its critic
    uniformly among the K."""
    if n_rows < discriminators:
        raise ConfigError(f"{n_rows} training rows cannot be split among {discriminators} discriminators.")
    order = secret.numpy("partition").permutation(n_rows)
    width = -(-n_rows // discriminators)
    padded = np.full(width * discriminators, -1, dtype=np.int64)
    padded[:n_rows] = order
    # Position p of the permutation goes to subset p mod K: column-major fill of [width, K].
    return padded.reshape(width, discriminators).T.copy()


@overload
def subset_sizes(partition: np.ndarray) -> np.ndarray: ...


@overload
def subset_sizes(partition: torch.Tensor) -> torch.Tensor: ...


def subset_sizes(partition: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Rows in each subset of a (padded) partition."""
    return (partition >= 0).sum(1)


def sample_local_rows(
    sizes: int | np.ndarray | torch.Tensor,
    batch: int,
    rng: torch.Generator,
    shape: tuple[int, ...] = (),
    bounds: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Indices into critics' subsets, shape `shape + (batch,)`; `sizes` is one subset size, or the sizes
    [shape[0]] of the subsets along the first dimension. Without replacement when every subset holds a
    batch; with replacement when one does not, or when one holds more than 64 batches (then a repeat
    within a batch is rare and drawing keys for every row of the subset would cost more than the step).

    `bounds` (smallest, largest) over ALL subsets makes the choice between those ways, and how many
    numbers are drawn from `rng`, independent of which subsets `sizes` names: training passes it, so
    the seeded stream's later draws (the latents the released generator sees) never depend on which
    critics the secret picked."""
    shape = tuple(shape)
    sizes = torch.as_tensor(sizes, device=rng.device).reshape(-1)
    smallest, largest = (int(sizes.min()), int(sizes.max())) if bounds is None else bounds
    if smallest == largest and (smallest < batch or smallest > 64 * batch):
        return torch.randint(smallest, shape + (batch,), generator=rng, device=rng.device)
    # Each subset's size, broadcastable against the trailing dimensions (..., batch) or (..., size).
    if sizes.numel() > 1:
        size = sizes.reshape((-1,) + (1,) * (len(shape) - 1)).unsqueeze(-1)
    else:
        size = sizes.reshape(())
    if smallest < batch or largest > 64 * batch:
        u = torch.rand(shape + (batch,), generator=rng, device=rng.device)
        return torch.minimum((u * size).long(), size - 1)
    keys = torch.rand(shape + (largest,), generator=rng, device=rng.device)
    if smallest != largest:
        # Positions past a subset's end sort last, so the first `batch` keys fall inside it.
        keys.masked_fill_(torch.arange(largest, device=rng.device) >= size, 2.0)
    if keys.device.type == "cpu":
        # numpy's introsort on these short rows takes a sixth of torch's argsort (a training step at 128
        # columns spent 0.3 ms here); ties between the uniform keys are as rare either way.
        return torch.from_numpy(np.argsort(keys.numpy(), axis=-1)[..., :batch])
    return keys.argsort(dim=-1)[..., :batch]
