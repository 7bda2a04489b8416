"""`python -m tests.flows.pause_inside dpsynth-arguments...`: the dpsynth command line, paused halfway
through pretraining (holding its run) until the file $DPSYNTH_TEST_GO exists; it creates
$DPSYNTH_TEST_PAUSED when it pauses, so a test knows the run is in progress."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def _arm() -> None:
    import dpsynth.models.generators.gswgan.pretraining as pretraining

    real = pretraining.pretrain_critics
    paused, go = Path(os.environ["DPSYNTH_TEST_PAUSED"]), Path(os.environ["DPSYNTH_TEST_GO"])

    def pretrain(*args, progress=None, **kwargs):
        total = args[2].pretrain_iterations

        def halfway(done: int) -> None:
            if done >= total // 2 and not paused.exists():
                paused.touch()
                while not go.exists():
                    time.sleep(0.1)

        return real(*args, progress=halfway, **kwargs)

    pretraining.pretrain_critics = pretrain


if __name__ == "__main__":
    from dpsynth.flows.cli import main

    _arm()
    sys.exit(main(sys.argv[1:]))
