"""`plan_memory`: the train step's peak device memory from XLA's compiled memory analysis, on
abstract shapes; a pinned figure for a small Llama step (so that a step whose memory grows
silently fails here, not on the chip); the one line of a step that does not fit (an injected
device limit), its batch search and the TPU compiler's out-of-memory refusal."""

import jax
import numpy as np
import pytest
from tiny_model import TinyModel, make_batch

from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules
from cairn.trainer import (
    OptimizerConfig,
    StepDoesNotFitError,
    StepMemory,
    Trainer,
    TrainerConfig,
    memory_plan,
    plan_memory,
)


def one_device() -> Partitioner:
    """A 1 x 1 mesh: the figures are one device's whatever the process's device count."""
    return Partitioner(create_mesh({"data": 1, "model": 1}, devices=jax.devices()[:1]), standard_logical_axis_rules())


def abstract(batch):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)


def config(**kw) -> TrainerConfig:
    return TrainerConfig(model_dir="unused", num_train_steps=1, tensorboard=False, **kw)


# -- a pinned figure ------------------------------------------------------------------------------
# llama_1b's training settings (bfloat16 compute and params, "dots" remat, Adafactor) on
# llama_tiny's shape with one layer: 3 rows of 32 tokens on one CPU device (jax 0.10.2's XLA).
# A change that moves these figures by more than TOLERANCE fails here. When the change is meant
# (a new parameter, a cheaper attention or loss), update PINNED to the figures the failure
# prints, and say in the commit why the step's memory moved.
LLAMA = dict(num_layers=1, dtype="bfloat16", param_dtype="bfloat16", remat_policy="dots")
PINNED = {"argument_bytes": 214928, "temp_bytes": 1030800}
TOLERANCE = 0.02


def small_llama_step(partitioner: Partitioner, length: int):
    """The small Llama's trainer and its abstract batch of 3 rows of `length` tokens."""
    import cairn.models as models

    model = models.DecoderOnlyModel(models.get_preset("llama_tiny", **LLAMA))
    trainer = Trainer(model, OptimizerConfig(), 0.01, partitioner, config())
    tokens = jax.ShapeDtypeStruct((3, length), np.int32)
    weights = jax.ShapeDtypeStruct((3, length), np.float32)
    return trainer, {"decoder_input_tokens": tokens, "decoder_target_tokens": tokens, "decoder_loss_weights": weights}


def test_a_small_llama_steps_memory_is_pinned():
    trainer, batch = small_llama_step(one_device(), 32)
    plan = plan_memory(trainer, batch)
    got = {name: getattr(plan.step, name) for name in PINNED}
    for name, want in PINNED.items():
        assert abs(got[name] - want) <= TOLERANCE * want, f"the step's memory moved: {got} (pinned {PINNED})"
    s = plan.step
    assert s.peak_bytes == s.argument_bytes + s.output_bytes + s.temp_bytes - s.alias_bytes + s.generated_code_bytes
    assert plan.batch_size == 3 and plan.limit_bytes is None and plan.fits is None  # CPU: no device limit
    assert "no device limit known" in plan.summary() and plan.error() == ""


# The same step compiled by XLA:TPU for a described TPU v5e chip (libtpu on this CPU host), at 3
# rows of 256 tokens (the splash kernel's lengths): the figures the chip itself would report.
TPU_PINNED = {"argument_bytes": 279040, "temp_bytes": 3663360}


def test_the_small_llama_step_planned_for_a_described_tpu_chip():
    from cairn.partitioning import topology

    devices = topology.topology_devices("v5e:1x1")
    partitioner = Partitioner(create_mesh({"data": 1, "model": 1}, devices=devices), standard_logical_axis_rules())
    trainer, batch = small_llama_step(partitioner, 256)
    plan = plan_memory(trainer, batch)
    assert plan.device == "TPU v5 lite (tpu)" and plan.limit_bytes == int(15.75 * 2**30) and plan.fits is True
    got = {name: getattr(plan.step, name) for name in TPU_PINNED}
    for name, want in TPU_PINNED.items():
        assert abs(got[name] - want) <= TOLERANCE * want, f"the step's TPU memory moved: {got} (pinned {TPU_PINNED})"
    assert "tpu_custom_call" in trainer.lower_step().compile().as_text()  # the splash kernel, by Mosaic
    assert plan_memory(trainer, limit_bytes=2**20, search=False).fits is False  # against 1 MiB: not


# -- a step that does not fit ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    """The tiny model with AdamW at batch 16, set up and planned without a limit (one compile)."""
    trainer = Trainer(TinyModel(), OptimizerConfig(name="adamw"), 0.01, one_device(), config())
    before = sum(x.nbytes for x in jax.live_arrays())
    plan = plan_memory(trainer, abstract(make_batch(0, 0, 16)))
    allocated = sum(x.nbytes for x in jax.live_arrays()) - before
    return trainer, plan, allocated


def test_planning_allocates_nothing_and_sets_the_trainer_up(tiny):
    trainer, plan, allocated = tiny
    assert allocated <= 16, f"planning left {allocated} bytes on the device (only the seed keys may stay)"
    assert trainer.batch_signature is not None  # set up for the planned batch, as `train` would be
    assert plan.peak_bytes > 0 and plan.step.compile_error is None


