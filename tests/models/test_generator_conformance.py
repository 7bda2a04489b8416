"""Every registered generator passes the generator checks (dpsynth.generator_checks, the public module a
generator shipped elsewhere runs too), each trained once at its own smoke size on generated tables."""

from __future__ import annotations

import pytest
import torch

from dpsynth.generator_checks import Check, Trained, parametrize_with_checks, smoke_profile, train_for_checks
from dpsynth.models.generators import names
from tests.conftest import CARDIO_SCHEMA


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory, cardio_schema) -> Trained:
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        profile, setting = smoke_profile(request.param, CARDIO_SCHEMA)
        return train_for_checks(
            request.param, profile, setting, cardio_schema, tmp_path_factory.mktemp(f"conformance-{request.param}")
        )
    finally:
        torch.set_num_threads(torch_threads)


@parametrize_with_checks(names())
def test_generator_check(trained: Trained, check: Check):
    check(trained)
