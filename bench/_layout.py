"""Column mix of the benchmarks' census-like tables: which encoded columns are continuous, binary or one
one-hot group, for any encoded width (bench/model_selection.py, bench/pretrain.py, bench/train.py --width)."""

from __future__ import annotations

# Sizes of the one-hot groups after the wide one, in turn (1: a binary column, one encoded column).
_GROUP_CYCLE = (1, 3, 5, 1, 8, 12)
WIDE_GROUP_LEVELS = 42  # like a census table's occupation or country column


def wide_layout(width: int) -> tuple[int, list[int]]:
    """(continuous columns, group sizes) of a table whose encoding is `width` columns wide.

    Like a census table: about a sixth continuous, one wide group (up to 42 levels, half the rest at
    most), then binary columns and small one-hot groups of 3 to 12 levels.
    """
    if width < 3:
        raise ValueError(f"a census-like table needs at least 3 encoded columns, got {width}")
    n_cont = max(2, width // 6)
    left = width - n_cont
    groups: list[int] = []
    if left >= 20:
        groups.append(min(WIDE_GROUP_LEVELS, left // 2))
        left -= groups[-1]
    i = 0
    while left > 0:
        size = min(_GROUP_CYCLE[i % len(_GROUP_CYCLE)], left)
        size = 1 if size == 2 else size  # a two-level column is encoded as one binary column
        groups.append(size)
        left -= size
        i += 1
    return n_cont, groups


def head_groups(width: int) -> list[tuple[int, int, str]]:
    """(start, stop, kind) of each encoded block of the census-like table of `width` columns: a binary
    target first (column 0, as in the benchmarks' other tables), then `wide_layout(width - 1)`."""
    n_cont, groups = wide_layout(width - 1)
    blocks = [(0, 1, "binary")] + [(1 + i, 2 + i, "continuous") for i in range(n_cont)]
    start = 1 + n_cont
    for size in groups:
        blocks.append((start, start + size, "binary" if size == 1 else "categorical"))
        start += size
    return blocks
