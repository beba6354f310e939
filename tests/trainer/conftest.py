"""Shared fixtures for the trainer tests: 8 CPU devices (helpers to import: mesh_util, tiny_model)."""

import jax
import pytest


@pytest.fixture(scope="session", autouse=True)
def eight_devices():
    assert jax.device_count() == 8, "run through tools/testing/pytest_main.py (8 CPU devices)"
