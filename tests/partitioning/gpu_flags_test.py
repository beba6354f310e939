"""`cairn.partitioning.gpu_flags`: XLA's GPU training flags go into XLA_FLAGS on a GPU only, and
never over the user's; every flag is one this jaxlib's XLA accepts."""

import logging
import os
import subprocess
import sys

import pytest

from cairn.partitioning import gpu_flags


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(gpu_flags, "cuda_plugin_installed", lambda: True)


def test_on_a_gpu_the_flags_are_set_and_logged(gpu, caplog):
    env = {}
    with caplog.at_level(logging.INFO, logger="cairn.partitioning.gpu_flags"):
        assert gpu_flags.set_gpu_xla_flags(env) == "set"
    flags = env["XLA_FLAGS"].split()
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
    assert "--xla_gpu_enable_while_loop_double_buffering=true" in flags
    assert "--xla_gpu_all_gather_combine_threshold_bytes=134217728" in flags
    assert "--xla_gpu_reduce_scatter_combine_threshold_bytes=67108864" in flags
    assert len(flags) == len(gpu_flags.GPU_XLA_FLAGS)
    assert [r.message for r in caplog.records if "XLA_FLAGS set" in r.message]


@pytest.mark.parametrize("platforms", ["cuda", "gpu", "cuda,cpu", "", " GPU "])
def test_jax_platforms_naming_the_gpu_or_none_keeps_it_on(gpu, platforms):
    env = {"JAX_PLATFORMS": platforms}
    assert gpu_flags.set_gpu_xla_flags(env) == "set"
    assert "XLA_FLAGS" in env


def test_the_users_xla_flags_are_kept_whole(gpu, caplog):
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}
    with caplog.at_level(logging.INFO, logger="cairn.partitioning.gpu_flags"):
        assert gpu_flags.set_gpu_xla_flags(env) == "kept"
    assert env == {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}
    assert [r.message for r in caplog.records if "kept" in r.message]


@pytest.mark.parametrize("platforms", ["cpu", "tpu", "tpu,cpu"])
def test_cpu_or_tpu_platforms_change_nothing(gpu, platforms):
    env = {"JAX_PLATFORMS": platforms}
    assert gpu_flags.set_gpu_xla_flags(env) is None
    assert env == {"JAX_PLATFORMS": platforms}


def test_without_a_cuda_plugin_nothing_changes(monkeypatch):
    monkeypatch.setattr(gpu_flags, "cuda_plugin_installed", lambda: False)
    env = {}
    assert gpu_flags.set_gpu_xla_flags(env) is None and env == {}
    # This CPU machine's venv has no CUDA plugin: the real lookup answers so.
    monkeypatch.undo()
    assert gpu_flags.cuda_plugin_installed() is False


def test_xla_accepts_every_flag():
    """XLA aborts on a flag it does not know: a CPU process started with them must run a program
    (flags of every backend are parsed on any)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(gpu_flags.GPU_XLA_FLAGS))
    code = "import jax.numpy as jnp; print(int(jnp.arange(4).sum()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "6", out.stderr[-2000:]
