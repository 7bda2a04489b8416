"""Counter-based random numbers: each value a fixed function of (key, counter), so no stream advances.

Where a draw must not depend on which other draws were made (a row's fake latent in DP-auto-GAN's
critic; the batches of a critic GS-WGAN queries), taking it from a stream would tie it to everything
drawn before it. SplitMix64's output function applied to a counter is a good statistical generator
(it is how SplitMix64 itself produces its sequence), vectorises in numpy, and needs no state.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_UNIT = 1.0 / float(1 << 53)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on each uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def stream_base(key: int, *labels: int) -> np.uint64:
    """A 64-bit starting counter for (key, labels...): each label mixed in turn."""
    value = np.uint64(int(key) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        for label in labels:
            value = splitmix64(np.array([value ^ np.uint64(int(label) & 0xFFFFFFFFFFFFFFFF)]))[0]
    return value


def uniforms(counters: np.ndarray) -> np.ndarray:
    """A uniform in [0, 1) (53 bits) per uint64 counter."""
    return (splitmix64(counters) >> np.uint64(11)).astype(np.float64) * _UNIT


def normals(counters: np.ndarray) -> np.ndarray:
    """A standard normal per uint64 counter (Box-Muller on the uniforms of 2c and 2c + 1)."""
    with np.errstate(over="ignore"):
        doubled = np.asarray(counters, dtype=np.uint64) * np.uint64(2)
        u1 = 1.0 - uniforms(doubled)  # (0, 1]: log is finite
        u2 = uniforms(doubled + np.uint64(1))
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def counters(base: np.uint64, shape: tuple[int, ...]) -> np.ndarray:
    """base, base + 1, ... in `shape` (wrapping)."""
    with np.errstate(over="ignore"):
        return base + np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape)
