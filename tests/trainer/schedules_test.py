"""Learning-rate schedules: t5x's factor strings, cosine, linear."""

import math

import numpy as np
import pytest

from cairn.trainer import cosine_schedule, factor_schedule, linear_schedule, linear_warmup


def t5x_reference(step, base=0.5, warmup=1000):
    """t5x's `constant * linear_warmup * rsqrt_decay`, written out."""
    lr = base * min(1.0, step / warmup) / math.sqrt(max(step, warmup))
    return max(lr, 1e-8)


@pytest.mark.parametrize("step", [0, 1, 500, 999, 1000, 1001, 4000, 100000])
def test_t5_default_matches_t5x(step):
    sched = factor_schedule("constant * linear_warmup * rsqrt_decay", base_learning_rate=0.5, warmup_steps=1000)
    assert float(sched(step)) == pytest.approx(t5x_reference(step), rel=1e-6)


def test_rsqrt_decay_alone_is_t5_pretraining_schedule():
    sched = factor_schedule("constant * rsqrt_decay", base_learning_rate=1.0, warmup_steps=10000)
    assert float(sched(0)) == pytest.approx(0.01)
    assert float(sched(40000)) == pytest.approx(0.005)


def test_other_factors():
    sched = factor_schedule("constant * decay_every", base_learning_rate=1.0, decay_factor=0.5, steps_per_decay=10)
    np.testing.assert_allclose([float(sched(s)) for s in (0, 9, 10, 25)], [1, 1, 0.5, 0.25])
    norm = factor_schedule("constant * rsqrt_normalized_decay", base_learning_rate=1.0, warmup_steps=100)
    assert float(norm(400)) == pytest.approx(0.5)


def test_unknown_factor_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown learning-rate factor.*'exp_decay'.*allowed"):
        factor_schedule("constant * exp_decay")


def test_cosine_and_linear():
    cos = cosine_schedule(1.0, total_steps=110, warmup_steps=10, final_learning_rate=0.1)
    assert float(cos(5)) == pytest.approx(0.5)
    assert float(cos(10)) == pytest.approx(1.0)
    assert float(cos(60)) == pytest.approx(0.55)
    assert float(cos(110)) == pytest.approx(0.1)
    assert float(cos(500)) == pytest.approx(0.1)
    lin = linear_schedule(2.0, total_steps=20, warmup_steps=0)
    assert float(lin(10)) == pytest.approx(1.0)
    assert float(lin(20)) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="total_steps"):
        linear_schedule(1.0, total_steps=5, warmup_steps=5)


@pytest.mark.parametrize("warmup", [1, 7, 1000])
def test_one_warmup_shared_by_every_schedule(warmup):
    """`factor_schedule`'s `linear_warmup` factor and the warmup of `cosine_schedule` and
    `linear_schedule` are one function: bitwise equal during warmup (step 0 aside, where the
    factor schedule keeps its `min_learning_rate` floor) and at its end."""
    peak = 0.37
    factor = factor_schedule("constant * linear_warmup", base_learning_rate=peak, warmup_steps=warmup)
    cos = cosine_schedule(peak, total_steps=2 * warmup + 5, warmup_steps=warmup)
    lin = linear_schedule(peak, total_steps=2 * warmup + 5, warmup_steps=warmup)
    steps = sorted({1, warmup // 3, warmup // 2, warmup - 1, warmup} - {0})
    for step in steps:
        expected = np.float32(peak) * np.asarray(linear_warmup(step, warmup))
        for sched in (factor, cos, lin):
            assert np.asarray(sched(step)).tobytes() == expected.tobytes(), (sched, step)
    assert float(linear_warmup(warmup // 2, warmup)) == pytest.approx((warmup // 2) / warmup)
    assert float(cos(0)) == float(lin(0)) == 0.0 and float(factor(0)) == pytest.approx(1e-8)
    assert float(linear_warmup(5, 0)) == float(linear_warmup(10 * warmup, warmup)) == 1.0
