"""MFU: the published peak table and the CPU matmul probe (remembered per machine)."""

import json
import os

import jax
import pytest

from cairn.trainer import PEAK_BF16_TFLOPS, cpu_matmul_peak_flops, mfu, peak_flops, published_peak_flops
from cairn.trainer.mfu import host_peak_flops, peak_cache_path


@pytest.mark.parametrize(
    "kind,tflops",
    [
        ("TPU v4", 275),
        ("TPU v5 lite", 197),
        ("TPU v5e", 197),
        ("TPU v5p", 459),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H200", 989),
    ],
)
def test_published_peaks(kind, tflops):
    assert published_peak_flops(kind) == tflops * 1e12


def test_unknown_device_kind_is_none():
    assert published_peak_flops("Quantum Abacus") is None
    assert {name for name, _ in PEAK_BF16_TFLOPS} >= {"TPU v4", "TPU v5e", "TPU v5p", "A100", "H100", "H200"}


def test_cpu_probe_runs_once_and_is_plausible(tmp_path, monkeypatch):
    monkeypatch.setenv("CAIRN_CACHE_HOME", str(tmp_path))
    first = cpu_matmul_peak_flops()
    assert 1e8 < first < 1e13
    assert cpu_matmul_peak_flops() is first  # cached: the probe runs once per process
    assert peak_flops(jax.devices()) == first  # 8 virtual devices share the host: counted once


def test_the_probe_is_remembered_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("CAIRN_CACHE_HOME", str(tmp_path))
    path = peak_cache_path()
    assert path.startswith(str(tmp_path / "cpu_peak_flops")) and not os.path.exists(path)
    assert host_peak_flops() == cpu_matmul_peak_flops()  # measured, then written
    saved = json.loads(open(path).read())
    assert saved["peak_flops"] == cpu_matmul_peak_flops() and saved["cores"] >= 1
    with open(path, "w") as f:  # what another process measured: read back, not measured again
        json.dump({**saved, "peak_flops": 123e9}, f)
    assert host_peak_flops() == 123e9 and peak_flops(jax.devices()) == 123e9
    with open(path, "w") as f:  # a torn or foreign file: measured again and rewritten
        f.write("{not json")
    assert host_peak_flops() == cpu_matmul_peak_flops()
    assert json.loads(open(path).read())["peak_flops"] == cpu_matmul_peak_flops()


def test_mfu_formula():
    assert mfu(flops_per_token=6e9, tokens_per_second=1e4, peak=1.2e14) == pytest.approx(0.5)
