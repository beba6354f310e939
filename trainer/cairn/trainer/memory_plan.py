"""Memory you can plan: the train step's peak device memory from XLA's compiled memory analysis,
before anything is allocated or run, against the device's memory; when it does not fit, the
batch that would, and the knobs that would help.

    plan = plan_memory(trainer, first_batch)  # compiles the step on abstract shapes
    print(plan.summary())
    if plan.fits is False:
        raise SystemExit(plan.error())  # one line: the batch that fits, the knobs

The peak is XLA's own figure for the compiled step, per device: arguments + outputs + temporaries
- aliased (donated) bytes + generated code. On TPU the compile itself fails when the step does
not fit; that failure is read as "does not fit" (with XLA's figure where its message has one).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from cairn.partitioning import topology
from cairn.trainer.model_protocol import leaf_dtype

if TYPE_CHECKING:  # the trainer module imports this one's users, not this one
    from cairn.trainer.trainer import Trainer

# What XLA:TPU says when a program does not fit, e.g. "Ran out of memory in memory space hbm.
# Used 20.25G of 15.48G hbm. Exceeded hbm capacity by 4.77G."
_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Ran out of memory", "out of memory")
_USED = re.compile(r"Used ([\d.]+)([KMGT]?)i?B? of ([\d.]+)([KMGT]?)i?B? hbm")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """One compile of the step: XLA's per-device sizes in bytes (`None` when the compile ran out
    of memory: then `peak_bytes` is XLA's own figure from its message, if it gave one)."""

    batch_size: int  # global rows
    peak_bytes: int | None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None
    alias_bytes: int | None = None
    generated_code_bytes: int | None = None
    host_bytes: int | None = None  # arguments + outputs + temporaries in host memory (offloaded)
    compile_error: str | None = None  # the out-of-memory compile error, first line


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """The step's memory at the run's batch, and (when it does not fit) the search's result.

    `fits` is None without a device limit (CPU), else whether `step.peak_bytes <= limit_bytes`.
    `fitting_batch`: the largest global batch found to fit (compiled and checked), None when
    it fits already, no search ran, or no batch fits. `knobs`: settings that would lower the
    peak, each with what it saves where the trainer can tell. `tried`: every compile of the
    search (the run's batch among them), by batch; empty when no search ran.
    """

    step: StepMemory
    limit_bytes: int | None
    device: str
    batch_unit: int  # the batch moves in steps of this many rows (data shards x microbatches)
    fitting_batch: int | None = None
    knobs: tuple[str, ...] = ()
    tried: tuple[StepMemory, ...] = ()

    @property
    def batch_size(self) -> int:
        return self.step.batch_size

    @property
    def peak_bytes(self) -> int | None:
        return self.step.peak_bytes

    @property
    def fits(self) -> bool | None:
        if self.step.compile_error is not None:
            return False
        if self.limit_bytes is None or self.step.peak_bytes is None:
            return None
        return self.step.peak_bytes <= self.limit_bytes

    def summary(self, error: bool = True) -> str:
        """A few lines: the peak and its parts against the device's memory; the error line when
        it does not fit (unless `error` is False)."""
        s = self.step
        of = f" of {_fmt(self.limit_bytes)}" if self.limit_bytes is not None else " (no device limit known)"
        head = f"memory plan: train step at batch {s.batch_size} on {self.device}: peak {_fmt(s.peak_bytes)}{of}"
        if self.limit_bytes and s.peak_bytes is not None:
            head += f" ({100 * s.peak_bytes / self.limit_bytes:.0f}%)"
        lines = [head]
        if s.compile_error is None:
            parts = (
                f"  arguments {_fmt(s.argument_bytes)} + outputs {_fmt(s.output_bytes)} + temporaries "
                f"{_fmt(s.temp_bytes)} - aliased {_fmt(s.alias_bytes)} + code {_fmt(s.generated_code_bytes)}"
            )
            if s.host_bytes:
                parts += f"; host memory {_fmt(s.host_bytes)}"
            lines.append(parts)
        else:
            lines.append(f"  XLA: {s.compile_error}")
        if error and self.fits is False:
            lines.append(self.error())
        return "\n".join(lines)

    def error(self) -> str:
        """One line when the step does not fit ('' otherwise): the peak against the limit, the
        batch that would fit, the knobs that would help."""
        if self.fits is not False:
            return ""
        s = self.step
        need = f"needs {_fmt(s.peak_bytes)}" if s.peak_bytes is not None else "does not fit"
        limit = f" of {_fmt(self.limit_bytes)}" if self.limit_bytes is not None else ""
        line = f"the train step at batch {s.batch_size} {need}{limit} device memory on {self.device}"
        if self.fitting_batch is not None:
            line += f"; batch {self.fitting_batch} fits ({_fmt(self._peak_at(self.fitting_batch))})"
        elif self.tried:
            smallest = min(t.batch_size for t in self.tried)
            line += f"; no batch down to {smallest} fits"
            if smallest <= self.batch_unit:
                line += f" (the batch moves in steps of {self.batch_unit} here)"
        if self.knobs:
            line += "; or try: " + ", ".join(self.knobs)
        return line

    def _peak_at(self, batch: int) -> int | None:
        return next((t.peak_bytes for t in self.tried if t.batch_size == batch), None)


