"""A GCS emulator per test module, this process pointed at it, and a fresh bucket per test."""

import itertools

import pytest

from cairn.storage.testing import GcsEmulator

_count = itertools.count()


@pytest.fixture(scope="module")
def emulator():
    emu = GcsEmulator().start()
    emu.activate()
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def bucket(emulator):
    """`gs://<name>` of a new, empty bucket."""
    return emulator.create_bucket(f"bucket-{next(_count)}")