def test_a_step_that_does_not_fit_names_the_batch_that_does_and_the_knobs(tiny):
    trainer, fitting, _ = tiny
    # One byte short at batch 16; batch 8 (the search's first halving) fits.
    plan = plan_memory(trainer, limit_bytes=fitting.peak_bytes - 1, max_compiles=2)
    assert plan.fits is False and plan.fitting_batch == 8 and [t.batch_size for t in plan.tried] == [8, 16]
    line = plan.error()
    assert "\n" not in line and line in plan.summary()
    assert line.startswith(f"the train step at batch 16 needs {memory_plan._fmt(fitting.peak_bytes)} of ")
    assert "device memory on cpu; batch 8 fits (" in line
    for knob in (
        "num_microbatches=2 (the activations of 8 rows at a time)",
        "param_dtype='bfloat16'",
        "optimizer 'adafactor'",
        "offload_optimizer_state=True (moves ",
    ):
        assert knob in line, knob
    assert str(StepDoesNotFitError(plan)) == line


def test_plan_memory_needs_a_batch_or_a_set_up_trainer():
    trainer = Trainer(TinyModel(), OptimizerConfig(), 0.01, one_device(), config())
    with pytest.raises(ValueError, match="needs a batch"):
        plan_memory(trainer)
    with pytest.raises(ValueError, match="limit_bytes must be > 0, got 0"):
        plan_memory(trainer, limit_bytes=0)


# -- the search and XLA's refusal, without compiling ----------------------------------------------
def affine(calls, fixed=1000, per_row=100, oom_above=None):
    def compile_at(b):
        calls.append(b)
        if oom_above is not None and b > oom_above:
            return StepMemory(b, None, compile_error="Ran out of memory in memory space hbm")
        return StepMemory(b, fixed + per_row * b)

    return compile_at


@pytest.mark.parametrize("unit,limit,want", [(1, 1000 + 100 * 37 + 50, 37), (4, 4700, 36), (8, 1500, 0)])
def test_the_search_pins_the_largest_fitting_batch(unit, limit, want):
    calls = []
    compile_at = affine(calls)
    tried = [compile_at(64)] + memory_plan._search(compile_at, compile_at(64), limit, unit, budget=6)
    fitting = [t.batch_size for t in tried if memory_plan._fits(t, limit)]
    assert max(fitting, default=0) == want
    assert all(b % unit == 0 for b in calls) and len(calls) <= 2 + 4  # the first, then at most 4
    if want:  # pinned down: the next multiple of `unit` was tried and failed
        assert want + unit in calls or want + unit == 64


def test_the_search_bisects_when_xla_gives_no_figures():
    calls = []
    compile_at = affine(calls, oom_above=20)
    first = compile_at(64)
    tried = memory_plan._search(compile_at, first, limit=10**9, unit=2, budget=8)
    assert max(t.batch_size for t in tried if memory_plan._fits(t, 10**9)) == 20
    assert 22 in calls


class _Refused:
    """A lowered step whose compile fails as XLA:TPU's does for a program that does not fit."""

    def __init__(self, message):
        self.message = message

    def compile(self):
        raise RuntimeError(self.message)


class _StubTrainer:
    def __init__(self, message):
        self.message = message

    def lower_step(self, batch):
        return _Refused(self.message)


def test_an_out_of_memory_compile_reads_as_does_not_fit_with_xlas_figure():
    message = (
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
        "Used 20.25G of 15.48G hbm. Exceeded hbm capacity by 4.77G."
    )
    m = memory_plan._step_memory(_StubTrainer(message), {}, 24)
    assert m.batch_size == 24 and m.peak_bytes == int(20.25 * 2**30) and "Ran out of memory" in m.compile_error
    plan = memory_plan.MemoryPlan(m, 15 * 2**30, "TPU v5 lite (tpu)", 1)
    assert plan.fits is False and plan.error().startswith("the train step at batch 24 needs 20.25 GiB of 15.00 GiB")
    with pytest.raises(RuntimeError, match="something else"):
        memory_plan._step_memory(_StubTrainer("something else broke"), {}, 24)


def test_compiler_options_reach_the_steps_compile():
    """`TrainerConfig.compiler_options` are the step's XLA flags: a flag XLA does not know fails its compile."""
    cfg = config(compiler_options={"xla_no_such_flag_here": 1})
    trainer = Trainer(TinyModel(), OptimizerConfig(), 0.01, one_device(), cfg)
    trainer.setup(abstract(make_batch(0, 0, 4)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="No such compile option: 'xla_no_such_flag_here'"):
        trainer.lower_step().compile()


class _Device:
    """A device as `plan_memory` reads one: its platform, kind and memory statistics."""

    def __init__(self, platform, kind, stats):
        self.platform, self.device_kind, self._stats = platform, kind, stats

    def memory_stats(self):
        return self._stats


def test_a_gpu_is_planned_against_its_memory_stats_like_any_accelerator():
    """Nothing in the plan is TPU- or CPU-only: a GPU's limit is its `memory_stats()["bytes_limit"]`
    (what XLA_PYTHON_CLIENT_MEM_FRACTION leaves), its peak the compiled memory analysis."""
    gpu = _Device("gpu", "NVIDIA H100 80GB HBM3", {"bytes_limit": 60 * 2**30, "bytes_in_use": 0})
    assert memory_plan.device_memory_limit(gpu) == 60 * 2**30
    assert memory_plan._device_name(gpu) == "NVIDIA H100 80GB HBM3 (gpu)"
    assert memory_plan.device_memory_limit(_Device("cpu", "cpu", None)) is None
    step = StepMemory(8, 61 * 2**30)
    plan = memory_plan.MemoryPlan(step, memory_plan.device_memory_limit(gpu), memory_plan._device_name(gpu), 8)
    assert plan.fits is False and "on NVIDIA H100 80GB HBM3 (gpu)" in plan.error()