class StepDoesNotFitError(ValueError):
    """The train step does not fit in device memory; the message is `MemoryPlan.error()`."""

    def __init__(self, plan: MemoryPlan):
        super().__init__(plan.error())
        self.plan = plan


def plan_memory(
    trainer: Trainer,
    batch: Mapping[str, Any] | None = None,
    *,
    limit_bytes: int | None = None,
    search: bool = True,
    max_compiles: int = 6,
) -> MemoryPlan:
    """Compiles `trainer`'s step for `batch` on abstract state and reports its peak device memory.

    Args:
      trainer: a `Trainer`; set up for `batch` here when it is not set up yet (as `train` would
        from its first batch, whose compile the first step then reuses).
      batch: a host-local batch (arrays or `jax.ShapeDtypeStruct`s); default: the set-up one.
      limit_bytes: the device memory to plan against; default the first local device's
        `memory_stats()["bytes_limit"]` (none on CPU: the plan only reports).
      search: when the step does not fit, compile smaller batches (an affine fit of memory
        against batch, each prediction checked by a compile) for the largest that fits.
      max_compiles: at most this many compiles in all.

    Nothing is allocated on the device and nothing runs.
    """
    if max_compiles < 1:
        raise ValueError(f"plan_memory max_compiles must be >= 1, got {max_compiles}")
    if limit_bytes is not None and limit_bytes <= 0:
        raise ValueError(f"plan_memory limit_bytes must be > 0, got {limit_bytes}")
    if batch is None and trainer.batch_signature is None:
        raise ValueError("plan_memory needs a batch before the trainer is set up (Trainer.setup)")
    if batch is not None and trainer.batch_signature is None:
        trainer.setup(batch)
    if batch is None:
        batch = trainer.abstract_batch  # global shapes: turned back into host rows below
        shards = trainer.partitioner.data_layout().num_shards
        batch = jax.tree.map(lambda x: _rows(x, x.shape[0] // shards), batch)
    device = trainer.partitioner.mesh.local_devices[0]  # this process's: its memory_stats answer
    limit = device_memory_limit(device) if limit_bytes is None else int(limit_bytes)
    shards = trainer.partitioner.data_layout().num_shards
    unit = math.lcm(shards, trainer.partitioner.batch_parts()) * trainer.config.num_microbatches
    host_rows = int(np.shape(jax.tree.leaves(batch)[0])[0])

    def compile_at(global_rows: int) -> StepMemory:
        rows = global_rows // shards
        shaped = batch if rows == host_rows else jax.tree.map(lambda x: _rows(x, rows), batch)
        return _step_memory(trainer, shaped, global_rows)

    first = compile_at(host_rows * shards)
    plan = MemoryPlan(first, limit, _device_name(device), unit)
    if plan.fits is not False:
        return plan
    knobs = suggest_knobs(trainer, first.batch_size)
    if not search or limit is None:
        return dataclasses.replace(plan, knobs=knobs)
    tried = [first, *_search(compile_at, first, limit, unit, max_compiles - 1)]
    fitting = [t.batch_size for t in tried if _fits(t, limit)]
    return dataclasses.replace(
        plan,
        fitting_batch=max(fitting) if fitting else None,
        knobs=knobs,
        tried=tuple(sorted(tried, key=lambda t: t.batch_size)),
    )


def device_memory_limit(device: Any) -> int | None:
    """The device's memory in bytes (`memory_stats()["bytes_limit"]`); for a device described
    for an ahead-of-time compile (`cairn.partitioning.topology`), its kind's; None where there is
    none (CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # a backend without memory statistics, or a described device
        stats = None
    if not stats or "bytes_limit" not in stats:
        return topology.hbm_bytes(device)  # None for a kind it does not know (CPU)
    return int(stats["bytes_limit"])


def suggest_knobs(trainer: Trainer, batch_size: int) -> tuple[str, ...]:
    """Settings that would lower the step's peak at global batch `batch_size`, from the
    trainer's config, the model's config (read by name: `remat_policy`, `loss_chunk_size`) and
    the set-up state's per-device sizes."""
    knobs = []
    state = trainer.abstract_state
    params, opt = _device_bytes(state.params), _device_bytes(state.opt_state)
    n = trainer.config.num_microbatches
    if batch_size % (2 * n * trainer.partitioner.batch_parts()) == 0:
        knobs.append(f"num_microbatches={2 * n} (the activations of {batch_size // (2 * n)} rows at a time)")
    model_config = getattr(trainer.model, "config", None)
    remat = getattr(model_config, "remat_policy", None)
    if remat is not None and remat != "full":
        knobs.append(f"remat_policy='full' (now {remat!r})")
    chunk = getattr(model_config, "loss_chunk_size", None)
    if chunk == 0:
        knobs.append("loss_chunk_size (the loss's logits a chunk at a time)")
    f32 = sum(_leaf_device_bytes(x) for x in jax.tree.leaves(state.params) if leaf_dtype(x) == np.float32)
    if f32:
        knobs.append(f"param_dtype='bfloat16' (float32 params: {_fmt(f32)} and as much again in gradients)")
    optimizer = getattr(trainer.optimizer_config, "name", None)
    if opt > params and optimizer != "adafactor":
        knobs.append(f"optimizer 'adafactor' (the optimizer state: {_fmt(opt)})")
    if opt and not trainer.config.offload_optimizer_state:
        knobs.append(f"offload_optimizer_state=True (moves {_fmt(opt)} to host memory)")
    return tuple(knobs)


# -- the search ---------------------------------------------------------------------------------
def _fits(m: StepMemory, limit: int) -> bool:
    return m.compile_error is None and m.peak_bytes is not None and m.peak_bytes <= limit


def _search(compile_at: Any, first: StepMemory, limit: int, unit: int, budget: int) -> list[StepMemory]:
    """Smaller batches (multiples of `unit`) until the largest that fits is pinned down (no
    multiple of `unit` left between the largest fitting and the smallest failing batch) or the
    compiles run out. Each next batch is the affine fit's prediction (memory against batch,
    through the two measured batches nearest the limit), kept strictly between the two; the
    midpoint where there is no fit."""
    tried = [first]
    for _ in range(budget):
        ok = max((t.batch_size for t in tried if _fits(t, limit)), default=0)
        bad = min(t.batch_size for t in tried if not _fits(t, limit))
        low, high = ok + unit, (bad - 1) // unit * unit  # the batches still open
        if high < low:
            break
        tried.append(compile_at(_predict(tried, limit, unit, ok, bad, low, high)))
    return tried[1:]


def _predict(tried: list[StepMemory], limit: int, unit: int, ok: int, bad: int, low: int, high: int) -> int:
    points = [(t.batch_size, t.peak_bytes) for t in tried if t.peak_bytes is not None]
    measured = sorted(points, key=lambda p: abs(p[1] - limit))
    guess = (ok + bad) // 2  # without a fit: the midpoint
    if len(measured) >= 2:
        (a, peak_a), (b, peak_b) = measured[0], measured[1]
        if a != b and peak_a != peak_b:
            slope = (peak_a - peak_b) / (a - b)
            if slope > 0:
                guess = int(a + (limit - peak_a) / slope)
    return min(max(guess // unit * unit, low), high)


# -- one compile ----------------------------------------------------------------------------------
def _step_memory(trainer: Trainer, batch: Mapping[str, Any], global_rows: int) -> StepMemory:
    lowered = trainer.lower_step(batch)
    try:
        compiled = lowered.compile()
    except Exception as e:  # XLA:TPU refuses a program that does not fit, at compile time
        message = str(e)
        if not any(m in message for m in _OOM_MARKERS):
            raise
        used = _USED.search(message)
        peak = int(float(used.group(1)) * _UNITS[used.group(2)]) if used else None
        line = next((x.strip() for x in message.splitlines() if "memory" in x.lower()), message.splitlines()[0])
        return StepMemory(global_rows, peak, compile_error=line[:300])
    m = compiled.memory_analysis()
    if m is None:  # a backend without the analysis
        return StepMemory(global_rows, None)
    peak = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
        + m.generated_code_size_in_bytes
    )
    host = (
        getattr(m, "host_argument_size_in_bytes", 0)
        + getattr(m, "host_output_size_in_bytes", 0)
        + getattr(m, "host_temp_size_in_bytes", 0)
        - getattr(m, "host_alias_size_in_bytes", 0)
    )
    return StepMemory(
        global_rows,
        int(peak),
        argument_bytes=int(m.argument_size_in_bytes),
        output_bytes=int(m.output_size_in_bytes),
        temp_bytes=int(m.temp_size_in_bytes),
        alias_bytes=int(m.alias_size_in_bytes),
        generated_code_bytes=int(m.generated_code_size_in_bytes),
        host_bytes=int(host),
    )


# -- helpers --------------------------------------------------------------------------------------
def _rows(x: Any, rows: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((rows,) + tuple(np.shape(x))[1:], leaf_dtype(x))


def _leaf_device_bytes(x: Any) -> int:
    """Bytes of one device's shard of an abstract leaf; 0 for one in host memory."""
    sharding = getattr(x, "sharding", None)
    if sharding is not None and getattr(sharding, "memory_kind", None) in ("pinned_host", "unpinned_host"):
        return 0
    shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize


def _device_bytes(tree: Any) -> int:
    return sum(_leaf_device_bytes(x) for x in jax.tree.leaves(tree))


def _device_name(device: Any) -> str:
    return f"{device.device_kind} ({device.platform})" if device.platform != "cpu" else "cpu"


def _fmt(n: int | None) -> str:
    """Bytes for people: 1.25 GiB, 3.4 MiB, 512 B."""
    if n is None:
        return "?"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
