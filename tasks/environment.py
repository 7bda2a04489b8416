"""Environment variables set for a block and restored after it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environment(values: dict[str, str | None], keep_users: bool = False) -> Iterator[None]:
    """Set (a value) or unset (None) environment variables for the block. With `keep_users`, a
    variable the user already set is left as it is."""
    before = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if keep_users and before[key] is not None:
            continue
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
