import pytest


@pytest.fixture(autouse=True, scope="session")
def prefect_backend():
    """One temporary Prefect API (SQLite) for every flow test, started and stopped inside the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
