"""`flower-supernode` as the launcher starts it for a local site: Flower's own entry point, with shorter waits
between the SuperNode's pulls.

Flower 1.32's SuperNode (`flwr.supernode.start_client_internal`) sleeps a fixed 3 s whenever a pull from the
SuperLink brings no message, and 0.5 s between its checks for a reply to push. A site pulls right after it
pushes a round's reply, before the server has the other sites' replies and the next round's weights, so every
round waited up to 3 s more on every site. Here every sleep of that module (and of no other) lasts at most
`PULL_SECONDS`: a pull is one gRPC call to the SuperLink on loopback. Nothing else of the SuperNode changes; a
Flower whose module has no `time` to shorten runs unchanged (slower, not wrong). SuperNodes on other
machines (`local_clients: false`) run Flower's plain `flower-supernode` (docs/generators.md).
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

PULL_SECONDS = 0.5  # as Flower's own wait for a reply; a pull, logged by the SuperLink, twice a second a site


class ShortSleeps:
    """The `time` module, except that `sleep` lasts at most `cap` seconds."""

    def __init__(self, cap: float):
        self.cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def shorten_sleeps(module: ModuleType, cap: float = PULL_SECONDS) -> bool:
    """`module`'s sleeps at most `cap` seconds (its global `time` replaced); False if it has no `time` module."""
    if getattr(module, "time", None) is not time:
        return False
    module.time = ShortSleeps(cap)  # type: ignore[attr-defined]
    return True


def main() -> None:
    from flwr.supernode import start_client_internal
    from flwr.supernode.cli.flower_supernode import flower_supernode

    shorten_sleeps(start_client_internal)
    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
