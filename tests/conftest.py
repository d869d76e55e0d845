"""pytest configuration. Shared helpers live in tests/helpers.py (the one module tests import helpers from)."""

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs two workers), every test that uses the one local Slurm cluster
    goes to the same worker, one after another: two jobs at once would queue for each other's nodes."""
    for item in items:
        if item.get_closest_marker("slurm") or "srun" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("slurm"))
