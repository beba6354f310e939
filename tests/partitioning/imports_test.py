"""`import cairn.partitioning` pulls in JAX and NumPy only (docs/design.md §1)."""

import os
import subprocess
import sys

import cairn.partitioning

FORBIDDEN = ("tensorflow", "flax", "optax", "orbax", "cairn.models", "cairn.trainer", "cairn.datatasks")


def test_import_pulls_no_tensorflow_or_flax():
    code = (
        "import sys, cairn.partitioning; "
        f"print(','.join(m for m in {FORBIDDEN!r} if any(k == m or k.startswith(m + '.') for k in sys.modules))); "
        "print('jax' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split("\n")[:2] == ["", "True"], out.stdout


def test_public_api():
    for name in (
        "create_mesh",
        "standard_logical_axis_rules",
        "Partitioner",
        "DataLayout",
        "estimate_memory",
        "initialize_distributed",
        "opt_state_logical_specs",
    ):
        assert name in cairn.partitioning.__all__ and hasattr(cairn.partitioning, name)
    assert cairn.partitioning.__version__ == "0.1.0"
