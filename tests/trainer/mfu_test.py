"""MFU: the published peak table; none on CPU (the matmul probe is the caller's to measure)."""

import logging

import jax
import pytest

from cairn.trainer import PEAK_BF16_TFLOPS, cpu_matmul_peak_flops, mfu, peak_flops, published_peak_flops


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


def test_no_peak_is_known_on_cpu_or_for_an_unknown_kind_and_the_probe_runs_once(caplog):
    # On CPU MFU is left out (no published peak; a probe depends on the load it meets).
    assert peak_flops(jax.devices()) is None

    class Abacus:
        platform, device_kind = "abacus", "Quantum Abacus"

    with caplog.at_level(logging.WARNING, logger="cairn.trainer"):
        assert peak_flops([Abacus()]) is None and peak_flops([Abacus()]) is None
    assert caplog.text.count("no published peak for device kind 'Quantum Abacus'") == 1  # said once

    class V5e:
        platform, device_kind = "tpu", "TPU v5 lite"

    assert peak_flops([V5e(), V5e()]) == 2 * 197e12
    first = cpu_matmul_peak_flops()  # what a caller (a benchmark) measures and passes
    assert 1e8 < first < 1e13
    assert cpu_matmul_peak_flops() is first  # cached: the probe runs once per process


def test_mfu_formula():
    assert mfu(flops_per_token=6e9, tokens_per_second=1e4, peak=1.2e14) == pytest.approx(0.5)
