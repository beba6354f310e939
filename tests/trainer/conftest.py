"""Shared fixtures for the trainer tests: 8 CPU devices, partitioners, the tiny model's helpers."""

import os
import sys

import jax
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules  # noqa: E402


def make_partitioner(data: int, model: int) -> Partitioner:
    return Partitioner(create_mesh({"data": data, "model": model}), standard_logical_axis_rules())


@pytest.fixture(scope="session", autouse=True)
def eight_devices():
    assert jax.device_count() == 8, "run through tools/testing/pytest_main.py (8 CPU devices)"
