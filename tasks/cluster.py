"""Independent units of a stage's work run on a Dask cluster's workers (`dpsynth release --cluster ADDRESS`).

Only work whose result does not depend on where it runs goes there: exact cell counts, summed here, and
GS-WGAN's pretraining chunks, each drawing from its own seeded stream. What a release randomises from its
secret (the partition, the noise) is drawn here, never on a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class ClusterMap:
    """A task map (models/generators/base.py `TaskMap`) over the cluster at `address`."""

    def __init__(self, address: str) -> None:
        self.address = address

    def __call__(
        self,
        fn: Callable[..., Any],
        arguments: Sequence[tuple],
        done: Callable[[int], None] | None = None,
    ) -> list:
        from distributed import Client, as_completed

        with Client(self.address) as client:
            # pure=False: every unit is its own task, even two with equal arguments.
            futures = [client.submit(fn, *args, pure=False) for args in arguments]
            index = {future.key: i for i, future in enumerate(futures)}
            for future in as_completed(futures):
                if done is not None:
                    done(index[future.key])
            return client.gather(futures)


def cluster_map(address: str | None) -> ClusterMap | None:
    """The cluster's task map, or None (this process) without an address."""
    return None if address is None else ClusterMap(address)
