"""`python -m tests.flows.kill_inside STAGE dpsynth-arguments...`: the dpsynth command line, SIGKILLed from
inside STAGE (pretrain, train, sample or select) once that stage has done part of its work, as `kill -9`
or the out-of-memory killer would end it: no exception, no cleanup, no Python `finally`."""

from __future__ import annotations

import os
import signal
import sys


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(stage: str) -> None:
    import dpsynth.models.generators.gswgan.pretraining
    import dpsynth.models.generators.gswgan.sampler
    import dpsynth.models.generators.gswgan.trainer
    import dpsynth.tasks.evaluate

    if stage == "pretrain":
        real = dpsynth.models.generators.gswgan.pretraining.pretrain_critics

        def pretrain(*args, progress=None, **kwargs):
            total = args[2].pretrain_iterations

            def halfway(done: int) -> None:
                if done >= total // 2:
                    _die()

            return real(*args, progress=halfway, **kwargs)

        dpsynth.models.generators.gswgan.pretraining.pretrain_critics = pretrain
    elif stage == "train":
        save = dpsynth.models.generators.gswgan.trainer.GeneratorTrainer._save_checkpoint

        def save_then_die(self):
            save(self)
            if self.iteration == self.gan.checkpoint_every:
                _die()

        dpsynth.models.generators.gswgan.trainer.GeneratorTrainer._save_checkpoint = save_then_die
    else:
        module, name = (
            (dpsynth.models.generators.gswgan.sampler.GSWGANSampler, "sample")
            if stage == "sample"
            else (dpsynth.tasks.evaluate, "evaluate_synthetic")
        )
        real, calls = getattr(module, name), []

        def second_call_dies(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                _die()
            return real(*args, **kwargs)

        setattr(module, name, second_call_dies)


if __name__ == "__main__":
    from dpsynth.flows.cli import main

    _arm(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
